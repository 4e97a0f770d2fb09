"""What the predictive, the metrics and the experiments need of a trainer, as a typing Protocol, and the
helper that finds an ngvi optimizer inside a framework's wrapper.

Both are also ``ngvi.PosteriorOptimizer`` and ``ngvi.unwrap``. (Until 0.1.0 they lived in ``ngvi.optim``;
the old paths ``ngvi.optim.PosteriorOptimizer``, ``ngvi.optim.unwrap`` and ``ngvi.optim.protocol`` still
work in 0.2.0, with a ``DeprecationWarning``.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

__all__ = ["PosteriorOptimizer", "unwrap"]


@runtime_checkable
class PosteriorOptimizer(Protocol):
    """A trainer with a posterior to sample: every ngvi optimizer and baseline (BBVI, MC dropout, MAP).

    ``sampled_params(train=False)`` holds one posterior sample in the model's weights for a block
    (``begin_sample``/``end_sample``: the same for callback-driven frameworks);
    ``posterior()`` is a snapshot of q (point estimates and MC dropout raise ``NotImplementedError``);
    ``backward(loss, output)`` is the backward pass of one sample, as the trainer needs it."""

    def sampled_params(self, train: bool = False) -> contextlib.AbstractContextManager[None]: ...

    def begin_sample(self, train: bool = False) -> None: ...

    def end_sample(self, discard: bool = False) -> None: ...

    @property
    def in_sample(self) -> bool: ...

    def posterior(self) -> Any: ...

    def backward(self, loss: Tensor, output: Tensor | None = None) -> None: ...

    def step(self, closure: Callable[[], Any] | None = None) -> Any: ...

    def zero_grad(self, set_to_none: bool = True) -> None: ...


def unwrap(opt: Any) -> Any:
    """The ngvi optimizer (or baseline) inside framework wrappers.

    Follows ``.optimizer`` (accelerate's ``AcceleratedOptimizer``, which the Hugging Face Trainer puts in
    ``trainer.optimizer`` and which hides ``sampled_params`` and ``posterior``) until an object with
    ``sampled_params`` is found.

    Args:
        opt: an ngvi optimizer or baseline, or a wrapper of one (any depth).

    Returns:
        The innermost object with ``sampled_params``; an ngvi optimizer is returned as it is.

    Raises:
        TypeError: ``opt`` is not an ngvi optimizer and wraps none (or its ``.optimizer`` chain loops).
    """
    seen, inner = set(), opt
    while not hasattr(inner, "sampled_params"):
        if id(inner) in seen or not hasattr(inner, "optimizer"):
            raise TypeError(
                f"{type(opt).__name__} is not an ngvi optimizer and wraps none (no sampled_params() found "
                "through .optimizer); pass an ngvi optimizer or baseline"
            )
        seen.add(id(inner))
        inner = inner.optimizer
    return inner
