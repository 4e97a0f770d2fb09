"""What the predictive, the metrics and the experiments need of a trainer, as a typing Protocol."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from torch import Tensor


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
