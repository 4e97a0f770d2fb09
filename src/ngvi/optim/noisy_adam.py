r"""Noisy Adam: natural-gradient VI with a fully factorised Gaussian (Zhang et al. 2018, Alg. 1).

In minimisation form, with λ = ``kl_weight``, η = ``prior_var``, γ_in = λ/(Nη), γ = γ_in + γ_ex:

.. math::
    w &\sim \mathcal N\big(\mu,\ \tfrac{\lambda}{N}\,\mathrm{diag}(f + \gamma_{in})^{-1}\big) \\
    v &= \hat g + \gamma_{in}\,\mu \\
    m &\leftarrow \beta_1 m + (1-\beta_1)\,v \\
    f &\leftarrow \beta_2 f + (1-\beta_2)\,\hat g^2 \\
    \mu &\leftarrow \mu - \alpha\,\frac{m/(1-\beta_1^k)}{f + \gamma}

ĝ is the gradient of the mean negative log-likelihood (Alg. 1's −∇log p). Alg. 1 writes the prior term
as γ_in·w at the sample; its expectation under q is γ_in·μ, which we use: the same fixed point with less
variance.

**Start** (``init_prec``). Alg. 1 starts at f = 0, so q₀ is the prior (variance η, scaled by λ) and the first
steps are α·m̂/γ: with γ = λ/(Nη) ≈ 1/N these are N-fold Newton steps that diverge at α = 10⁻², while at
α = 10⁻³ the weights keep the prior's noise for ~1/(1−β₂) steps (docs/CHOOSING.md). The default
``init_prec="auto"`` starts at one unit of curvature per example, f₀ = 1 (q₀'s precision (N/λ)(1 + γ_in)),
so the first steps are SGD-with-momentum steps of size α with σ₀ ≈ 1/√N, and α = 0.1 (natural-gradient
units, as IVON's). ``init_prec=None`` is Alg. 1's start; a number c sets f₀ = λc/N − γ_in.

**Curvature** (``curvature=``). f estimates the diagonal of NNG's Fisher F = Cov(Dw) (eq. 8), Dw the gradient
of *one example's* log-likelihood; its diagonal form is eq. 11, f̄ ← (1 − β̃)f̄ + β̃ Dw².

* ``"grad2"`` (default): ĥ = ĝ², Alg. 1's line as written, with ĝ the minibatch-mean gradient. At batch
  size M its mean is ≈ diag(F)/M + ḡ², so the posterior is up to M times wider than eq. 8's
  (docs/results/uci-nng/README.md, "Why noisy Adam's yacht fit is off").
* ``"ef"``: ĥ = (1/M)Σᵢ (∇fᵢ)², the minibatch mean of eq. 11's Dw² with the data's targets (the empirical
  Fisher, footnote 1).
* ``"fisher"``: the same with targets drawn from the model's predictive (``likelihood=``), the true Fisher
  that NNG's experiments use (footnote 1).

The per-example forms read the model's layers through hooks, as VOGN does (:mod:`ngvi.curvature.layer`), so
they take the model instead of its parameters: ``NoisyAdam(model, N, curvature="ef")``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import _validation as check
from ..curvature.estimators import CurvatureEstimator
from ..curvature.layer import TARGETS, PerExampleGGN
from ..curvature.likelihoods import Likelihood
from . import _nng_prior as nng
from . import functional as F
from .engine import posterior_prior as pp
from .engine.optimizer import VariationalOptimizer
from .engine.prior import AUTO, check_kl_clip, kl_clip_of
from .forgetting import ForgetsStart, check_forget_start, step_of
from .forgetting import decay as start_decay


class NoisyAdam(ForgetsStart, VariationalOptimizer):
    """Noisy Adam (NNG-FFG). Posterior precision 1/σ² = (N/λ)(f + γ_in).

    Args:
        params: parameters or groups; the model (an nn.Module) for ``curvature="ef"`` or ``"fisher"``.
        data_size: N.
        lr: α.
        betas: (β₁, β₂).
        prior_var: η of the prior N(0, ηI) (default 1).
        kl_weight: λ (1 for the ELBO).
        damping: γ_ex.
        mc_samples: samples per step.
        init_prec: precision of q at t=0: ``"auto"`` (f₀ = 1), ``None`` (f₀ = 0, Alg. 1) or a number.
        prior_prec: 1/η, the name every ngvi optimizer accepts (give ``prior_var`` or this).
        curvature: ``"grad2"`` (Alg. 1: the squared minibatch gradient), ``"ef"`` (per-example squared
            gradients) or ``"fisher"`` (the same with sampled targets); see the module docstring.
        likelihood: as VOGN's, for the per-example forms only.
        noise_prec: as VOGN's, for the per-example forms only.
        loss_reduction: as VOGN's, for the per-example forms only.
        chunk_bytes: as VOGN's, for the per-example forms only.
        kl_clip: the trust region κ on the natural step: ``"auto"`` (10⁻² unless ``init_prec=None``), a
            number, or None (off).
        forget_start: the early curvature weight 1 − β₂ (:mod:`ngvi.optim.forgetting`): ``"auto"`` (3·10⁻³
            until f₀ is 1% of γ_in, with ``init_prec="auto"``; else None: Alg. 1's constant β₂), a number,
            or None.
        **engine_kwargs: the options of every ngvi optimizer: ``seed``, ``skip_nonfinite``,
            ``empirical_bayes`` and ``engine`` (an :class:`~ngvi.EngineOptions` or a dict: ``noise``,
            ``noise_dtype``, ``rank_noise``, ``compile``, ``fp32_state``, ``finite_check``, ``flat``):
            see :class:`~ngvi.VariationalOptimizer`.

    Raises:
        ValueError: a hyperparameter out of its range, or a trainable parameter outside the supported
            layers; the message names it.
    """

    _takes_posterior_prior = True  # set_prior (:mod:`.engine.posterior_prior`)

    elementwise = True
    _curvature_state = "fisher"  # what ``diagnostics()`` watches move (:mod:`.diagnostics`)
    curvatures = ("grad2", *TARGETS)  # the estimators of ĥ this rule accepts (:mod:`ngvi.curvature`)

    @classmethod
    def builds_from_model(cls, **options: Any) -> bool:
        """True for a per-example curvature (``curvature='ef'`` or ``'fisher'``), which hooks the model."""
        curvature = options.get("curvature", "grad2")
        return isinstance(curvature, str) and curvature in TARGETS

    def __init__(
        self,
        params,
        data_size: int,
        lr: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.999),
        prior_var: float | None = None,
        kl_weight: float = 1.0,
        damping: float = 0.0,
        mc_samples: int = 1,
        *,
        init_prec: float | str | None = AUTO,
        prior_prec: float | None = None,
        curvature: str | CurvatureEstimator = "grad2",
        likelihood: str | Likelihood | None = None,
        noise_prec: float = 1.0,
        loss_reduction: str = "mean",
        chunk_bytes: int = 64 * 2**20,
        kl_clip: float | str | None = AUTO,
        forget_start: float | str | None = AUTO,
        **engine_kwargs: Any,
    ):
        prior_var = check.prior_var(prior_var, prior_prec)
        if self.builds_from_model(curvature=curvature):
            why = f"for curvature={curvature!r} (per-example gradients from hooks on its layers)"
            check.model(params, "NoisyAdam", why)
            curvature = PerExampleGGN(
                params,
                curvature,
                likelihood=likelihood,
                noise_prec=noise_prec,
                loss_reduction=loss_reduction,
                chunk_bytes=chunk_bytes,
                owner="NoisyAdam",
            )
            params = curvature.parameters
            self.takes_model = True  # one group, the hooked model's: the engine refuses add_param_group
        elif isinstance(params, nn.Module):
            raise TypeError(
                "NoisyAdam takes model.parameters() unless curvature='ef' or 'fisher' (per-example "
                "curvature, which hooks the model's layers): pass one of those, or model.parameters()"
            )
        elif (likelihood, loss_reduction, chunk_bytes) != (None, "mean", 64 * 2**20):
            raise ValueError(
                "likelihood=, loss_reduction= and chunk_bytes= are options of the per-example curvature: "
                "pass curvature='ef' or 'fisher' with the model, or drop them"
            )
        defaults = dict(
            data_size=data_size,
            lr=lr,
            betas=betas,
            prior_var=prior_var,
            kl_weight=kl_weight,
            damping=damping,
            init_prec=init_prec,
            kl_clip=kl_clip,
            forget_start=forget_start,
        )
        super().__init__(params, defaults, mc_samples=mc_samples, curvature=curvature, **engine_kwargs)

    def _check_group(self, group):
        check.data_size(group["data_size"])
        check.nonnegative("lr", group["lr"])
        check.betas("betas", group["betas"])
        nng.check_prior(group)
        check_kl_clip(group)
        check_forget_start(group)

    @staticmethod
    def intrinsic_damping(group: dict[str, Any]) -> float:
        """γ_in = λ/(Nη)."""
        return nng.intrinsic_damping(group)

    @staticmethod
    def initial_fisher(group: dict[str, Any]) -> float:
        """f₀: 1 for ``init_prec="auto"``, 0 for ``None``, else λ·init_prec/N − γ_in (precision init_prec)."""
        return nng.initial_curvature(group)

    def _init_state(self, group, p, state):
        state["exp_avg"] = torch.zeros_like(p)
        state["fisher"] = torch.full_like(p, self.initial_fisher(group))

    def _gamma_in(self, group: dict[str, Any], states: list[dict[str, Any]]) -> Any:
        """γ_in = κ/(Nη), or κΛ₀/N per weight under a posterior prior (:mod:`.engine.posterior_prior`)."""
        scale = group["kl_weight"] / group["data_size"]
        return pp.shifted(states, self.intrinsic_damping(group), scale, 1 / group["prior_var"])

    def _precision_core(self, group, states):
        return (
            F.shifted_precision,
            ([st["fisher"] for st in states],),
            dict(shift=self._gamma_in(group, states), scale=group["data_size"] / group["kl_weight"]),
        )

    def _update(self, group, means, grads, curvs, states):
        beta1, beta2 = group["betas"]
        # β₂, or 1 − ρₑ while f₀ is forgotten (ngvi.optim.forgetting)
        start, prior = self.initial_fisher(group), self.intrinsic_damping(group)
        beta2 = start_decay(beta2, step_of(states), group, start, prior)
        gamma_in = self._gamma_in(group, states)
        return F.run_core(
            F.noisy_adam_update_,
            means,
            pp.pulled(states, grads, gamma_in),
            curvs,
            [st["exp_avg"] for st in states],
            [st["fisher"] for st in states],
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            gamma_in=gamma_in,
            damping=group["damping"],
            bias1=F.bias_corrections(beta1, states),
            kl_clip=kl_clip_of(group),
            compile=self.compile,
        )
