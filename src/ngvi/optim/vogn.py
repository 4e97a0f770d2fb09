r"""VOGN: variational online Gauss-Newton (Khan et al. 2018, eqs. 9–10), with natural momentum (App. E).

VOGN is VON with the Gauss-Newton curvature, the mean of squared **per-example** gradients:

.. math::
    \theta &\sim \mathcal N(\mu,\ \sigma^2),\quad \sigma^2 = 1/[N(s + \tilde\lambda)],
        \quad \tilde\lambda=\lambda/N \\
    \hat h &= \tfrac1M \textstyle\sum_{i\in\mathcal M} (\nabla f_i(\theta))^2                       && (9)\\
    s &\leftarrow (1-\beta)\,s + \beta\,\hat h                                                     && (10)\\
    \mu &\leftarrow \mu - \alpha\,(\hat g + \tilde\lambda\mu)/(s + \tilde\lambda)                  && (7)

ĥ ≥ 0, so s stays non-negative without VON's Riemannian correction, and eq. 10 is used as written.
s₀ = (init_prec − λ)/N, 1 for ``init_prec="auto"`` (the default, as VON's) and 0 for ``init_prec=None`` (q₀
is the prior). The defaults (α = 0.1, γ = 0.5, s₀ = 1) are VON's; the paper's plain rule is ``momentum=0``.

The per-example gradients come from hooks on the model's layers (nn.Linear, nn.Conv2d, nn.LayerNorm,
nn.GroupNorm) during the ordinary backward pass (:mod:`ngvi.curvature`): for a Linear layer
Σᵢ gᵢ² = (δ²)ᵀ(a²), one extra matrix product.

* ``curvature="ef"``: gᵢ = ∇fᵢ for the closure's own targets (the empirical Fisher, eq. 9 as written).
* ``curvature="fisher"``: gᵢ = ∇ of −log p(ỹᵢ | xᵢ, θ) with ỹᵢ drawn from the model's predictive
  (``likelihood=``); E_ỹ[ĥ] is the diagonal of the generalised Gauss-Newton matrix for these likelihoods.
  The closure calls ``opt.backward(loss, output)`` or returns ``(loss, output)`` without calling backward
  (see :mod:`ngvi.curvature.layer`).

**Natural momentum** (App. E, eqs. 82–83 with the diagonal Gauss-Newton curvature; γ = ``momentum``):

.. math::
    s_{t+1} &= (1-\beta)\,s_t + \beta\,\hat h \\
    \mu_{t+1} &= \mu_t - \alpha\,\frac{\hat g + \tilde\lambda\mu_t}{s_{t+1} + \tilde\lambda}
              + \gamma\,\frac{s_t + \tilde\lambda}{s_{t+1} + \tilde\lambda}\,(\mu_t - \mu_{t-1})

i.e. heavy-ball momentum in which the previous step is re-weighted from the old to the new precision (the
KL-divergence proximity term of eq. 68 instead of a Euclidean one). α and β here are the paper's step sizes
ᾱ = β_t/(1−α_t) and γ = α_t/(1−α_t) of eq. 82; ``momentum=0`` is plain VOGN. The buffer holds μ_t − μ_{t−1}.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .. import _validation as check
from .._tensorlist import TensorList
from ..curvature.layer import PerExampleGGN
from ..curvature.likelihoods import Likelihood
from . import functional as F
from .engine import posterior_prior as pp
from .engine.prior import AUTO, kl_clip_of
from .forgetting import start_of, step_of, update_weight
from .von import VON


class VOGN(VON):
    """Variational online Gauss-Newton on a model's supported layers: VON's rule with the per-example
    Gauss-Newton estimator (:class:`ngvi.curvature.layer.PerExampleGGN`). Precision = N(s + λ̃).

    Args:
        model: the network; its trainable parameters must sit in nn.Linear, nn.Conv2d, nn.LayerNorm or
            nn.GroupNorm layers (others get a ValueError naming them).
        data_size: N.
        lr: α.
        beta: β ∈ (0, 1], the curvature step.
        momentum: γ of the natural momentum.
        prior_prec: λ.
        init_prec: precision of q at t=0 (``"auto"``: N + λ, s₀ = 1; ``None``: the prior's).
        mc_samples: samples per step.
        curvature: ``"ef"`` (per-example gradients of the closure's loss) or ``"fisher"`` (sampled targets).
        likelihood: ``"gaussian"``, ``"bernoulli"``, ``"categorical"`` or a
            :class:`ngvi.curvature.Likelihood` (``"fisher"`` only).
        noise_prec: τ of the ``"gaussian"`` likelihood.
        loss_reduction: ``"mean"`` (the closure returns (1/M)Σᵢfᵢ) or ``"sum"`` (Σᵢfᵢ; ĝ is then divided
            by M).
        chunk_bytes: memory bound for per-example gradients of conv layers and layers used twice.
        kl_clip: the trust region κ on the natural step: ``"auto"`` (10⁻² unless ``init_prec=None``), a
            number, or None (off); as VON's.
        forget_start: the early curvature step, as VON's (:mod:`ngvi.optim.forgetting`).
        **engine_kwargs: the options of every ngvi optimizer: ``seed``, ``skip_nonfinite``,
            ``empirical_bayes`` and ``engine`` (an :class:`~ngvi.EngineOptions` or a dict: ``noise``,
            ``noise_dtype``, ``rank_noise``, ``compile``, ``fp32_state``, ``finite_check``, ``flat``):
            see :class:`~ngvi.VariationalOptimizer`.

    Raises:
        ValueError: a hyperparameter out of its range, or a trainable parameter outside the supported
            layers; the message names it.
    """

    elementwise = True  # the update acts weight by weight: flat buckets (ngvi.optim.engine.flat)
    curvatures = ("ef", "fisher")
    takes_model = True
    _transient = (*VON._transient, "_scratch")

    def __init__(
        self,
        model: nn.Module,
        data_size: int,
        lr: float = 0.1,
        beta: float = 1e-3,
        momentum: float = 0.5,
        prior_prec: float = 1.0,
        init_prec: float | str | None = AUTO,
        mc_samples: int = 1,
        curvature: str = "ef",
        *,
        likelihood: str | Likelihood | None = None,
        noise_prec: float = 1.0,
        loss_reduction: str = "mean",
        chunk_bytes: int = 64 * 2**20,
        kl_clip: float | str | None = AUTO,
        forget_start: float | str | None = None,
        **engine_kwargs: Any,
    ):
        estimator = PerExampleGGN(
            model,
            curvature,
            likelihood=likelihood,
            noise_prec=noise_prec,
            loss_reduction=loss_reduction,
            chunk_bytes=chunk_bytes,
        )
        super().__init__(
            estimator.parameters,
            data_size,
            lr,
            beta,
            prior_prec,
            init_prec,
            mc_samples,
            estimator,
            momentum=momentum,
            kl_clip=kl_clip,
            forget_start=forget_start,
            **engine_kwargs,
        )

    def _init_transient(self) -> None:
        super()._init_transient()
        # One scratch tensor per state tensor, reused every step: on CPU, freshly allocated temporaries cost
        # more than the arithmetic done in them (page faults on first touch).
        self._scratch: dict[torch.Tensor, torch.Tensor] = {}

    def _scratch_for(self, states: list[dict[str, Any]]) -> list[torch.Tensor]:
        """A buffer shaped like each state's s (float32 for a bfloat16 parameter with fp32_state): kept for a
        parameter's own tensor, new for a view (a bucket's chunk, made afresh at each call)."""
        out = []
        for st in states:
            hess = st["hess"]
            if hess._base is not None:
                out.append(torch.empty_like(hess))
                continue
            buf = self._scratch.get(hess)
            if buf is None:
                buf = self._scratch[hess] = torch.empty_like(hess, memory_format=torch.preserve_format)
            out.append(buf)
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._scratch.clear()  # keyed by the replaced state tensors

    def _inv_std(self, group, states) -> list[torch.Tensor]:
        """1/√(s + λ̃) of each state: σ = that/√N."""
        inv_std = self._scratch_for(states)
        tilde = self._prior_tilde(group, states)
        tildes = tilde if pp.has_prior(states) else [tilde] * len(states)
        for buf, st, t in zip(inv_std, states, tildes, strict=True):
            torch.add(st["hess"], t, out=buf)
        torch._foreach_rsqrt_(inv_std)
        return inv_std

    def _perturb(self, group, params, noise, states):
        # θ = μ + ε/√(N(s + λ̃)), the engine's draw, in three in-place passes over the weights.
        torch._foreach_addcmul_(
            params.tensors, noise.tensors, self._inv_std(group, states), 1.0 / math.sqrt(group["data_size"])
        )

    def _draw_factors(self, group, states):
        # the flat draw as _perturb's: μ + (1/√N)·ε⊙(s + λ̃)^(−1/2)
        return None, TensorList(self._inv_std(group, states)), 1.0 / math.sqrt(group["data_size"])

    def _check_group(self, group):
        # β = 0 would keep s at its start forever: the Gauss-Newton estimate would never reach q
        check.unit_interval("beta", group["beta"], closed_low=False, closed_high=True)
        super()._check_group(group)

    def _update(self, group, means, grads, curvs, states):
        # ``curvs`` is the engine's temporary for this step; once s has absorbed it, it holds s + λ̃.
        momentum = group["momentum"]
        tilde = self._prior_tilde(group, states)
        return F.run_core(
            F.vogn_update_,
            means,
            pp.pulled(states, grads, tilde),
            curvs,
            [st["hess"] for st in states],
            self._scratch_for(states),
            [self._momentum_buffer(st) for st in states] if momentum else None,  # μ_t − μ_{t−1}
            lr=group["lr"],
            beta=update_weight(group["beta"], step_of(states), group, *start_of(group)),
            momentum=momentum,
            prior_tilde=tilde,
            kl_clip=kl_clip_of(group),
            compile=self.compile,
        )
