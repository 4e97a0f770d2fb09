r"""K-FAC (Martens & Grosse 2015): the point-estimate optimizer that noisy K-FAC adds weight noise to.

NNG's Table 2 compares noisy K-FAC with plain K-FAC on the same network. This is that K-FAC, built on the
same Kronecker factors, schedules and π-split damping as :class:`ngvi.NoisyKFAC`, without the noise: the
gradient is taken at the weights themselves and, with λ̃ = ``prior_prec``/N the ℓ2 term of the MAP objective
f(θ) + (λ/2N)‖θ‖²,

.. math::
    A &\leftarrow (1-\beta)A + \beta\hat A,\qquad S \leftarrow (1-\beta)S + \beta\hat S \\
    W &\leftarrow W - \alpha\,[S + \tfrac{\sqrt\gamma}{\pi}I]^{-1}\,(\hat g + \tilde\lambda W)\,
        [A + \pi\sqrt\gamma I]^{-1},\qquad \gamma = \tilde\lambda + \gamma_{ex}

(M&G §6.3's factored Tikhonov damping, the ℓ2 term added to the damping as M&G do). With
``prior_prec = 1/η`` it is NoisyKFAC's update with kl_weight = 1 and the sampling switched off: the noise is
the only difference, which is what NNG's comparison measures. The curvature is the empirical Fisher of the
closure's loss (``"ef"``) or the true Fisher from targets sampled from the model (``"fisher"``, as M&G).

The hyperparameters and their defaults are the family's (:mod:`ngvi.optim.kronecker`): α = 0.1, β = 10⁻³,
momentum 0.5 and factors that start at the identity (``init_prec="auto"``: the first steps are SGD steps of
size α). M&G's start, ``init_prec=None``, begins the factors at 0 with the running mean for the first 1/β
updates; NNG's comparison (the vision experiment) pins it with lr 10⁻³ and β = 0.01.

A point estimate: ``posterior()`` raises NotImplementedError and ``sampled_params()`` leaves the weights as
they are; ``mc_samples`` must be 1.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .. import _validation as check
from .._tensorlist import TensorList
from ..curvature.kfac import Factorisation, factorise, inverse, pi_split
from ..curvature.layer import KroneckerFactors
from ..curvature.likelihoods import Likelihood
from ..optim.diagnostics import Diagnostics
from ..optim.kronecker import DEFAULTS, KroneckerFamily

__all__ = ["KFAC"]


class KFAC(KroneckerFamily):
    """K-FAC on a model's nn.Linear / nn.Conv2d (and LayerNorm / GroupNorm) layers.

    Args:
        model: the network (layers as for :class:`ngvi.NoisyKFAC`).
        data_size: N (scales the ℓ2 term: λ̃ = prior_prec/N).  lr: α.  beta: the factor EMA step.
        momentum: heavy-ball on the preconditioned step.  prior_prec: λ of the Gaussian prior, i.e. the
            weight decay λ/N (0: none).  damping: γ_ex.  stats_every, inv_every: T_stats, T_inv.
        mc_samples: must be 1 (a point estimate).  curvature, likelihood, noise_prec, loss_reduction:
            as for NoisyKFAC.  init_prec: where the factors start: ``"auto"`` (A₀ = S₀ = I) or ``None``
            (0, with K-FAC's warm start).
        kl_clip: the family's trust region κ on the step (:mod:`ngvi.optim.kronecker`): ``"auto"`` (10⁻²
            unless ``init_prec=None``), a number, or None (off).
        **engine_kwargs: ``seed`` (for sampled targets), ``skip_nonfinite``.
    """

    _has_posterior = False  # a point estimate: its prior's precision cannot be learned from a posterior

    _perturbs_in_step = False  # the gradient at the weights

    def __init__(
        self,
        model: nn.Module,
        data_size: int,
        lr: float = DEFAULTS["lr"],
        beta: float = DEFAULTS["beta"],
        momentum: float = DEFAULTS["momentum"],
        prior_prec: float = 0.0,
        damping: float = DEFAULTS["damping"],
        stats_every: int = DEFAULTS["stats_every"],
        inv_every: int = DEFAULTS["inv_every"],
        mc_samples: int = 1,
        curvature: str = "ef",
        *,
        init_prec: str | None = DEFAULTS["init_prec"],
        kl_clip: float | str | None = DEFAULTS["kl_clip"],
        likelihood: str | Likelihood | None = None,
        noise_prec: float = 1.0,
        loss_reduction: str = "mean",
        **engine_kwargs: Any,
    ):
        check.model(model, "KFAC", "so that it can hook its layers")  # (not NoisyKFAC's name)
        if check.positive_int("mc_samples", mc_samples) != 1:
            raise ValueError(
                f"KFAC is a point estimate: its gradient is taken at the weights, so mc_samples must be 1, "
                f"got {mc_samples!r}"
            )
        estimator = KroneckerFactors(
            model,
            curvature,
            likelihood=likelihood,
            noise_prec=noise_prec,
            loss_reduction=loss_reduction,
            owner="KFAC",
        )
        hyper = dict(
            data_size=data_size, lr=lr, beta=beta, momentum=momentum, prior_prec=prior_prec, damping=damping,
            stats_every=stats_every, inv_every=inv_every, init_prec=init_prec, kl_clip=kl_clip,
        )  # fmt: skip
        super().__init__(estimator, hyper, mc_samples=1, **engine_kwargs)

    def _check_prior(self, group: dict[str, Any]) -> None:
        check.nonnegative("prior_prec", group["prior_prec"])
        check.nonnegative("damping", group["damping"])
        if group["prior_prec"] + group["damping"] <= 0:
            raise ValueError(
                "KFAC needs prior_prec > 0 or damping > 0: with neither the factors' inverses can be "
                "singular (a layer with fewer examples than inputs)"
            )
        if group["init_prec"] not in ("auto", None):
            raise ValueError(
                f"KFAC's init_prec is 'auto' (factors from the identity) or None (from 0, K-FAC's warm "
                f"start): a point estimate has no initial precision, got {group['init_prec']!r}"
            )

    @staticmethod
    def intrinsic_damping(group: dict[str, Any]) -> float:
        """λ̃ = λ/N, the ℓ2 term (added to the gradient and to the damping)."""
        return group["prior_prec"] / group["data_size"]

    def _factorisations(self, group: dict[str, Any], a: Tensor, s: Tensor) -> list[Factorisation]:
        """A + π√γ I and S + √γ/π I with γ = λ̃ + γ_ex (no sampling roots)."""
        root = math.sqrt(self.intrinsic_damping(group) + group["damping"])
        pi = pi_split(a, s)
        return [factorise(a, pi * root), factorise(s, root / pi)]

    def _inverses_from(self, group, factorisations, ok):
        """(A + π√γ I)⁻¹ and (S + √γ/π I)⁻¹."""
        a_inv, s_inv = (inverse(f, ok) for f in factorisations)
        return {"A_inv": a_inv, "S_inv": s_inv}

    def point_estimate(self, p: Tensor) -> bool:
        return True  # every weight: sampled_params() leaves it as it is, and it has no posterior variance

    def _perturb(self, group, params, noise, states):
        return None

    def _precision(self, group, states):
        """Infinite: a point estimate has variance 0 (what the engine's diagnostics read; the weights are
        point estimates, so they leave them out)."""
        params = self.trainable(group)
        return TensorList(torch.full_like(p, math.inf) for p, _ in zip(params, states, strict=True))

    def _no_posterior(self) -> str:
        return (
            "KFAC is a point estimate and has no posterior distribution; its weights are the model's "
            "parameters. Use ngvi.NoisyKFAC for the matrix-variate Gaussian posterior of the same update"
        )

    @torch.no_grad()
    def posterior(self):
        raise NotImplementedError(self._no_posterior())

    def diagnostics(self) -> Diagnostics:
        """Steps and data size; a point estimate has no variance to report (those fields are None)."""
        return Diagnostics(
            optimizer=type(self).__name__,
            steps=self.num_steps,
            skipped_steps=self.skipped_steps,
            data_size=[int(g["data_size"]) for g in self.param_groups],
        )
