r"""Vadam: Adam with weight perturbation (Khan et al. 2018, Fig. 1 and App. E, eqs. 88–93).

.. math::
    \theta &\sim \mathcal N(\mu,\ 1/[N(s + \tilde\lambda)])          && (88)\ \text{uses the uncorrected } s\\
    u &\leftarrow \gamma_1 u + (1-\gamma_1)(\hat g + \tilde\lambda\mu) && (89)\\
    s &\leftarrow \gamma_2 s + (1-\gamma_2)\,\hat g^2                  && (90)\\
    \hat u &= u/(1-\gamma_1^t),\quad \hat s = s/(1-\gamma_2^t)         && (91, 92)\\
    \mu &\leftarrow \mu - \alpha\,\hat u / (\sqrt{\hat s} + \tilde\lambda) && (93)

with λ̃ = λ/N. With several MC samples ĝ is their mean gradient and ĝ² the mean of their squares (as in the
authors' code). ``betas`` = (γ₁, γ₂) as in Adam.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _validation as check
from ..curvature.estimators import CurvatureEstimator
from . import functional as F
from .base import VariationalOptimizer, initial_curvature


class Vadam(VariationalOptimizer):
    """Variational Adam. Posterior precision 1/σ² = N·s + λ.

    Args:
        params: parameters or groups.
        data_size: N, the number of training examples (the closure returns a mean over a minibatch).
        lr: α.  betas: (γ₁, γ₂).  prior_prec: λ of the prior N(0, I/λ).
        init_prec: precision of q at t=0 (s₀ = (init_prec − λ)/N); None means init_prec = λ (q₀ = prior).
        mc_samples: posterior samples per step.
    """

    elementwise = True
    curvatures = ("grad2",)  # the estimators of ĥ this rule accepts (:mod:`ngvi.curvature`)

    def __init__(
        self,
        params,
        data_size: int,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        prior_prec: float = 1.0,
        init_prec: float | None = None,
        mc_samples: int = 1,
        *,
        curvature: str | CurvatureEstimator = "grad2",
        **engine_kwargs: Any,
    ):
        defaults = dict(data_size=data_size, lr=lr, betas=betas, prior_prec=prior_prec, init_prec=init_prec)
        super().__init__(params, defaults, mc_samples=mc_samples, curvature=curvature, **engine_kwargs)

    def _check_group(self, group):
        check.prior_group(group)
        check.betas("betas", group["betas"])

    def _init_state(self, group, p, state):
        state["exp_avg"] = torch.zeros_like(p)
        state["exp_avg_sq"] = initial_curvature(group, p)

    def _precision_core(self, group, states):
        return (
            F.scaled_precision,
            ([st["exp_avg_sq"] for st in states],),
            dict(scale=float(group["data_size"]), shift=group["prior_prec"]),
        )

    def _update(self, group, means, grads, curvs, states):
        beta1, beta2 = group["betas"]
        F.run_core(
            F.vadam_update_,
            means,
            grads,
            curvs,
            [st["exp_avg"] for st in states],
            [st["exp_avg_sq"] for st in states],
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            prior_tilde=group["prior_prec"] / group["data_size"],
            bias1=F.bias_corrections(beta1, states),
            bias2=F.bias_corrections(beta2, states),
            compile=self.compile,
        )
