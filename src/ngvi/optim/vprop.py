r"""Vprop: RMSprop with weight perturbation (Khan et al. 2018, eq. 14).

.. math::
    \theta &\sim \mathcal N(\mu,\ 1/[N(s + \tilde\lambda)]) \\
    s &\leftarrow (1-\beta)\,s + \beta\,\hat g^2 \\
    \mu &\leftarrow \mu - \alpha\,(\hat g + \tilde\lambda\mu) / (\sqrt{s} + \tilde\lambda)

Here the keyword ``beta`` is the EMA *decay* (RMSprop's α, Adam's γ₂), i.e. the paper's step β_t is
``1 - beta``; the default 0.999 matches the authors' code.
"""

from __future__ import annotations

from typing import Any

from .._tensorlist import TensorList
from . import _validation as check
from . import functional as F
from .base import VariationalOptimizer, initial_curvature


class Vprop(VariationalOptimizer):
    """Variational RMSprop. Posterior precision 1/σ² = N·s + λ."""

    elementwise = True

    def __init__(
        self,
        params,
        data_size: int,
        lr: float = 1e-3,
        beta: float = 0.999,
        prior_prec: float = 1.0,
        init_prec: float | None = None,
        mc_samples: int = 1,
        **engine_kwargs: Any,
    ):
        defaults = dict(data_size=data_size, lr=lr, beta=beta, prior_prec=prior_prec, init_prec=init_prec)
        super().__init__(params, defaults, mc_samples=mc_samples, **engine_kwargs)

    def _check_group(self, group):
        check.prior_group(group)
        check.unit_interval("beta", group["beta"])

    def _init_state(self, group, p, state):
        state["exp_avg_sq"] = initial_curvature(group, p)

    def _precision(self, group, states):
        core, lists, hyper = self._precision_core(group, states)
        return TensorList(core(*lists, **hyper))

    def _precision_core(self, group, states):
        """The precision as (core, state lists, hyperparameters), so the engine can run it fused with the
        draw's square root and reciprocal: ``functional.run_core(functional.diagonal_sigma, *lists,
        precision=core, compile=self.compile, **hyper)``."""
        return (
            F.scaled_precision,
            ([st["exp_avg_sq"] for st in states],),
            dict(scale=float(group["data_size"]), shift=group["prior_prec"]),
        )

    def _curvature(self, group, grads, noise, states):
        return grads.square()

    def _update(self, group, means, grads, curvs, states):
        F.run_core(
            F.vprop_update_,
            means,
            grads,
            curvs,
            [st["exp_avg_sq"] for st in states],
            lr=group["lr"],
            beta=group["beta"],  # the EMA decay: the paper's step β_t is 1 − beta
            prior_tilde=group["prior_prec"] / group["data_size"],
            compile=self.compile,
        )
