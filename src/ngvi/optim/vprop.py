r"""Vprop: RMSprop with weight perturbation (Khan et al. 2018, eq. 14).

.. math::
    \theta &\sim \mathcal N(\mu,\ 1/[N(s + \tilde\lambda)]) \\
    s &\leftarrow (1-\beta)\,s + \beta\,\hat g^2 \\
    \mu &\leftarrow \mu - \alpha\,(\hat g + \tilde\lambda\mu) / (\sqrt{s} + \tilde\lambda)

``beta`` is the paper's step β, as in every ngvi optimizer (s ← (1−β)s + βĝ²). Its default 1 − 0.999 is the
decay 0.999 of the authors' code. (Up to ngvi 0.1 ``beta`` was that decay; a value above 0.5 now gets an
error that says so.)
"""

from __future__ import annotations

from typing import Any

from .. import _validation as check
from ..curvature.estimators import CurvatureEstimator
from . import functional as F
from .base import VariationalOptimizer, initial_curvature


class Vprop(VariationalOptimizer):
    """Variational RMSprop. Posterior precision 1/σ² = N·s + λ."""

    elementwise = True
    curvatures = ("grad2",)  # the estimators of ĥ this rule accepts (:mod:`ngvi.curvature`)

    def __init__(
        self,
        params,
        data_size: int,
        lr: float = 1e-3,
        beta: float = 1 - 0.999,  # RMSprop's decay 0.999, as a step (bitwise the old default)
        prior_prec: float = 1.0,
        init_prec: float | None = None,
        mc_samples: int = 1,
        *,
        curvature: str | CurvatureEstimator = "grad2",
        **engine_kwargs: Any,
    ):
        defaults = dict(data_size=data_size, lr=lr, beta=beta, prior_prec=prior_prec, init_prec=init_prec)
        super().__init__(params, defaults, mc_samples=mc_samples, curvature=curvature, **engine_kwargs)

    def _check_group(self, group):
        check.prior_group(group)
        check.unit_interval("beta", group["beta"], closed_low=False, closed_high=True)
        if group["beta"] > 0.5:
            raise ValueError(
                f"Vprop's beta is the curvature step β of the paper (s ← (1−β)s + βĝ², e.g. 0.001), as in "
                f"every ngvi optimizer; got {group['beta']!r}, which looks like an EMA decay (ngvi 0.1 took "
                f"the decay here): pass beta={1 - group['beta']:.3g}"
            )

    def _init_state(self, group, p, state):
        state["exp_avg_sq"] = initial_curvature(group, p)

    def _precision_core(self, group, states):
        return (
            F.scaled_precision,
            ([st["exp_avg_sq"] for st in states],),
            dict(scale=float(group["data_size"]), shift=group["prior_prec"]),
        )

    def _update(self, group, means, grads, curvs, states):
        F.run_core(
            F.vprop_update_,
            means,
            grads,
            curvs,
            [st["exp_avg_sq"] for st in states],
            lr=group["lr"],
            beta=group["beta"],
            prior_tilde=group["prior_prec"] / group["data_size"],
            compile=self.compile,
        )
