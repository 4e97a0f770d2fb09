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
from .forgetting import ForgetsStart, check_forget_start, early_rate_of, start_of, step_of
from .forgetting import decay as start_decay

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


def forgets_start(group: dict[str, Any]) -> bool:
    """Whether the second moment's weights follow ``forget_start`` (:mod:`ngvi.optim.forgetting`): only with
    ``step_moment="debiased"``, whose state keeps the start's weight w."""
    return group["step_moment"] == "debiased" and early_rate_of(group) is not None


def check_forget_start_of_moment(group: dict[str, Any]) -> None:
    """``forget_start`` as :func:`~ngvi.optim.forgetting.check_forget_start`; a number needs the debiased
    moment (eq. 92 divides the start itself)."""
    check_forget_start(group)
    rate = group.get("forget_start", AUTO)
    if group["step_moment"] == "paper" and not (rate is None or (isinstance(rate, str) and rate == AUTO)):
        raise ValueError("forget_start needs step_moment='debiased' (eq. 92 divides the start itself)")


def scheduled_moment(decay: float, states: list[dict[str, Any]], group: dict[str, Any]) -> tuple[Any, Any]:
    """(this step's decay, the step's bias corrections 1 − w) with ``forget_start``: w = Π decayₖ is the
    start's weight after this step, so 1 − w is the data's total weight in v (Adam's 1 − γ₂ᵗ for a
    constant decay)."""
    now = start_decay(decay, step_of(states), group, *start_of(group))
    return now, [1.0 - st["start_weight"] * now for st in states]


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


class Vadam(ForgetsStart, VariationalOptimizer):
    """Variational Adam. Posterior precision 1/σ² = N·s + λ.

    Args:
        params: parameters or groups.
        data_size: N, the number of training examples (the closure returns a mean over a minibatch).
        lr: α.
        betas: (γ₁, γ₂).
        prior_prec: λ of the prior N(0, I/λ).
        init_prec: precision of q at t=0: ``"auto"`` (default) is N + λ (s₀ = 1, σ₀ ≈ 1/√N); ``None`` the
            prior's (s₀ = 0); a number sets s₀ = (init_prec − λ)/N.
        mc_samples: posterior samples per step.
        step_moment: ``"debiased"`` (default: Adam's bias-corrected second moment, so s₀ sets only σ) or
            ``"paper"`` (eq. 92 divides s₀ too); see the module docstring.
        curvature: the estimator of ĥ: ``"grad2"`` (ĝ², the paper's; the only one Vadam takes).
        forget_start: the early weight 1 − γ₂ (:mod:`ngvi.optim.forgetting`; debiased moment only): None
            (default: the constant γ₂), ``"auto"`` (3·10⁻³ until N·s₀ is 1% of λ, with
            ``init_prec="auto"``), or a number.
        **engine_kwargs: the options of every ngvi optimizer: ``seed``, ``skip_nonfinite``,
            ``empirical_bayes`` and ``engine`` (an :class:`~ngvi.EngineOptions` or a dict: ``noise``,
            ``noise_dtype``, ``rank_noise``, ``compile``, ``fp32_state``, ``finite_check``, ``flat``):
            see :class:`~ngvi.VariationalOptimizer`.

    Raises:
        ValueError: a hyperparameter out of its range or of the wrong type; the message names it.
    """

    elementwise = True
    _curvature_state = "exp_avg_sq"  # what ``diagnostics()`` watches move (:mod:`.diagnostics`)
    curvatures = ("grad2",)  # the estimators of ĥ this rule accepts (:mod:`ngvi.curvature`)
    _takes_posterior_prior = True

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
        forget_start: float | str | None = None,
        **engine_kwargs: Any,
    ):
        defaults = dict(
            data_size=data_size,
            lr=lr,
            betas=betas,
            prior_prec=prior_prec,
            init_prec=init_prec,
            step_moment=step_moment,
            forget_start=forget_start,
        )
        super().__init__(params, defaults, mc_samples=mc_samples, curvature=curvature, **engine_kwargs)

    def _check_group(self, group):
        check.prior_group(group)
        check.betas("betas", group["betas"])
        check.choice("step_moment", group["step_moment"], STEP_MOMENTS)
        check_forget_start_of_moment(group)

    def _init_state(self, group, p, state):
        state["exp_avg"] = torch.zeros_like(p)
        init_second_moment(group, p, state)

    def _precision_core(self, group, states):
        return second_moment_precision(group, states)

    def _update(self, group, means, grads, curvs, states):
        beta1, beta2 = group["betas"]
        if forgets_start(group):
            beta2, bias2 = scheduled_moment(beta2, states, group)
        else:
            bias2 = F.bias_corrections(beta2, states)
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
            bias2=bias2,
            compile=self.compile,
        )
        decay_start_(states, beta2)
