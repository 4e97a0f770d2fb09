r"""VON: the variational online-Newton method (Khan et al. 2018, eqs. 7–8 and App. D).

.. math::
    \theta &\sim \mathcal N(\mu,\ \sigma^2),\quad \sigma^2 = 1/[N(s + \tilde\lambda)] \\
    s &\leftarrow (1-\beta)\,s + \beta\,\hat h
        + \tfrac12\beta^2\,(\hat h - s)^2/(s + \tilde\lambda) \\
    \mu &\leftarrow \mu - \alpha\,(\hat g + \tilde\lambda\mu)/(s + \tilde\lambda)

Two diagonal Hessian estimators ĥ at the sample θ:

* ``curvature="price"``: the reparameterisation (Price/Stein) estimator of App. D.1, ĥ = ĝ⊙(θ−μ)/σ² = ĝ⊙ε/σ;
* ``curvature="hutchinson"``: ĥ = z⊙(∇²f z) with Rademacher z. The closure must then call
  ``loss.backward(create_graph=True)`` so that a Hessian-vector product can be taken. Each parameter group
  takes its own product z_g⊙(H_gg z_g), also an unbiased estimate of its diagonal.

**Positivity.** Both estimators can be negative, so plain ``(1−β)s + βĥ`` can drive the precision below
zero. We add the Riemannian-gradient correction term ½β²(ĥ−s)²/(s+λ̃) (Lin, Schmidt & Khan 2020, as used by
IVON). Writing P = s + λ̃ and d = ĥ − s, the new precision P + βd + β²d²/(2P) is a quadratic in d with
negative discriminant, so s + λ̃ stays positive for every ĥ — no back-tracking and no coupling across weights
(App. D.1's back-tracking would shrink β for *all* weights whenever one estimate is very negative). The
correction is O(β²), so the fixed point is that of eq. 8.

**Defaults** (docs/CHOOSING.md): q starts at one unit of curvature per example (``init_prec="auto"``,
s₀ = 1), so the first steps are SGD steps of size α with weight noise σ₀ ≈ 1/√N; α = 0.1 in these
natural-gradient units (IVON's default) and the natural momentum of eq. 18 (App. E) with γ = 0.5. The
paper's eqs. 7–8 alone are ``momentum=0``; its start at the prior is ``init_prec=None``.

**Trust region** (``kl_clip``, issue 32). s₀ = 1 assumes a unit-scale likelihood: with the loss mse/(2σ²) at
σ = 0.05 the first step α(ĝ + λ̃μ)/(s + λ̃) was ~400× a unit-scale one and the run left the data (the Price
estimate then turns s negative-going, and the Riemannian term holds it just above −λ̃, so the steps grow
further). The natural step is scaled by ν = min(1, √(κ/m)), m = α²Σ(ĝ + λ̃μ)²/(s + λ̃), its squared length
in the metric s + λ̃ (as the K-FAC family's ``kl_clip``); ``"auto"`` is κ = 10⁻² except with the papers'
start ``init_prec=None``. Exactly 1 where it does not bind (docs/CHOOSING.md has the grid).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _validation as check
from ..curvature.estimators import CurvatureEstimator, estimator_for
from . import functional as F
from .engine import posterior_prior as pp
from .engine.optimizer import VariationalOptimizer, initial_curvature
from .engine.prior import AUTO, check_kl_clip, kl_clip_of
from .forgetting import ForgetsStart, check_forget_start, start_of, step_of, update_weight


class VON(ForgetsStart, VariationalOptimizer):
    """Variational online-Newton with a Price or Hutchinson diagonal Hessian. Precision = N(s + λ̃).

    Args:
        params: parameters or groups.
        data_size: N.
        lr: α.
        beta: β, the curvature step.
        prior_prec: λ.
        init_prec: precision of q at t=0 (``"auto"``: N + λ, s₀ = 1; ``None``: the prior's).
        mc_samples: samples per step.
        curvature: ``"price"`` (default) or ``"hutchinson"`` (:mod:`ngvi.curvature.estimators`).
        momentum: γ of the natural momentum (eq. 18); 0 gives eqs. 7–8.
        kl_clip: the trust region κ on the natural step (:func:`ngvi.optim.functional.trust_region`):
            ``"auto"`` (10⁻² unless ``init_prec=None``), a number, or None (off).
        forget_start: the early curvature step (:mod:`ngvi.optim.forgetting`): None (default: the constant
            β of eq. 8, which forgets s₀ as e^{−βt}), ``"auto"`` (3·10⁻³ until N·s₀ is 1% of λ, with
            ``init_prec="auto"``), or a number.
        hessian: the old name of ``curvature`` (deprecated).
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
    #: the curvature estimators this rule accepts (the first is the default)
    curvatures: tuple[str, ...] = ("price", "hutchinson")

    def __init__(
        self,
        params,
        data_size: int,
        lr: float = 0.1,
        beta: float = 1e-3,
        prior_prec: float = 1.0,
        init_prec: float | str | None = AUTO,
        mc_samples: int = 1,
        curvature: str | CurvatureEstimator | None = None,
        *,
        momentum: float = 0.5,
        kl_clip: float | str | None = AUTO,
        forget_start: float | str | None = None,
        hessian: str | None = None,
        _extra_defaults: dict[str, Any] | None = None,
        **engine_kwargs: Any,
    ):
        curvature = check.renamed("hessian", hessian, "curvature", curvature, default=self.curvatures[0])
        estimator = estimator_for(
            curvature, self.curvatures, keyword="curvature" if hessian is None else "hessian"
        )
        defaults = dict(
            data_size=data_size,
            lr=lr,
            beta=beta,
            momentum=momentum,
            prior_prec=prior_prec,
            init_prec=init_prec,
            kl_clip=kl_clip,
            forget_start=forget_start,
        )
        defaults.update(_extra_defaults or {})
        super().__init__(params, defaults, mc_samples=mc_samples, curvature=estimator, **engine_kwargs)

    @property
    def hessian(self) -> str:
        """The curvature estimator's name (the old spelling of ``curvature``)."""
        return self.curvature_estimator.name

    def _check_group(self, group):
        check.prior_group(group)
        check.unit_interval("beta", group["beta"], closed_high=True)
        check.unit_interval("momentum", group["momentum"])
        check_kl_clip(group)
        check_forget_start(group)

    def _init_state(self, group, p, state):
        state["hess"] = initial_curvature(group, p)

    def _precision_core(self, group, states):
        return (
            F.shifted_precision,
            ([st["hess"] for st in states],),
            dict(shift=self._prior_tilde(group, states), scale=float(group["data_size"])),
        )

    def _update(self, group, means, grads, curvs, states):
        momentum = group["momentum"]
        tilde = self._prior_tilde(group, states)
        return F.run_core(
            F.von_update_,
            means,
            pp.pulled(states, grads, tilde),
            curvs,
            [st["hess"] for st in states],
            [self._momentum_buffer(st) for st in states] if momentum else None,  # μ_t − μ_{t−1}
            lr=group["lr"],
            beta=update_weight(group["beta"], step_of(states), group, *start_of(group)),
            prior_tilde=tilde,
            momentum=momentum,
            kl_clip=kl_clip_of(group),
            compile=self.compile,
        )

    @staticmethod
    def _prior_tilde(group: dict[str, Any], states: list[dict[str, Any]]) -> Any:
        """λ̃ = λ/N, or Λ₀/N per weight under a posterior prior (:mod:`.engine.posterior_prior`)."""
        n = group["data_size"]
        return pp.shifted(states, group["prior_prec"] / n, 1 / n, group["prior_prec"])

    @staticmethod
    def _momentum_buffer(state: dict[str, Any]) -> torch.Tensor:
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(state["hess"])
        return state["momentum_buffer"]
