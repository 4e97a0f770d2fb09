r"""Curvature estimators: the ĥ of every rule, as components that an optimizer is given.

One vocabulary, ``curvature=``, names them across the optimizers (each rule accepts those that keep its
state valid; ``estimator_for`` refuses the rest with the list it accepts):

============  ==============================================================  ==============================
name          ĥ at the sample θ = μ + σ⊙ε                                     used by
============  ==============================================================  ==============================
"grad2"       ĝ², the squared minibatch gradient                              Vadam, Vprop, NoisyAdam,
                                                                              VadaGrad
"price"       ĝ⊙(θ−μ)/σ² = ĝ⊙ε/σ (Price/Stein; Khan et al. 2018, App. D.1)   VON, IVON
"hutchinson"  z⊙(∇²f z), z Rademacher (a Hessian-vector product)              VON
"ef"          (1/M)Σᵢ gᵢ², per-example gradients of the closure's loss        VOGN (Gauss-Newton, eq. 9),
                                                                              NoisyAdam (NNG eq. 11)
"fisher"      the same with targets sampled from the model's predictive      VOGN, NoisyAdam
K-FAC         A = E[āāᵀ], S = E[δδᵀ] per layer ("ef" or "fisher" targets)     NoisyKFAC (:mod:`.layer`)
============  ==============================================================  ==============================

An estimator says what the engine must provide: ε (``needs_noise``), the sample still in the parameters
(``reads_sample``), a backward graph (``create_graph``), or hooks on the layers during a training sample
(``scope``, :mod:`.layer`). ``local`` marks statistics computed from a rank's own data, which the engine
averages over ranks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .._tensorlist import TensorList

__all__ = [
    "CurvatureEstimator",
    "CurvatureInput",
    "GradientSquares",
    "Hutchinson",
    "Price",
    "estimator_for",
]


@dataclass
class CurvatureInput:
    """What the engine hands an estimator for one sample of one parameter group.

    ``params`` are the group's trainable parameters with a gradient, in group order; ``grads``, ``noise``
    (ε of the sample, when the estimator ``needs_noise``) and ``states`` follow that order.
    ``sqrt_precision()`` gives 1/σ at the sample; ``generator(device)`` is the optimizer's seeded generator;
    ``num_steps`` counts the updates taken so far."""

    group: dict[str, Any]
    params: list[Tensor]
    grads: TensorList
    noise: TensorList | None
    states: list[dict[str, Any]]
    sqrt_precision: Callable[[], TensorList]
    generator: Callable[[torch.device], torch.Generator]
    num_steps: int


class CurvatureEstimator:
    """Base class: ĥ for one sample of one parameter group (None when the rule needs none this step)."""

    name = ""
    needs_noise = False  #: reads ε of the sample
    reads_sample = False  #: runs with the sample still in the parameters (a Hessian-vector product)
    create_graph = False  #: the backward pass keeps its graph
    local = False  #: computed from this rank's data: averaged over ranks under torch.distributed
    backward_in_step = False  #: the optimizer runs the backward pass itself (sampled targets)
    elementwise = False  #: ĥ of each weight from that weight's ĝ, ε and σ alone (flat buffers allowed)
    #: ĥ shaped like each parameter but read from its layer (hooks), not from ĝ: a flat bucket gathers the
    #: parameters' ĥ into its flat sum (one concatenation)
    per_parameter = False

    def estimate(self, sample: CurvatureInput) -> TensorList | None:
        raise NotImplementedError

    def scope(self, *, train: bool) -> contextlib.AbstractContextManager[Any]:
        """Entered by the engine inside each sample, after the draw (hooks, for example)."""
        return contextlib.nullcontext()

    def backward(
        self, loss: Tensor, output: Tensor | None, generator: Callable[..., torch.Generator]
    ) -> None:
        """The backward pass of one sample."""
        loss.backward(create_graph=self.create_graph)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class GradientSquares(CurvatureEstimator):
    """ĥ = ĝ², the squared minibatch gradient (Vadam, Vprop, noisy Adam, VadaGrad)."""

    name = "grad2"
    elementwise = True

    def estimate(self, sample: CurvatureInput) -> TensorList:
        return sample.grads.square()


class Price(CurvatureEstimator):
    """ĥ = ĝ⊙(θ−μ)/σ² = ĝ⊙ε/σ, the reparameterisation (Price/Stein) estimator of E_q[∇²f]'s diagonal."""

    name = "price"
    needs_noise = True
    elementwise = True

    def estimate(self, sample: CurvatureInput) -> TensorList:
        return (sample.grads * sample.noise).mul_(sample.sqrt_precision())


class Hutchinson(CurvatureEstimator):
    """ĥ = z⊙(∇²f z) with Rademacher z from the optimizer's generator, an unbiased estimate of the diagonal.

    The backward pass keeps its graph (``opt.backward(loss)`` does so; a hand-written closure calls
    ``loss.backward(create_graph=True)``). Each parameter group takes its own product z_g⊙(H_gg z_g)."""

    name = "hutchinson"
    reads_sample = True
    create_graph = True

    def estimate(self, sample: CurvatureInput) -> TensorList:
        params = sample.params
        graphs = [p.grad for p in params]
        if any(g.grad_fn is None for g in graphs):
            raise RuntimeError(
                "curvature='hutchinson' needs a Hessian-vector product: call opt.backward(loss) or "
                "loss.backward(create_graph=True) in the closure (or inside sampled_params(train=True))"
            )
        zs = [rademacher(p, sample.generator(p.device)) for p in params]
        with torch.enable_grad():
            # retain: other parameter groups take their products through the same graph
            hz = torch.autograd.grad(graphs, params, grad_outputs=zs, allow_unused=True, retain_graph=True)
        for p in params:  # the graph is freed once no group's .grad refers to it
            p.grad = p.grad.detach()
        return TensorList(
            z * (h if h is not None else torch.zeros_like(z)) for z, h in zip(zs, hz, strict=True)
        )


def rademacher(p: Tensor, generator: torch.Generator) -> Tensor:
    """z ∈ {−1, +1} shaped like p."""
    return torch.empty_like(p).bernoulli_(0.5, generator=generator).mul_(2).sub_(1)


_DIAGONAL: dict[str, type[CurvatureEstimator]] = {e.name: e for e in (GradientSquares, Price, Hutchinson)}


def estimator_for(
    curvature: str | CurvatureEstimator, accepted: tuple[str, ...], keyword: str = "curvature"
) -> CurvatureEstimator:
    """The estimator named ``curvature`` (or given as an object) if the rule accepts it, else a ValueError."""
    name = curvature.name if isinstance(curvature, CurvatureEstimator) else curvature
    if name not in accepted:
        raise ValueError(f"{keyword} must be one of {accepted}, got {curvature!r}")
    if isinstance(curvature, CurvatureEstimator):
        return curvature
    return _DIAGONAL[name]()
