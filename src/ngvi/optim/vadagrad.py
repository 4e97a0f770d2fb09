r"""VadaGrad: variational optimisation with an AdaGrad-like rule (Khan et al. 2018, App. F, eq. 96).

.. math::
    \theta &\sim \mathcal N(\mu,\ 1/s) \\
    s &\leftarrow s + \beta\,\hat g^2 \\
    \mu &\leftarrow \mu - \alpha\,\hat g / \sqrt{s}

There is no prior and no data size: VadaGrad minimises E_q[F(θ)] (τ = 0 in eq. 22), so s only grows and
q contracts towards a point mass at a minimum of F. ``init_prec`` is s₀.

The step is α·ĝ/√s with s ≥ s₀, so α is in units of σ₀ = 1/√s₀: with the default s₀ = 10⁴ (σ₀ = 0.01, the
paper's RL setting, App. K) the first steps are SGD steps of size α/100, and the default α = 10 makes them
SGD's 0.1 (at α = 10⁻² VadaGrad does not move on a small regression in 200 steps: docs/CHOOSING.md).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _validation as check
from ..curvature.estimators import CurvatureEstimator
from . import functional as F
from .engine.optimizer import VariationalOptimizer
from .engine.prior import AUTO, check_kl_clip, kl_clip_of


class VadaGrad(VariationalOptimizer):
    """Variational AdaGrad. Search-distribution precision 1/σ² = s.

    Args:
        params: parameters or groups.
        lr: α (the first steps are SGD steps of α/√init_prec).
        beta: β, the weight of ĝ² in the running sum (not an EMA step: s only grows).
        init_prec: s₀.
        mc_samples: samples per step.
        data_size: accepted for the shared vocabulary; VadaGrad does not scale by N.
        prior_prec: accepted for the shared vocabulary; VadaGrad has no prior, so it must be 0.
        curvature: the estimator of ĥ (``"grad2"``: ĝ², the only one VadaGrad takes).
        kl_clip: the trust region κ (``"auto"``: 10⁻², a number, or None for none): the step is scaled so
            that ΣΔ²√(s/s₀) ≤ κ, so the first step is ‖Δμ‖ ≤ √κ = 0.1 whatever the loss's scale.
        **engine_kwargs: the options of every ngvi optimizer: ``seed``, ``skip_nonfinite``,
            ``empirical_bayes`` and ``engine`` (an :class:`~ngvi.EngineOptions` or a dict):
            see :class:`~ngvi.VariationalOptimizer`.

    Raises:
        ValueError: a hyperparameter out of its range (``prior_prec`` other than 0 included); the message
            names it.
    """

    elementwise = True
    _curvature_state = "sum_sq"  # what ``diagnostics()`` watches move (:mod:`.diagnostics`)
    curvatures = ("grad2",)  # the estimators of ĥ this rule accepts (:mod:`ngvi.curvature`)

    def __init__(
        self,
        params,
        lr: float = 10.0,
        beta: float = 0.01,
        init_prec: float = 1e4,
        mc_samples: int = 1,
        *,
        data_size: int | None = None,
        prior_prec: float = 0.0,
        curvature: str | CurvatureEstimator = "grad2",
        kl_clip: float | str | None = AUTO,
        **engine_kwargs: Any,
    ):
        if prior_prec != 0:
            raise ValueError(
                f"VadaGrad minimises E_q[F(θ)] without a prior (App. F), so prior_prec must be 0, got "
                f"{prior_prec!r}; for a posterior under a Gaussian prior use ngvi.Vadam"
            )
        self.data_size = None if data_size is None else check.data_size(data_size)  # not used by the rule
        defaults = dict(lr=lr, beta=beta, init_prec=init_prec, kl_clip=kl_clip)
        super().__init__(params, defaults, mc_samples=mc_samples, curvature=curvature, **engine_kwargs)

    def _check_group(self, group):
        check.nonnegative("lr", group["lr"])
        check.nonnegative("beta", group["beta"])
        check.positive("init_prec", group["init_prec"])
        check_kl_clip(group)

    def _init_state(self, group, p, state):
        state["sum_sq"] = torch.full_like(p, float(group["init_prec"]))

    def _precision_core(self, group, states):
        return F.identity_precision, ([st["sum_sq"] for st in states],), dict()

    def _update(self, group, means, grads, curvs, states):
        return F.run_core(
            F.vadagrad_update_,
            means,
            grads,
            curvs,
            [st["sum_sq"] for st in states],
            lr=group["lr"],
            beta=group["beta"],
            init_prec=float(group["init_prec"]),
            kl_clip=kl_clip_of(group),
            compile=self.compile,
        )
