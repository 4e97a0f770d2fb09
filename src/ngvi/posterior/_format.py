"""The constants of the posterior file format and the lazy safetensors import (shared by
:meth:`GaussianPosterior.save` and :mod:`ngvi.posterior.io`; imports nothing of ngvi's posteriors)."""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

FORMAT = "ngvi.posterior"
#: 2: the model's persistent buffers are carried (version 1 files, without them, are still read)
FORMAT_VERSION = 2

#: what a rule name may be: a Python class name (what :func:`ngvi.posterior_of` records), so that no markup,
#: link or line break from a file reaches a model card, a repr or a log
_RULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


def is_rule_name(text: Any) -> bool:
    """Whether ``text`` may name a posterior's rule: a class name, ASCII, at most 100 characters."""
    return isinstance(text, str) and _RULE_NAME.fullmatch(text) is not None


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
