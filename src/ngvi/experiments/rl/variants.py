r"""The six ways of training DDPG's actor in Khan et al. 2018, App. K (Table 3, Algorithms 1–2).

Every variant is a *policy trainer* with the manual form of the ngvi optimizers: inside
``sampled_params(train=...)`` the actor holds the weights it acts with at this time step (θ_t ~ q for the
exploring variants, μ for the plain ones), a backward pass there leaves the policy gradient at θ_t, and
``step()`` after the block updates q (or μ).

=============  =========================================  =====================================
variant        actor update                               sampling distribution
=============  =========================================  =====================================
VadaGrad       :class:`ngvi.VadaGrad` (Alg. 1), α = 10⁻²,  N(μ, 1/s), s₁ = 10⁴
               β = 1 − γ₂ = 0.01
Vadam          :class:`ExplorationVadam` (Alg. 2),        N(μ, 1/(s + λ + c)), s₁ = 0,
               α = 10⁻⁴, γ₁ = 0.9, γ₂ = 0.999,            c = 10⁴ (only for sampling)
               λ = 10⁻⁸, N = 1
SGD-Plain      SGD, α = 10⁻⁴                              none: acts with μ
Adam-Plain     Adam, α = 10⁻⁴, (0.9, 0.999), δ = 10⁻⁸      none
SGD-Explore    eq. 111: SGD on μ (α = 10⁻⁴) and on σ²      N(μ, σ²), σ₁² = 10⁻⁴
               (α^(σ) = 10⁻²)
Adam-Explore   eq. 111: Adam on μ and, separately, on σ²   N(μ, σ²), σ₁² = 10⁻⁴
               (α^(σ) = 10⁻², (0.9, 0.999))
=============  =========================================  =====================================

Not in Table 3: Adam-Action (``adam_action``) is Adam-Plain acting with μ plus Gaussian *action* noise of
standard deviation 0.1 × the action bound (the usual DDPG exploration, as Fujimoto et al. 2018): the baseline
that parameter-space exploration has to beat.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

import ngvi

#: the exploring variants start from precision 10⁴ (App. K); Vadam adds c = 10⁴ to its sampling precision
INIT_PREC = 1e4
SAMPLE_PREC_SHIFT = 1e4


class ExplorationVadam(ngvi.Vadam):
    r"""Vadam for parameter-based exploration (Khan et al. 2018, App. K, Alg. 2).

    The update is :class:`ngvi.Vadam`'s with N = 1 and λ = ``prior_prec`` (10⁻⁸, which then also plays
    Adam's δ): u ← γ₁u + (1−γ₁)(ĝ + λμ), s ← γ₂s + (1−γ₂)ĝ², μ ← μ − α û/(√ŝ + λ), from s₁ = 0, so that its
    first steps are Adam-Plain's. Only the sampling differs (Alg. 2, line 3): θ ~ N(μ, 1/(s + λ + c)),
    where the constant c keeps the first samples informative while s is still 0 (with precision λ = 10⁻⁸
    every action would sit at a bound). ``posterior()`` returns this sampling distribution.
    """

    elementwise = True

    def __init__(
        self,
        params,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        prior_prec: float = 1e-8,
        sample_prec_shift: float = SAMPLE_PREC_SHIFT,
        **engine_kwargs: Any,
    ):
        if not sample_prec_shift >= 0:
            raise ValueError(f"sample_prec_shift must be >= 0, got {sample_prec_shift!r}")
        self.sample_prec_shift = float(sample_prec_shift)
        super().__init__(
            params, data_size=1, lr=lr, betas=betas, prior_prec=prior_prec, init_prec=None, **engine_kwargs
        )  # s₁ = 0 (Alg. 2, line 1)

    def _precision_core(self, group, states):
        core, lists, hyper = super()._precision_core(group, states)
        shift, c = hyper["shift"], self.sample_prec_shift
        return (
            core,
            lists,
            {**hyper, "shift": [x + c for x in shift] if isinstance(shift, list) else shift + c},
        )


class SeparateGaussian:
    r"""Naive variational optimisation (App. K, eq. 111): μ and σ² of q = N(μ, σ²) as separate parameters.

    θ = μ + σ⊙ε; by the chain rule ∇_μ E[F] ≈ ĝ and ∇_{σ²} E[F] ≈ ĝ⊙ε/(2σ), each handed to its own
    optimizer (``mean_optimizer`` on the actor's parameters, ``var_optimizer`` on the σ² tensors). σ² is
    kept ≥ ``min_var`` after every step (the paper does not say how it stays positive).
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        mean_optimizer: Callable[[list[Tensor]], torch.optim.Optimizer],
        var_optimizer: Callable[[list[Tensor]], torch.optim.Optimizer],
        init_prec: float = INIT_PREC,
        min_var: float = 1e-12,
        seed: int = 0,
    ):
        self.params = [p for p in params if p.requires_grad]
        self.var = [torch.full_like(p.detach(), 1.0 / init_prec).requires_grad_() for p in self.params]
        self.mean_opt = mean_optimizer(self.params)
        self.var_opt = var_optimizer(self.var)
        self.min_var = min_var
        self.generator = torch.Generator().manual_seed(seed)

    @contextlib.contextmanager
    def sampled_params(self, train: bool = False) -> Iterator[None]:
        means = [p.data for p in self.params]
        noise = [torch.randn(p.shape, generator=self.generator, dtype=p.dtype) for p in self.params]
        with torch.no_grad():
            for p, mean, var, eps in zip(self.params, means, self.var, noise, strict=True):
                p.data = mean + var.sqrt() * eps
        try:
            yield
        finally:
            for p, mean in zip(self.params, means, strict=True):
                p.data = mean
        if train:
            with torch.no_grad():
                for p, var, eps in zip(self.params, self.var, noise, strict=True):
                    var.grad = None if p.grad is None else p.grad * eps / (2 * var.sqrt())

    def zero_grad(self) -> None:
        self.mean_opt.zero_grad()
        self.var_opt.zero_grad()

    def step(self) -> None:
        self.mean_opt.step()
        self.var_opt.step()
        with torch.no_grad():
            for var in self.var:
                var.clamp_(min=self.min_var)

    def std(self) -> list[Tensor]:
        return [v.detach().sqrt() for v in self.var]


class Plain:
    """A torch optimizer on the actor's weights, acting with them as they are (no exploration noise)."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer

    def sampled_params(self, train: bool = False) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def step(self) -> None:
        self.optimizer.step()


class ActionNoise(Plain):
    """A torch optimizer on the actor's weights, acting with them plus Gaussian action noise: the action
    a = π_μ(s) + ε, ε ~ N(0, (``scale`` · bound)²) per component, clipped to ±bound."""

    def __init__(self, optimizer: torch.optim.Optimizer, scale: float, seed: int):
        if not scale > 0:
            raise ValueError(f"the action-noise scale must be > 0, got {scale!r}")
        super().__init__(optimizer)
        self.scale = float(scale)
        self.rng = np.random.default_rng(seed)  # not numpy's global, which the buffer samples with

    def explore(self, action: np.ndarray, bound: float) -> np.ndarray:
        noisy = action + self.rng.normal(0.0, self.scale * bound, size=action.shape)
        return np.clip(noisy, -bound, bound).astype(action.dtype)


#: the action noise of Adam-Action, as a fraction of the action bound (Fujimoto et al. 2018)
ACTION_NOISE = 0.1


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    build: Callable[[list[Tensor], int], Any]  # (actor parameters, seed) -> policy trainer


def _adam(lr: float) -> Callable[[list[Tensor]], torch.optim.Optimizer]:
    return lambda params: torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999), eps=1e-8)


def _sgd(lr: float) -> Callable[[list[Tensor]], torch.optim.Optimizer]:
    return lambda params: torch.optim.SGD(params, lr=lr)


#: Table 3 of App. K, and the action-noise baseline
VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("vadagrad", "VadaGrad",
                lambda p, s: ngvi.VadaGrad(p, lr=1e-2, beta=0.01, init_prec=INIT_PREC, kl_clip=None, seed=s)),
        Variant("vadam", "Vadam", lambda p, s: ExplorationVadam(p, lr=1e-4, betas=(0.9, 0.999), seed=s)),
        Variant("sgd_plain", "SGD-Plain", lambda p, s: Plain(_sgd(1e-4)(p))),
        Variant("adam_plain", "Adam-Plain", lambda p, s: Plain(_adam(1e-4)(p))),
        Variant("sgd_explore", "SGD-Explore",
                lambda p, s: SeparateGaussian(p, _sgd(1e-4), _sgd(1e-2), seed=s)),
        Variant("adam_explore", "Adam-Explore",
                lambda p, s: SeparateGaussian(p, _adam(1e-4), _adam(1e-2), seed=s)),
        Variant("adam_action", "Adam-Action", lambda p, s: ActionNoise(_adam(1e-4)(p), ACTION_NOISE, s)),
    )
}  # fmt: skip
#: the six of the paper (the others are ours)
TABLE3 = ("vadagrad", "vadam", "sgd_plain", "adam_plain", "sgd_explore", "adam_explore")


def search_std(trainer: Any) -> list[Tensor] | None:
    """The standard deviations of the actor's sampling distribution (None for the plain variants)."""
    if isinstance(trainer, SeparateGaussian):
        return trainer.std()
    if isinstance(trainer, ngvi.VariationalOptimizer):
        return trainer.posterior().std
    return None
