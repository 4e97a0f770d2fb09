r"""MAP: Adam on the maximum-a-posteriori objective, with the prior as (coupled) weight decay.

.. math::
    \min_\theta\ f(\theta) + \frac{\lambda}{2N}\lVert\theta\rVert^2,\qquad
    \nabla = \hat g + \tilde\lambda\theta,\quad \tilde\lambda = \lambda/N,

which is exactly ``torch.optim.Adam(..., weight_decay=prior_prec / data_size)`` (Adam's weight decay is added
to the gradient, not decoupled as in AdamW). :class:`MAP` *is* that Adam, with the ngvi interface on top:

* ``sampled_params()`` yields the point estimate itself, so :func:`ngvi.predict` returns ``samples``
  identical outputs (a deterministic network, for the comparison tables);
* ``posterior()`` raises ``NotImplementedError``: a point estimate has no Gaussian posterior, and the
  :class:`~ngvi.DiagonalGaussian` of a point mass (zero variance) is not a distribution it can hold. For a
  Laplace posterior around the same optimum use :class:`ngvi.BAdam`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .. import _validation as check
from .._tensorlist import TensorList
from ..optim.diagnostics import Diagnostics
from ..optim.engine.optimizer import NonFiniteGradientError

__all__ = ["MAP"]


class MAP(torch.optim.Adam):
    """Adam with weight decay λ/N: the MAP estimate under the prior N(0, I/λ).

    Args:
        params: a model, its parameters, or parameter groups (a group may set its own ``prior_prec``
            and ``data_size``).
        data_size: N, the number of training examples (the closure returns a mean over a minibatch).
        lr, betas, eps: Adam's.
        prior_prec: λ of the prior N(0, I/λ); 0 gives plain Adam.
        mc_samples: must be 1 (a point estimate: every sample is the same); accepted for the shared
            vocabulary.

    Each group's ``weight_decay`` is derived from its ``prior_prec`` and ``data_size`` when the group is
    added and again at every step, so either may change mid-run (a data set that grows, as in a bandit);
    ``step(closure)`` is Adam's (the closure zeroes the gradients, returns the mean NLL and calls
    ``backward()``).
    """

    #: every posterior sample is the same network (ngvi.evaluate_classifier then makes one pass)
    deterministic = True

    @classmethod
    def builds_from_model(cls, **options: Any) -> bool:
        """Whether ``cls(..., **options)`` takes the model rather than its parameters (as
        :meth:`ngvi.VariationalOptimizer.builds_from_model`): False, MAP takes either."""
        return False

    def __init__(
        self,
        params: nn.Module | Any,
        data_size: int,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        prior_prec: float = 1.0,
        eps: float = 1e-8,
        mc_samples: int = 1,
    ):
        if check.positive_int("mc_samples", mc_samples) != 1:
            raise ValueError(
                f"MAP is a point estimate: every sample is the same, so mc_samples must be 1, got "
                f"{mc_samples!r}"
            )
        self.mc_samples = 1
        check.nonnegative("lr", lr)
        check.betas("betas", betas)
        check.positive("eps", eps)
        self._prior_defaults = dict(data_size=data_size, prior_prec=prior_prec)
        if isinstance(params, nn.Module):
            params = params.parameters()
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=0.0)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        for key, value in self._prior_defaults.items():
            param_group.setdefault(key, value)
        check.data_size(param_group["data_size"])
        check.nonnegative("prior_prec", param_group["prior_prec"])
        param_group["weight_decay"] = self._weight_decay(param_group)
        super().add_param_group(param_group)

    def __getstate__(self) -> dict[str, Any]:
        return {
            **super().__getstate__(),
            "_prior_defaults": self._prior_defaults,
            "mc_samples": self.mc_samples,
        }

    def step(self, closure: Any = None) -> Any:
        """Adam's step, with each group's weight decay λ/N read from its current ``prior_prec`` and
        ``data_size``. Like every ngvi trainer it refuses a step without any gradient (RuntimeError) and a
        NaN or Inf gradient or loss (:class:`~ngvi.NonFiniteGradientError`), changing nothing."""
        for group in self.param_groups:
            check.data_size(group["data_size"])
            check.nonnegative("prior_prec", group["prior_prec"])
            group["weight_decay"] = self._weight_decay(group)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_gradients(loss[0] if isinstance(loss, tuple | list) else loss)
        super().step()
        return loss

    def _check_gradients(self, loss: Any) -> None:
        """Torch's Adam would apply a NaN and step silently without gradients; refuse both before it runs."""
        name = type(self).__name__
        places = [
            (f"param_groups[{gi}]['params'][{j}] (shape {tuple(p.shape)})", p.grad)
            for gi, group in enumerate(self.param_groups)
            for j, p in enumerate(group["params"])
            if p.grad is not None
        ]
        if not places and any(p.requires_grad for g in self.param_groups for p in g["params"]):
            raise RuntimeError(
                f"{name}.step(): no parameter has a gradient, so there is nothing to update (the parameters "
                "and Adam's state are left as they were). Does the closure call loss.backward() or "
                "opt.backward(loss, output)?"
            )
        loss_finite = not isinstance(loss, torch.Tensor) or bool(torch.isfinite(loss).all())
        if loss_finite and TensorList([g for _, g in places]).all_finite():
            return
        bad = [where for where, g in places if not bool(torch.isfinite(g).all())]
        what = ", ".join(bad) or f"the loss ({loss.item() if loss.numel() == 1 else 'non-finite'})"
        raise NonFiniteGradientError(
            f"{name}: non-finite gradient in {what}. The parameters and optimizer state are unchanged. "
            "Check the loss for NaN/Inf or lower the learning rate."
        )

    def _weight_decay(self, group: dict[str, Any]) -> float:
        """λ/N: Adam adds weight_decay·θ to the gradient of the mean loss, i.e. the prior's (λ/N)θ."""
        return group["prior_prec"] / group["data_size"]

    def backward(self, loss: torch.Tensor, output: torch.Tensor | None = None) -> None:
        """``loss.backward()``: the uniform backward of every ngvi trainer (see ``PosteriorOptimizer``)."""
        loss.backward()

    @contextlib.contextmanager
    def sampled_params(self, train: bool = False) -> Iterator[None]:
        """The point estimate: the weights are left as they are (``train`` is accepted for the ngvi API)."""
        yield

    def begin_sample(self, train: bool = False) -> None:
        """The callback form of :meth:`sampled_params` (as :meth:`ngvi.VariationalOptimizer.begin_sample`)."""
        if self.in_sample:
            raise RuntimeError("a sample is already open: call end_sample() first")
        scope = self.sampled_params(train=train)
        scope.__enter__()
        self._open_sample: contextlib.AbstractContextManager[None] | None = scope

    def end_sample(self, discard: bool = False) -> None:
        """Close the sample; ``discard`` drops its gradients (``zero_grad()``): no step from a failed pass."""
        if not self.in_sample:
            name = type(self).__name__
            raise RuntimeError(f"{name}.end_sample(): no sample is open (begin_sample() first)")
        scope, self._open_sample = self._open_sample, None
        assert scope is not None  # in_sample
        scope.__exit__(None, None, None)
        if discard:
            self.zero_grad()

    @property
    def in_sample(self) -> bool:
        return getattr(self, "_open_sample", None) is not None

    def diagnostics(self) -> Diagnostics:
        """Steps and data size; a point estimate has no variance to report (those fields are None)."""
        steps = [int(st["step"]) for st in self.state.values() if "step" in st]
        return Diagnostics(
            optimizer=type(self).__name__,
            steps=max(steps, default=0),
            skipped_steps=0,
            data_size=[int(g["data_size"]) for g in self.param_groups],
        )

    def posterior(self):
        raise NotImplementedError(
            f"{type(self).__name__} is a point estimate and has no posterior distribution; its weights are "
            "the model's parameters. Use ngvi.BAdam for a Laplace posterior around the same optimum."
        )
