"""The closure contract: what a closure may return, and who runs the backward pass.

A closure zeroes the gradients, computes the mean NLL and returns it, after ``loss.backward()`` or
``opt.backward(loss, output)``. It may return ``(loss, output)`` instead of the loss. An estimator that runs
the backward pass itself (``backward_in_step``: the true Fisher samples targets first) takes a closure that
returns ``(loss, output)`` without calling backward, and the engine calls ``opt.backward`` for it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def run_backward(opt: Any, loss: Tensor, output: Tensor | None) -> None:
    """``opt.backward``: the curvature estimator's backward pass (plain ``loss.backward()`` without one)."""
    est = opt.curvature_estimator
    if est is None:
        loss.backward()
    else:
        est.backward(loss, output, opt.noise_source.generator)
    opt._backward_done = True


def closure_loss(opt: Any, result: Any) -> Tensor:
    """The detached loss from what the closure returned, running the optimizer's backward if it is owed."""
    owed = getattr(opt.curvature_estimator, "backward_in_step", False) and not opt._backward_done
    if isinstance(result, tuple | list) and len(result) == 2:
        if owed:
            if not isinstance(result[0], Tensor):
                raise TypeError(
                    f"the closure returned a {type(result[0]).__name__} as the loss, not a tensor"
                )
            opt.backward(*result)
        result = result[0]
    elif owed:
        raise TypeError(
            "with curvature='fisher' the closure must return (loss, output) without calling backward(): "
            "`def closure(): opt.zero_grad(); out = model(x); return loss_fn(out, y), out` (or call "
            "opt.backward(loss, out) in the closure)"
        )
    if isinstance(result, Tensor):
        return result.detach()
    if isinstance(result, int | float):
        return torch.tensor(float(result))
    raise TypeError(
        f"the closure must return the loss (a tensor), got {type(result).__name__}; write it as "
        "`def closure(): opt.zero_grad(); loss = loss_fn(model(x), y); loss.backward(); return loss`"
    )
