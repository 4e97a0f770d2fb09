r"""The optimizer side of the hooks, shared by VOGN and NoisyKFAC.

These optimizers take the **model** (not its parameters), so that they can hook its layers. Hooks live
only inside a training sample (``step(closure)`` or ``sampled_params(train=True)``), which is why the
model stays free of hooks, picklable and deep-copyable between steps.

**Closure contract.**

* ``curvature="ef"`` (empirical Fisher): the usual closure. It zeroes the gradients, computes the mean NLL,
  calls ``loss.backward()`` and returns the loss (or ``(loss, output)``). The per-example gradients of that
  loss give the curvature.
* ``curvature="fisher"`` (true Fisher, NNG §3): the closure zeroes the gradients, computes the output and the
  mean NLL, and returns ``(loss, output)`` **without** calling backward. The optimizer then draws targets
  ỹ ~ p(y | output) from its own seeded generator, backpropagates Σᵢ −log p(ỹᵢ | outputᵢ) to the layer
  outputs (the curvature), and finally calls ``loss.backward()`` (the gradient ĝ, from the real targets).
  A closure that calls backward itself gets a RuntimeError that says so.

In the manual form the same two passes are run by :meth:`LayerCurvatureMixin.backward`::

    with opt.sampled_params(train=True):
        opt.zero_grad()
        out = model(x)
        opt.backward(loss_fn(out, y), out)    # "ef": just loss.backward()
    opt.step()

**Sums.** With ``loss_reduction="sum"`` the closure returns Σᵢ fᵢ; the per-example gradients are read
unscaled and ĝ is divided by M, so the update still sees the mean gradient of the DESIGN convention.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from .._tensorlist import TensorList
from ..optim import _validation as check
from .hooks import CurvatureHooks
from .likelihoods import Likelihood, make_likelihood

CURVATURES = ("ef", "fisher")


class LayerCurvatureMixin:
    """Mixin for a :class:`~ngvi.optim.base.VariationalOptimizer` whose curvature comes from layer hooks."""

    # per-example sums and Kronecker factors come from this rank's minibatch: averaged over ranks (DDP)
    local_statistics = ("curv",)

    model: nn.Module
    curvature: str
    likelihood: Likelihood | None
    _hooks: CurvatureHooks

    def _attach_model(
        self,
        model: nn.Module,
        *,
        curvature: str,
        likelihood: str | Likelihood | None,
        noise_prec: float,
        loss_reduction: str,
        chunk_bytes: int,
    ) -> list[Tensor]:
        """Validate the curvature options, find the model's layers; returns the parameters to optimise."""
        name = type(self).__name__
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"{name} takes the model (an nn.Module) so that it can hook its layers, got "
                f"{type(model).__name__}; write {name}(model, data_size, ...)"
            )
        self.curvature = check.choice("curvature", curvature, CURVATURES)
        if curvature == "fisher":
            if likelihood is None:
                raise ValueError(
                    "curvature='fisher' samples targets from the model's predictive and needs likelihood= "
                    "'gaussian' (with noise_prec), 'bernoulli' or 'categorical'"
                )
            self.likelihood = make_likelihood(likelihood, noise_prec)
        elif likelihood is not None:
            raise ValueError(
                f"likelihood={likelihood!r} is only used with curvature='fisher'; pass curvature='fisher' to "
                "sample targets from the model, or drop likelihood= for the empirical curvature"
            )
        else:
            self.likelihood = None
        self.model = model
        self._hooks = CurvatureHooks(model, loss_reduction=loss_reduction, chunk_bytes=chunk_bytes)
        self._groups_frozen = False
        return [p for p in model.parameters() if p.requires_grad]

    def _init_transient(self) -> None:
        super()._init_transient()
        self._backward_done = False  # opt.backward() ran in this sample

    @property
    def loss_reduction(self) -> str:
        return self._hooks.loss_reduction

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "_groups_frozen", False):
            raise ValueError(
                f"{type(self).__name__} takes its parameters from the model it hooks; add_param_group() "
                "is not supported (change hyperparameters through param_groups[0] instead)"
            )
        super().add_param_group(param_group)

    def _extra_getstate(self) -> dict[str, Any]:
        return {
            **super()._extra_getstate(),
            "model": self.model,
            "curvature": self.curvature,
            "likelihood": self.likelihood,
            "_hooks": self._hooks,
            "_groups_frozen": self._groups_frozen,
        }

    # ----------------------------------------------------------------------------------------------------
    # One training sample: hooks on, the closure's backward pass(es), hooks off
    # ----------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _sample_scope(self, *, perturb: bool, train: bool, keep_grad_refs: bool = False) -> Iterator[None]:
        if not train:
            with super()._sample_scope(perturb=perturb, train=train, keep_grad_refs=keep_grad_refs):
                yield
            return
        if self._in_sample:
            raise RuntimeError("sampled_params() blocks cannot be nested")
        self._backward_done = False
        capture = "sampled" if self.curvature == "fisher" else "grads"
        with (
            self._hooks.recording(capture),
            super()._sample_scope(perturb=perturb, train=train, keep_grad_refs=keep_grad_refs),
        ):
            yield

    def backward(self, loss: Tensor, output: Tensor | None = None) -> None:
        """The backward pass(es) of one posterior sample (the closure form calls this for you).

        "fisher": sample targets from ``likelihood`` at ``output``, backpropagate their NLL to the layer
        outputs for the curvature, then ``loss.backward()`` for the gradient. "ef": ``loss.backward()``.
        """
        if not (self._in_sample and self._hooks.capture is not None):
            raise RuntimeError(
                f"{type(self).__name__}.backward() belongs inside `with opt.sampled_params(train=True):`"
            )
        with torch.enable_grad():
            if self.curvature == "fisher":
                if not isinstance(output, Tensor):
                    raise TypeError(
                        "curvature='fisher' needs the network output: call opt.backward(loss, output)"
                    )
                target = self.likelihood.sample(output, self._generator(output.device))
                self._hooks.backward_sampled(output, self.likelihood.nll_grad(output, target))
            loss.backward()
        self._backward_done = True

    def _closure_loss(self, result: Any) -> Tensor:
        if self._backward_done:  # the closure called opt.backward(loss, output) itself
            self._backward_done = False
            return super()._closure_loss(result)
        if isinstance(result, tuple | list) and len(result) == 2:
            loss, output = result
            if self.curvature == "fisher":
                if not isinstance(loss, Tensor):
                    raise TypeError(f"the closure returned a {type(loss).__name__} as the loss, not a tensor")
                self.backward(loss, output)
            return super()._closure_loss(loss)
        if self.curvature == "fisher":
            raise TypeError(
                "with curvature='fisher' the closure must return (loss, output) without calling backward(): "
                "`def closure(): opt.zero_grad(); out = model(x); return loss_fn(out, y), out` (or call "
                "opt.backward(loss, out) in the closure)"
            )
        return super()._closure_loss(result)

    def _mean_gradient(self, grads: TensorList) -> None:
        """With loss_reduction="sum", turn ĝ = ∇Σᵢfᵢ into the mean gradient (in place, so also p.grad)."""
        if self.loss_reduction == "sum":
            grads.mul_(1.0 / self._hooks.batch_size())

    def _missing_curvature(self, params: list[Tensor]) -> RuntimeError:
        names = {id(p): n for n, p in self.model.named_parameters()}
        listed = ", ".join(names.get(id(p), "?") for p in params)
        return RuntimeError(
            f"{listed} got a gradient, but no output gradient reached its layer's hooks: is the parameter "
            "used outside the layer's forward (functionally, e.g. by nn.MultiheadAttention)?"
        )
