"""The constants of the posterior file format and the lazy safetensors import (shared by
:meth:`GaussianPosterior.save` and :mod:`ngvi.posterior.io`; imports nothing of ngvi's posteriors)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

FORMAT = "ngvi.posterior"
FORMAT_VERSION = 1


def safetensors() -> Any:
    """The safetensors package, imported only when a posterior is saved or loaded."""
    try:
        import safetensors.torch
    except ImportError:
        raise ImportError(
            "saving and loading posteriors needs safetensors: pip install safetensors "
            '(or pip install "ngvi[artefacts]")'
        ) from None
    return safetensors


def cpu_copy(t: Tensor) -> Tensor:
    """Own, contiguous CPU storage: safetensors refuses tensors that share memory or are strided."""
    return t.detach().to("cpu").contiguous().clone()
