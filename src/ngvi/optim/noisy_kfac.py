r"""Noisy K-FAC: NGVI with a matrix-variate Gaussian per layer (Zhang et al. 2018, §3.4, Alg. 2).

In minimisation form, with λ = ``kl_weight``, η = ``prior_var``, γ_in = λ/(Nη) (intrinsic damping, the
prior) and γ = γ_in + γ_ex (γ_ex = ``damping``), for each layer l with weights W (PyTorch's [out, in]
orientation, the bias appended as a last column so that W and b share one distribution):

.. math::
    W &\sim \mathcal{MN}\big(M,\ [S^{\gamma_{in}}]^{-1},\ \tfrac{\lambda}{N}[A^{\gamma_{in}}]^{-1}\big)
        && \text{(Alg. 2; rows ↔ S, columns ↔ A)} \\
    A &\leftarrow (1-\beta)A + \beta\,\hat A,\qquad S \leftarrow (1-\beta)S + \beta\,\hat S
        && (12)\ \text{every } T_{stats} \text{ steps} \\
    A^{\gamma} &= A + \pi\sqrt\gamma\,I,\qquad S^{\gamma} = S + \tfrac{\sqrt\gamma}{\pi} I
        && (13)\ \text{inverted every } T_{inv} \text{ steps} \\
    V &= \hat g + \gamma_{in} M,\qquad M \leftarrow M - \alpha\,[S^{\gamma}]^{-1} V [A^{\gamma}]^{-1}

so the covariance of vec(W) is (λ/N)[S^{γ_in} ⊗ A^{γ_in}]⁻¹ ≈ (λ/N)(S ⊗ A + γ_in I)⁻¹, the damped inverse
of N/λ times the Kronecker-factored Fisher — eq. (9) with the prior as damping. Â = E[āāᵀ] and
Ŝ = E[δδᵀ] come from the layer hooks of one forward/backward pass (:mod:`ngvi.curvature`; KFC factors for
Conv2d), with δ = ∂fᵢ/∂s the per-example pre-activation gradient: of the closure's own loss
(``curvature="ef"``), or of targets sampled from the model (``"fisher"``, the true Fisher of NNG's
experiments). ĝ is the gradient of the mean NLL; as in :mod:`.noisy_adam` the prior term uses μ (the mean
of Alg. 2's γ_in·W under q).

Choices the paper leaves open, and ours:

* **Start** (``init_prec``). The default ``"auto"`` starts both factors at the identity, A₀ = I, S₀ = I: one
  unit of curvature per example, as the diagonal rules' s₀ = 1, so q₀ has precision ≈ N/λ (σ₀ ≈ 1/√N) and
  the first steps are SGD steps of size α; the factors then follow eq. 12 with step β. ``init_prec=None``
  starts at A = S = 0, q₀ the prior N(0, η) (as noisy Adam's f = 0), with K-FAC's warm start (Martens &
  Grosse 2015): the factor EMAs use the weight max(β, 1/k) at their k-th update, a running mean until
  k = 1/β, so the first update is not taken with near-zero factors. (That start learns the posterior within
  ~1/β steps, and its broad early σ slows the mean: docs/CHOOSING.md.) A number c starts at A₀ = S₀ = aI
  with a² = λc/N − γ_in, i.e. q₀ with precision ≈ c.
* **Schedule.** Statistics at steps t with (t−1) mod T_stats = 0 and inverses at (t−1) mod T_inv = 0, i.e.
  at the first step and every T steps after (Alg. 2's k ≡ 0 would use uninverted factors until step T_inv).
  Between inversions, sampling and the update use the last inverses, as in Alg. 2.
* **Momentum** (Alg. 2 assumes none): heavy-ball on the preconditioned step, buf ← m·buf + S⁻¹VA⁻¹.
* **Sampling** (``sampling=``): Alg. 2 draws W once per step for the whole minibatch (``"weights"``). The
  default, ``"auto"``, samples the pre-activations of nn.Linear layers per example instead wherever that
  costs fewer operations (the local reparameterisation, :mod:`._kfac_local`): the same posterior and the same
  expected gradient, with a lower variance; ``"local"`` does so for every Linear layer.
* **Cost.** The two Cholesky-based inversions per factor are amortised over T_inv steps; the update's
  S⁻¹VA⁻¹ is two dense products per layer, o·d'(o + d') multiply-adds, every step: V holds the prior term
  γ_in·M, which is full rank, so the product cannot be shortened to the minibatch's rank. It is the
  largest term of a step for wide layers (``ngvi bench`` reports the step against this FLOP floor).

π per layer (and per group of a grouped conv) is √((tr A/dim A)/(tr S/dim S)); see :mod:`ngvi.curvature.kfac`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .. import _validation as check
from .._tensorlist import TensorList
from ..curvature.kfac import Factorisation, factorise, pi_split, roots_and_inverse
from ..curvature.layer import KroneckerFactors
from ..curvature.likelihoods import Likelihood
from ..posterior import KroneckerBlock, KroneckerGaussian
from .kronecker import DEFAULTS, KroneckerFamily


class NoisyKFAC(KroneckerFamily):
    """Noisy K-FAC (NNG-MVG) on a model's nn.Linear / nn.Conv2d (and LayerNorm / GroupNorm) layers.

    Args:
        model: the network; its trainable parameters must sit in nn.Linear, nn.Conv2d, nn.LayerNorm or
            nn.GroupNorm layers (for the normalisation layers each (wₖ, bₖ) pair gets its own 2×2 block).
        data_size: N.
        lr: α.
        beta: β, the factor EMA step.
        momentum: heavy-ball on the natural step.
        prior_var: η of the prior N(0, ηI) (default 1).
        kl_weight: λ (1 for the ELBO).
        damping: γ_ex.
        stats_every: T_stats.
        inv_every: T_inv.
        mc_samples: posterior samples per step.
        curvature: ``"ef"`` (the closure's own loss) or ``"fisher"`` (targets sampled from ``likelihood``).
        init_prec: where q starts: ``"auto"`` (A₀ = S₀ = I), ``None`` (the prior, with the warm start) or a
            precision (see the module docstring).
        kl_clip: the trust region κ on the natural step (:mod:`ngvi.optim.kronecker`): ``"auto"`` (10⁻²
            unless ``init_prec=None``), a number, or None (off).
        likelihood: as for :class:`~ngvi.optim.vogn.VOGN`.
        forget_start: ``None`` (default: the factors' constant β), or ``"auto"``/a number: an early factor
            weight (3·10⁻³) until the start F₀ is 1% of γ_in (:mod:`ngvi.optim.forgetting`, issue 44).
        prior_prec: the prior's precision 1/η, the name every ngvi optimizer accepts (give one of the two).
        noise_prec: as for :class:`~ngvi.optim.vogn.VOGN`.
        loss_reduction: as for :class:`~ngvi.optim.vogn.VOGN`.
        chunk_bytes: as for :class:`~ngvi.optim.vogn.VOGN`.
        sampling: ``"auto"`` (default), ``"local"`` or ``"weights"`` (Alg. 2's shared weight draw): how a
            training sample draws the nn.Linear layers (see :mod:`ngvi.optim._kfac_local`).
        **engine_kwargs: ``seed``, ``skip_nonfinite``, ``engine`` (:class:`~ngvi.EngineOptions`), ...

    The defaults are the family's (:mod:`ngvi.optim.kronecker`); Alg. 2 as written is ``lr=1e-3, beta=0.01,
    momentum=0, init_prec=None, sampling="weights"`` (what the golden trajectories and the UCI table use).

    Raises:
        ValueError: a hyperparameter out of its range, or a trainable parameter outside the supported
            layers; the message names it.
    """

    def __init__(
        self,
        model: nn.Module,
        data_size: int,
        lr: float = DEFAULTS["lr"],
        beta: float = DEFAULTS["beta"],
        momentum: float = DEFAULTS["momentum"],
        prior_var: float | None = None,
        kl_weight: float = 1.0,
        damping: float = DEFAULTS["damping"],
        stats_every: int = DEFAULTS["stats_every"],
        inv_every: int = DEFAULTS["inv_every"],
        mc_samples: int = 1,
        curvature: str = "ef",
        *,
        init_prec: float | str | None = DEFAULTS["init_prec"],
        kl_clip: float | str | None = DEFAULTS["kl_clip"],
        forget_start: float | str | None = None,
        likelihood: str | Likelihood | None = None,
        prior_prec: float | None = None,
        noise_prec: float = 1.0,
        loss_reduction: str = "mean",
        chunk_bytes: int = 64 * 2**20,
        sampling: str = "auto",
        **engine_kwargs: Any,
    ):
        estimator = KroneckerFactors(
            model,
            curvature,
            likelihood=likelihood,
            noise_prec=noise_prec,
            loss_reduction=loss_reduction,
            chunk_bytes=chunk_bytes,
        )
        hyper = dict(
            data_size=data_size, lr=lr, beta=beta, momentum=momentum,
            prior_var=check.prior_var(prior_var, prior_prec), kl_weight=kl_weight, damping=damping,
            stats_every=stats_every, inv_every=inv_every, init_prec=init_prec, kl_clip=kl_clip,
            forget_start=forget_start,
        )  # fmt: skip
        super().__init__(estimator, hyper, mc_samples=mc_samples, sampling=sampling, **engine_kwargs)

    # ----------------------------------------------------------------------------------------------------
    # The rule: the family's K-FAC step (:mod:`.kronecker`); here the sampling roots and the noise
    # ----------------------------------------------------------------------------------------------------
    def _factorisations(self, group: dict[str, Any], a: Tensor, s: Tensor) -> list[Factorisation]:
        """Eq. (13)'s factorisations of both factors: damping γ_in (the sampling roots) and γ (the update)."""
        gamma_in = self.intrinsic_damping(group)
        root_in, root = math.sqrt(gamma_in), math.sqrt(gamma_in + group["damping"])
        pi = pi_split(a, s)
        return [factorise(a, pi * root_in, pi * root), factorise(s, root_in / pi, root / pi)]

    def _inverses_from(self, group, factorisations, ok):
        """Sampling roots and update inverses of both factors."""
        (a_root, a_inv), (s_root, s_inv) = (roots_and_inverse(f, ok) for f in factorisations)
        return {"A_root": a_root, "A_inv": a_inv, "S_root": s_root, "S_inv": s_inv}

    def _perturb(self, group, params, noise, states):
        """W ← M + √(λ/N) B_S E B_Aᵀ for the layers in ``params`` (found by their states: the layers the
        local sampling draws itself are not among them)."""
        scale = math.sqrt(group["kl_weight"] / group["data_size"])
        where = {id(st): k for k, st in enumerate(states)}  # batch norm and locally sampled layers absent
        for i, layer in enumerate(self._hooks.layers):
            ks = [where.get(id(self.state[p])) for p in layer.params]
            if any(k is None for k in ks):
                continue
            st = states[ks[0]]
            eps = self._join(i, [noise[k] for k in ks])
            draw = (st["S_root"] @ eps @ st["A_root"].mT).mul_(scale)  # rows ~ S⁻¹, columns ~ (λ/N) A⁻¹
            for k, part in zip(ks, self._split(i, draw), strict=True):
                params[k].add_(part)

    def _precision(self, group, states):
        """Marginal precisions 1/(U_ii V_jj) (the sampling uses the full Kronecker structure)."""
        out: list[Tensor | None] = [None] * len(states)
        scale = group["kl_weight"] / group["data_size"]
        for i, ks in self._positions(self.trainable(group)):
            st = states[ks[0]]
            var = st["S_root"].square().sum(-1)[:, :, None] * st["A_root"].square().sum(-1)[:, None] * scale
            for k, part in zip(ks, self._split(i, var), strict=True):
                out[k] = part.reciprocal()
        return TensorList(out)

    # ----------------------------------------------------------------------------------------------------
    # The posterior
    # ----------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def posterior(self) -> KroneckerGaussian:
        """A snapshot of q: per layer vec(W) ~ N(vec(M), [S^γin]⁻¹ ⊗ (λ/N)[A^γin]⁻¹), in parameter order;
        batch-norm parameters are point estimates (``point``)."""
        group = self.param_groups[0]
        params = self.trainable(group)
        states = [self.state_of(group, p) for p in params]
        scale = group["kl_weight"] / group["data_size"]
        blocks, point = [], [k for k, p in enumerate(params) if self.point_estimate(p)]
        for _, ks in self._positions(params):
            if ks[0] in point:
                continue  # batch norm: point estimates, updated by the mean step only
            st = states[ks[0]]
            s_root, a_root = st["S_root"].double(), st["A_root"].double()  # BBᵀ in float64 stays PD
            row_cov = s_root @ s_root.mT
            col_cov = (a_root @ a_root.mT).mul_(scale)
            blocks.append(KroneckerBlock(tuple(ks), row_cov, col_cov))
        return KroneckerGaussian([self.mean_of(p) for p in params], blocks, point=point)
