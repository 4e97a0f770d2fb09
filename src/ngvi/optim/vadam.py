r"""Vadam: Adam with weight perturbation (Khan et al. 2018, Fig. 1 and App. E, eqs. 88–93).

.. math::
    \theta &\sim \mathcal N(\mu,\ 1/[N(s + \tilde\lambda)])          && (88)\ \text{uses the uncorrected } s\\
    u &\leftarrow \gamma_1 u + (1-\gamma_1)(\hat g + \tilde\lambda\mu) && (89)\\
    s &\leftarrow \gamma_2 s + (1-\gamma_2)\,\hat g^2                  && (90)\\
    \hat u &= u/(1-\gamma_1^t),\quad \hat s = s/(1-\gamma_2^t)         && (91, 92)\\
    \mu &\leftarrow \mu - \alpha\,\hat u / (\sqrt{\hat s} + \tilde\lambda) && (93)

with λ̃ = λ/N. With several MC samples ĝ is their mean gradient and ĝ² the mean of their squares (as in the
authors' code). ``betas`` = (γ₁, γ₂) as in Adam.

**Which second moment divides the step** (``step_moment``). s starts at s₀ = (init_prec − λ)/N and after t
steps is s = γ₂ᵗs₀ + v, where v = (1−γ₂)Σₖγ₂^{t−k}ĝₖ² is Adam's second moment (started at 0). Eq. 92
divides all of s by 1−γ₂ᵗ, so a start s₀ > 0 is inflated about 1/((1−γ₂)t)-fold in the first steps
(1000-fold at t = 1 for γ₂ = 0.999), which shrinks the step and freezes μ for hundreds of steps
(docs/CHOOSING.md has the measurements).

* ``"debiased"`` (default): the step divides by Adam's bias-corrected v, ŝ = v/(1−γ₂ᵗ), the unbiased
  estimate of E[ĝ²] whatever s₀ is; the sample uses the paper's uncorrected s = γ₂ᵗs₀ + v (eq. 88). The state
  keeps v (``exp_avg_sq``) and the weight w = Πγ₂ of the start (``start_weight``, γ₂ᵗ for a constant γ₂),
  and the precision adds the decayed start: N(v + w·s₀) + λ. With s₀ = 0
  (``init_prec=None``) this *is* Fig. 1, bit for bit; the fixed point is the paper's for every s₀.
* ``"paper"``: eqs. 88–93 as written (the state keeps s, started at s₀).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .. import _validation as check
from ..curvature.estimators import CurvatureEstimator
from . import functional as F
from .engine import posterior_prior as pp
from .engine.optimizer import VariationalOptimizer, initial_curvature
from .engine.prior import AUTO, initial_curvature_value

#: the values of ``step_moment`` (Vadam, Vprop)
STEP_MOMENTS = ("debiased", "paper")


def start_weight() -> float:
    """The weight w = Πₖ decayₖ of s₀ in s = w·s₀ + v (``step_moment="debiased"``), 1 at t = 0: a product,
    not decayᵗ, so that it only shrinks when a schedule changes the decay. A Python float (one per tensor,
    like the step count): no device round trip when the precision is formed."""
    return 1.0


def decayed_start_shift(group: dict[str, Any], states: list[dict[str, Any]]) -> Any:
    """λ + N·w·s₀: the shift of the precision N·v + shift when the state keeps the data part v of
    s = w·s₀ + v (``step_moment="debiased"``); λ itself where s₀ = 0 or for ``"paper"``. One number when all
    ``states`` share w (the compiled core then guards one input, not one per tensor), else one per tensor."""
    s0 = initial_curvature_value(group)
    if group["step_moment"] == "paper" or s0 == 0:
        return group["prior_prec"]
    n = group["data_size"]
    weights = {st["start_weight"] for st in states}
    if len(weights) == 1:  # tensors that stepped together share w: one number (the same float in each)
        return group["prior_prec"] + n * s0 * weights.pop()
    return [group["prior_prec"] + n * s0 * st["start_weight"] for st in states]


def init_second_moment(group: dict[str, Any], p: Tensor, state: dict[str, Any]) -> None:
    """``exp_avg_sq``: s started at s₀ (``step_moment="paper"``), or v from 0 with the start's weight."""
    if group["step_moment"] == "paper":
        state["exp_avg_sq"] = initial_curvature(group, p)  # s, started at s₀
    else:
        state["exp_avg_sq"] = torch.zeros_like(p)  # v: the start lives in the precision's shift
        state["start_weight"] = start_weight()


def second_moment_precision(group: dict[str, Any], states: list[dict[str, Any]]) -> tuple:
    """The precision core N·s + λ (with the decayed start's shift) of Vadam and Vprop."""
    return (
        F.scaled_precision,
        ([st["exp_avg_sq"] for st in states],),
        dict(
            scale=float(group["data_size"]),
            shift=pp.shifted(states, decayed_start_shift(group, states), 1.0, group["prior_prec"]),
        ),
    )


def decay_start_(states: list[dict[str, Any]], decay: float) -> None:
    """w ← w·decay for each state that keeps a start weight (after the moment's EMA step)."""
    for st in states:
        if "start_weight" in st:
            st["start_weight"] *= decay


def prior_tilde(group: dict[str, Any], states: list[dict[str, Any]]) -> Any:
    """λ̃ = λ/N, or Λ₀/N per weight under a posterior prior (:mod:`.engine.posterior_prior`)."""
    n = group["data_size"]
    return pp.shifted(states, group["prior_prec"] / n, 1 / n, group["prior_prec"])


class Vadam(VariationalOptimizer):
    """Variational Adam. Posterior precision 1/σ² = N·s + λ.

    Args:
        params: parameters or groups.
        data_size: N, the number of training examples (the closure returns a mean over a minibatch).
        lr: α.  betas: (γ₁, γ₂).  prior_prec: λ of the prior N(0, I/λ).
        init_prec: precision of q at t=0: ``"auto"`` (default) is N + λ (s₀ = 1, σ₀ ≈ 1/√N); ``None`` the
            prior's (s₀ = 0); a number sets s₀ = (init_prec − λ)/N.
        mc_samples: posterior samples per step.
        step_moment: ``"debiased"`` (default: Adam's bias-corrected second moment, so s₀ sets only σ) or
            ``"paper"`` (eq. 92 divides s₀ too); see the module docstring.
    """

    elementwise = True
    curvature_state = "exp_avg_sq"  # what ``diagnostics()`` watches move (:mod:`.diagnostics`)
    curvatures = ("grad2",)  # the estimators of ĥ this rule accepts (:mod:`ngvi.curvature`)
    takes_posterior_prior = True

    def __init__(
        self,
        params,
        data_size: int,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        prior_prec: float = 1.0,
        init_prec: float | str | None = AUTO,
        mc_samples: int = 1,
        *,
        step_moment: str = "debiased",
        curvature: str | CurvatureEstimator = "grad2",
        **engine_kwargs: Any,
    ):
        defaults = dict(
            data_size=data_size,
            lr=lr,
            betas=betas,
            prior_prec=prior_prec,
            init_prec=init_prec,
            step_moment=step_moment,
        )
        super().__init__(params, defaults, mc_samples=mc_samples, curvature=curvature, **engine_kwargs)

    def _check_group(self, group):
        check.prior_group(group)
        check.betas("betas", group["betas"])
        check.choice("step_moment", group["step_moment"], STEP_MOMENTS)

    def _init_state(self, group, p, state):
        state["exp_avg"] = torch.zeros_like(p)
        init_second_moment(group, p, state)

    def _precision_core(self, group, states):
        return second_moment_precision(group, states)

    def _update(self, group, means, grads, curvs, states):
        beta1, beta2 = group["betas"]
        tilde = prior_tilde(group, states)
        F.run_core(
            F.vadam_update_,
            means,
            pp.pulled(states, grads, tilde),
            curvs,
            [st["exp_avg"] for st in states],
            [st["exp_avg_sq"] for st in states],
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            prior_tilde=tilde,
            bias1=F.bias_corrections(beta1, states),
            bias2=F.bias_corrections(beta2, states),
            compile=self.compile,
        )
        decay_start_(states, beta2)
