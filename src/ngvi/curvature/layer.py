r"""Estimators that read a model's layers through hooks: per-example Gauss-Newton (VOGN) and K-FAC factors.

The hooks live only inside a training sample (the engine enters :meth:`LayerCurvature.scope` there), so the
model stays free of hooks, picklable and deep-copyable between steps.

**Closure contract.**

* ``targets="ef"`` (empirical Fisher): the usual closure. It zeroes the gradients, computes the mean NLL,
  calls ``loss.backward()`` (or ``opt.backward(loss, output)``) and returns the loss (or ``(loss, output)``).
  The per-example gradients of that loss give the curvature.
* ``targets="fisher"`` (true Fisher, NNG §3): the closure computes the output and the mean NLL and either
  calls ``opt.backward(loss, output)`` or returns ``(loss, output)`` **without** calling backward. The
  optimizer then draws targets ỹ ~ p(y | output) from its own seeded generator, backpropagates
  Σᵢ −log p(ỹᵢ | outputᵢ) to the layer outputs (the curvature), and finally calls ``loss.backward()`` (the
  gradient ĝ, from the real targets).

* One backward pass per sample: gradient accumulation over micro-batches inside one sample is refused (a
  RuntimeError that names the fix: one forward over the concatenated batch, or one
  ``sampled_params(train=True)`` block per micro-batch before ``step()``). A layer called several times in
  one forward pass (shared weights) is one graph and one backward pass, and is supported.

**Sums.** With ``loss_reduction="sum"`` the closure returns Σᵢ fᵢ; the per-example gradients are read
unscaled and ĝ is divided by M, so the update still sees the mean gradient.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from .. import _validation as check
from .._tensorlist import TensorList
from . import statistics
from .estimators import CurvatureEstimator, CurvatureInput
from .hooks import CurvatureHooks
from .likelihoods import Likelihood, make_likelihood

__all__ = ["TARGETS", "KroneckerFactors", "LayerCurvature", "PerExampleGGN"]

TARGETS = ("ef", "fisher")


class LayerCurvature(CurvatureEstimator):
    """Base of the hook-based estimators: the model, its hooks, and where the targets come from.

    Args:
        model: the network; its trainable parameters must sit in nn.Linear, nn.Conv2d, nn.LayerNorm or
            nn.GroupNorm layers (others get a ValueError naming them).
        targets: "ef" (the closure's own targets) or "fisher" (targets sampled from ``likelihood``).
        likelihood: "gaussian", "bernoulli", "categorical" or a :class:`Likelihood` ("fisher" only).
        noise_prec: τ of the "gaussian" likelihood.
        loss_reduction: "mean" (the closure returns (1/M)Σᵢfᵢ) or "sum".
        chunk_bytes: memory bound for per-example gradients of conv layers and layers used twice.
        owner: the optimizer named in messages (default: the class's ``owner``), for a rule that shares an
            estimator class with another (NoisyAdam's per-example curvature is VOGN's).
    """

    local = True  # per-example sums and Kronecker factors come from this rank's minibatch
    owner = "the optimizer"  # named in messages

    def __init__(
        self,
        model: nn.Module,
        targets: str = "ef",
        *,
        likelihood: str | Likelihood | None = None,
        noise_prec: float = 1.0,
        loss_reduction: str = "mean",
        chunk_bytes: int = 64 * 2**20,
        owner: str | None = None,
    ) -> None:
        if owner is not None:
            self.owner = owner
        check.model(model, self.owner, "so that it can hook its layers")
        self.targets = check.choice("curvature", targets, TARGETS)
        self.name = targets
        if targets == "fisher":
            if likelihood is None:
                raise ValueError(
                    "curvature='fisher' samples targets from the model's predictive and needs likelihood= "
                    "'gaussian' (with noise_prec), 'bernoulli' or 'categorical'"
                )
            self.likelihood: Likelihood | None = make_likelihood(likelihood, noise_prec)
        elif likelihood is not None:
            raise ValueError(
                f"likelihood={likelihood!r} is only used with curvature='fisher'; pass curvature='fisher' to "
                "sample targets from the model, or drop likelihood= for the empirical curvature"
            )
        else:
            self.likelihood = None
        self.backward_in_step = targets == "fisher"
        self.model = model
        self.hooks = CurvatureHooks(model, loss_reduction=loss_reduction, chunk_bytes=chunk_bytes)

    @property
    def parameters(self) -> list[Tensor]:
        """The trainable parameters of the hooked model, to optimise."""
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def loss_reduction(self) -> str:
        return self.hooks.loss_reduction

    @contextlib.contextmanager
    def scope(self, *, train: bool) -> Iterator[None]:
        if not train:
            yield
            return
        with self.hooks.recording("sampled" if self.targets == "fisher" else "grads"):
            yield

    def backward(
        self, loss: Tensor, output: Tensor | None, generator: Callable[..., torch.Generator]
    ) -> None:
        """ "fisher": sample targets at ``output``, backpropagate their NLL to the layer outputs for the
        curvature, then ``loss.backward()`` for the gradient. "ef": ``loss.backward()``."""
        if self.hooks.capture is None:
            raise RuntimeError(
                f"{self.owner}.backward() belongs inside `with opt.sampled_params(train=True):` "
                "(or a closure passed to step)"
            )
        with torch.enable_grad():
            if self.targets == "fisher":
                if not isinstance(output, Tensor):
                    raise TypeError(
                        "curvature='fisher' needs the network output: call opt.backward(loss, output)"
                    )
                target = self.likelihood.sample(output, generator(output.device))
                self.hooks.backward_sampled(output, self.likelihood.nll_grad(output, target))
            loss.backward()

    def mean_gradient_(self, grads: TensorList) -> None:
        """With loss_reduction="sum", turn ĝ = ∇Σᵢfᵢ into the mean gradient (in place, so also p.grad).
        Every estimator starts here, so this is also where a sample of several backward passes (gradient
        accumulation) is refused, also on steps that read no statistics."""
        self.hooks.check_one_pass()
        if self.loss_reduction == "sum":
            grads.mul_(1.0 / self.hooks.batch_size())

    def require_all(self, sample: CurvatureInput) -> None:
        """For rules whose posterior couples every parameter (NNGFull, NNGBlkTri): refuse a sample in which
        some trainable parameter got no gradient (raised before anything is updated)."""
        if len(sample.params) == len(self.parameters):
            return
        names = {id(p): n for n, p in self.model.named_parameters()}
        have = {id(p) for p in sample.params}
        idle = ", ".join(names.get(id(p), "?") for p in self.parameters if id(p) not in have)
        raise RuntimeError(
            f"{self.owner}'s posterior couples all trainable parameters, but {idle} got no gradient in this "
            "sample (unused in the forward pass?); freeze them (requires_grad_(False)) before creating the "
            "optimizer"
        )

    def missing(self, params: list[Tensor]) -> RuntimeError:
        names = {id(p): n for n, p in self.model.named_parameters()}
        listed = ", ".join(names.get(id(p), "?") for p in params)
        return RuntimeError(
            f"{listed} got a gradient, but no output gradient reached its layer's hooks: is the parameter "
            "used outside the layer's forward (functionally, e.g. by nn.MultiheadAttention)?"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(targets={self.targets!r}, likelihood={self.likelihood!r})"


class PerExampleGGN(LayerCurvature):
    """ĥ = (1/M)Σᵢ gᵢ², the mean of squared per-example gradients (VOGN's Gauss-Newton, eq. 9), from one
    backward pass: for a Linear layer Σᵢ gᵢ² = (δ²)ᵀ(a²), one extra matrix product."""

    owner = "VOGN"
    per_parameter = True

    def estimate(self, sample: CurvatureInput) -> TensorList:
        self.mean_gradient_(sample.grads)
        mean_sq = self.hooks.mean_sq_grads()
        missing = [p for p in sample.params if p not in mean_sq]
        if missing:
            raise self.missing(missing)
        return TensorList(mean_sq[p] for p in sample.params)


class KroneckerFactors(LayerCurvature):
    """The K-FAC factors Â = E[āāᵀ] and Ŝ = E[δδᵀ] of each layer (KFC factors for Conv2d), every
    ``group["stats_every"]`` steps. The engine averages per-parameter curvature over samples and checks it
    is finite, so a layer's two factors travel together, flattened, with its first parameter (its other
    parameters carry a one-element placeholder)."""

    owner = "NoisyKFAC"

    def __init__(self, model: nn.Module, targets: str = "ef", **kwargs: Any) -> None:
        super().__init__(model, targets, **kwargs)
        self.layer_of = {p: i for i, layer in enumerate(self.hooks.layers) for p in layer.params}

    def estimate(self, sample: CurvatureInput) -> TensorList | None:
        self.mean_gradient_(sample.grads)
        if sample.num_steps % sample.group["stats_every"] != 0:
            return None
        factors = self.hooks.kfac_factors()
        out, missing = [], []
        for p in sample.params:
            i = self.layer_of[p]
            if p is not self.hooks.layers[i].params[0]:
                out.append(p.new_zeros(1))
            elif i not in factors:
                missing.append(p)
            else:
                a, s = factors[i]
                out.append(statistics.flat_factors(a, s))
        if missing:
            raise self.missing(missing)
        return TensorList(out)
