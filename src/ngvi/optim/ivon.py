r"""IVON: the improved variational online-Newton rule (Shen et al. 2024, Alg. 1); notation: docs/NOTATION.md.

.. math::
    \theta &\sim \mathcal N(m,\ \sigma^2),\quad \sigma^2 = 1/[N(h+\delta)] \\
    \hat h &= \hat g\odot(\theta-m)/\sigma^2 \\
    \bar g &\leftarrow \beta_1\bar g + (1-\beta_1)\hat g \\
    h &\leftarrow \beta_2 h + (1-\beta_2)\hat h + \tfrac12(1-\beta_2)^2 (h-\hat h)^2/(h+\delta) \\
    m &\leftarrow m - \alpha\,\operatorname{clip}\!\big((\bar g/(1-\beta_1^t) + \delta m)/(h+\delta)\big)

with δ = ``weight_decay`` (the prior precision divided by N) and N = ``data_size`` (the effective sample
size). The clip is element-wise to [−``clip_radius``, ``clip_radius``].
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import _validation as check
from ..curvature.estimators import CurvatureEstimator
from . import functional as F
from .engine import posterior_prior as pp
from .engine.optimizer import VariationalOptimizer
from .engine.prior import AUTO, check_kl_clip, kl_clip_of
from .forgetting import ForgetsStart, check_forget_start, step_of
from .forgetting import decay as start_decay

#: the paper's settings (Shen et al. 2024, Alg. 1 and its defaults): ``IVON(params, N, **PAPER)``. The
#: constant β₂ keeps h near h₀ for ~1/(1 − β₂) = 10⁵ steps; ngvi's default forgets h₀ (``forget_start``).
PAPER: dict[str, Any] = dict(lr=0.1, betas=(0.9, 0.99999), hess_init=1.0, forget_start=None, kl_clip=None)


class IVON(ForgetsStart, VariationalOptimizer):
    """Improved variational online-Newton. Posterior precision 1/σ² = N(h + δ).

    Args:
        params: parameters or groups.
        data_size: N (IVON's effective sample size; ``ess=`` is the same, the name of the authors' ivon-opt
            package).
        lr: α.
        betas: (β₁, β₂).
        weight_decay: δ (default 1e-4); or ``prior_prec`` = λ = δN, the name every ngvi optimizer accepts.
        hess_init: h₀, in curvature units per example: 1 suits a unit-scale likelihood; with a Gaussian
            likelihood of noise precision τ, τ (with ``forget_start=None`` β₂ = 0.99999 moves h little in 10⁴
            steps; docs/CHOOSING.md).
        mc_samples: samples per step.
        clip_radius: the update clip.
        forget_start: the early curvature weight 1 − β₂ (:mod:`ngvi.optim.forgetting`): ``"auto"``
            (default: 3·10⁻³ until N·h₀ has decayed to 1% of the prior's N·δ, then β₂), a number, or ``None``
            (Alg. 1's constant β₂; the paper's settings: :data:`PAPER`).
        prior_prec: λ = δN (give ``weight_decay`` or this).
        curvature: the estimator of ĥ: ``"price"`` (IVON's reparameterisation estimate; the only one).
        ess: the same as ``data_size`` (ivon-opt's name; give one of the two).
        kl_clip: the trust region κ on the natural step: ``"auto"`` (10⁻²), a number, or None (off).
        **engine_kwargs: the options of every ngvi optimizer: ``seed``, ``skip_nonfinite``,
            ``empirical_bayes`` and ``engine`` (an :class:`~ngvi.EngineOptions` or a dict: ``noise``,
            ``noise_dtype``, ``rank_noise``, ``compile``, ``fp32_state``, ``finite_check``, ``flat``):
            see :class:`~ngvi.VariationalOptimizer`.

    Raises:
        ValueError: a hyperparameter out of its range or of the wrong type; the message names it.
    """

    _takes_posterior_prior = True  # set_prior (:mod:`.engine.posterior_prior`)

    elementwise = True
    _curvature_state = "hess"  # what ``diagnostics()`` watches move (:mod:`.diagnostics`)
    curvatures = ("price",)  # the estimators of ĥ this rule accepts (:mod:`ngvi.curvature`)

    def __init__(
        self,
        params,
        data_size: int | None = None,
        lr: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.99999),
        weight_decay: float | None = None,
        hess_init: float = 1.0,
        mc_samples: int = 1,
        clip_radius: float = math.inf,
        *,
        prior_prec: float | None = None,
        curvature: str | CurvatureEstimator = "price",
        ess: int | None = None,
        kl_clip: float | str | None = AUTO,
        forget_start: float | str | None = AUTO,
        **engine_kwargs: Any,
    ):
        if (data_size is None) == (ess is None):
            raise TypeError("IVON needs data_size= (N) or its alias ess=, exactly one of them")
        data_size = data_size if ess is None else ess
        if prior_prec is not None:  # δ = λ/N
            if weight_decay is not None:
                raise ValueError("pass weight_decay= or prior_prec= (= weight_decay * data_size), not both")
            weight_decay = check.positive("prior_prec", prior_prec) / check.data_size(data_size)
        weight_decay = 1e-4 if weight_decay is None else weight_decay
        defaults = dict(
            data_size=data_size,
            lr=lr,
            betas=betas,
            weight_decay=weight_decay,
            hess_init=hess_init,
            clip_radius=clip_radius,
            kl_clip=kl_clip,
            forget_start=forget_start,
        )
        super().__init__(params, defaults, mc_samples=mc_samples, curvature=curvature, **engine_kwargs)

    def _check_group(self, group):
        check.data_size(group["data_size"])
        check.nonnegative("lr", group["lr"])
        check.betas("betas", group["betas"])
        check.nonnegative("weight_decay", group["weight_decay"])
        check.positive("hess_init", group["hess_init"])
        check.positive("clip_radius", group["clip_radius"], allow_inf=True)
        check_kl_clip(group)
        check_forget_start(group)

    def _init_state(self, group, p, state):
        state["momentum"] = torch.zeros_like(p)
        state["hess"] = torch.full_like(p, float(group["hess_init"]))

    @staticmethod
    def _decay(group: dict[str, Any], states: list[dict[str, Any]]) -> Any:
        """δ = λ/N, or Λ₀/N per weight under a posterior prior (:mod:`.engine.posterior_prior`)."""
        n, delta = group["data_size"], group["weight_decay"]
        return pp.shifted(states, delta, 1 / n, delta * n)

    def _precision_core(self, group, states):
        return (
            F.shifted_precision,
            ([st["hess"] for st in states],),
            dict(shift=self._decay(group, states), scale=float(group["data_size"])),
        )

    def _update(self, group, means, grads, curvs, states):
        beta1, beta2 = group["betas"]
        # β₂, or 1 − ρₑ while h₀ is forgotten (ngvi.optim.forgetting)
        beta2 = start_decay(beta2, step_of(states), group, group["hess_init"], group["weight_decay"])
        decay = self._decay(group, states)
        return F.run_core(
            F.ivon_update_,
            means,
            pp.pulled(states, grads, decay),
            curvs,
            [st["momentum"] for st in states],
            [st["hess"] for st in states],
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            weight_decay=decay,
            bias1=F.bias_corrections(beta1, states),
            clip_radius=group["clip_radius"] if math.isfinite(group["clip_radius"]) else None,
            kl_clip=kl_clip_of(group),
            compile=self.compile,
        )
