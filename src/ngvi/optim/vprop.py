r"""Vprop: RMSprop with weight perturbation (Khan et al. 2018, eq. 14).

.. math::
    \theta &\sim \mathcal N(\mu,\ 1/[N(s + \tilde\lambda)]) \\
    s &\leftarrow (1-\beta)\,s + \beta\,\hat g^2 \\
    \mu &\leftarrow \mu - \alpha\,(\hat g + \tilde\lambda\mu) / (\sqrt{s} + \tilde\lambda)

``beta`` is the paper's step β, as in every ngvi optimizer (s ← (1−β)s + βĝ²). Its default 1 − 0.999 is the
decay 0.999 of the authors' code. (Up to ngvi 0.1 ``beta`` was that decay; a value above 0.5 now gets an
error that says so.)

**Which second moment divides the step** (``step_moment``, as for :class:`~ngvi.Vadam`). After t steps
s = (1−β)ᵗs₀ + v with v the EMA of ĝ² started at 0. Eq. 14 divides by √s: a start s₀ ≫ E[ĝ²] makes the
first hundreds of steps plain SGD steps of size α, and s₀ = 0 makes the first ones ~1/√β times too large
(RMSprop's start).

* ``"debiased"`` (default): the step divides by √(v/(1−(1−β)ᵗ)) + λ̃, the bias-corrected v (Adam's
  correction without momentum), and the sample uses the paper's s = (1−β)ᵗs₀ + v (the state keeps v; the
  precision is N(v + w·s₀) + λ with w = Π(1−β), as Vadam's). The fixed point is eq. 14's (the correction
  tends to 1).
* ``"paper"``: eq. 14 as written.

**Noise.** Vprop defaults to ``noise="antithetic"``: consecutive samples use ε and −ε. Without momentum,
a normalised step turns the gradient noise that the perturbation adds into a random walk of about α per
step; the pairs cancel it to first order (on the 8-32-1 toy of docs/CHOOSING.md the train MSE after 200
steps drops from 2.2–4.4× Adam's to 1.4–1.9×, with half the draws and one buffer more). The estimator of
each expectation stays unbiased, so the fixed point is eq. 14's; ``noise="normal"`` draws independently.
"""

from __future__ import annotations

from typing import Any

from .. import _validation as check
from ..curvature.estimators import CurvatureEstimator
from . import functional as F
from .engine import posterior_prior as pp
from .engine.optimizer import VariationalOptimizer
from .engine.prior import AUTO
from .forgetting import ForgetsStart
from .vadam import (
    STEP_MOMENTS,
    check_forget_start_of_moment,
    decay_start_,
    forgets_start,
    init_second_moment,
    prior_tilde,
    scheduled_moment,
    second_moment_precision,
)


class Vprop(ForgetsStart, VariationalOptimizer):
    """Variational RMSprop. Posterior precision 1/σ² = N·s + λ.

    Args:
        params: parameters or groups.
        data_size: N.
        lr: α.
        beta: β, the curvature step.
        prior_prec: λ.
        init_prec: precision of q at t=0 (``"auto"``: N + λ, s₀ = 1; ``None``: the prior's).
        mc_samples: posterior samples per step.
        step_moment: ``"debiased"`` (default) or ``"paper"``.
        curvature: the estimator of ĥ: ``"grad2"`` (ĝ², the paper's; the only one Vprop takes).
        forget_start: the early curvature step (:mod:`ngvi.optim.forgetting`): ``"auto"`` (default: 3·10⁻³
            until N·s₀ is 1% of λ, with ``init_prec="auto"``; else None), a number, or None (the constant β).
        **engine_kwargs: as for every ngvi optimizer (:class:`~ngvi.VariationalOptimizer`); ``noise``
            defaults to ``"antithetic"`` here.

    Raises:
        ValueError: a hyperparameter out of its range or of the wrong type; the message names it.
    """

    _takes_posterior_prior = True  # set_prior (:mod:`.engine.posterior_prior`)

    elementwise = True
    _curvature_state = "exp_avg_sq"  # what ``diagnostics()`` watches move (:mod:`.diagnostics`)
    curvatures = ("grad2",)  # the estimators of ĥ this rule accepts (:mod:`ngvi.curvature`)

    _default_noise = "antithetic"

    def __init__(
        self,
        params,
        data_size: int,
        lr: float = 1e-3,
        beta: float = 1 - 0.999,  # RMSprop's decay 0.999, as a step (bitwise the old default)
        prior_prec: float = 1.0,
        init_prec: float | str | None = AUTO,
        mc_samples: int = 1,
        *,
        step_moment: str = "debiased",
        curvature: str | CurvatureEstimator = "grad2",
        forget_start: float | str | None = AUTO,
        **engine_kwargs: Any,
    ):
        defaults = dict(
            data_size=data_size,
            lr=lr,
            beta=beta,
            prior_prec=prior_prec,
            init_prec=init_prec,
            step_moment=step_moment,
            forget_start=forget_start,
        )
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
        check.choice("step_moment", group["step_moment"], STEP_MOMENTS)
        check_forget_start_of_moment(group)

    def _init_state(self, group, p, state):
        init_second_moment(group, p, state)

    def _precision_core(self, group, states):
        return second_moment_precision(group, states)

    def _update(self, group, means, grads, curvs, states):
        debiased = group["step_moment"] == "debiased"
        decay = 1 - group["beta"]
        if forgets_start(group):
            decay, bias = scheduled_moment(decay, states, group)
        else:
            bias = F.bias_corrections(decay, states) if debiased else None
        tilde = prior_tilde(group, states)
        F.run_core(
            F.vprop_update_,
            means,
            pp.pulled(states, grads, tilde),
            curvs,
            [st["exp_avg_sq"] for st in states],
            lr=group["lr"],
            beta=1 - decay if forgets_start(group) else group["beta"],
            prior_tilde=tilde,
            bias=bias,
            compile=self.compile,
        )
        decay_start_(states, decay)
