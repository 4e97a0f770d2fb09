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
from ..curvature.hooks import CurvatureHooks
from ..curvature.kfac import damped_inverses, pi_split
from ..curvature.layer import KroneckerFactors
from ..curvature.likelihoods import Likelihood
from ..posterior import KroneckerBlock, KroneckerGaussian, join_block, split_block
from . import functional as F
from ._kfac_local import SAMPLINGS, LocalPreactivations
from .engine.optimizer import VariationalOptimizer
from .engine.prior import AUTO


class NoisyKFAC(VariationalOptimizer):
    """Noisy K-FAC (NNG-MVG) on a model's nn.Linear / nn.Conv2d (and LayerNorm / GroupNorm) layers.

    Args:
        model: the network; its trainable parameters must sit in nn.Linear, nn.Conv2d, nn.LayerNorm or
            nn.GroupNorm layers (for the normalisation layers each (wₖ, bₖ) pair gets its own 2×2 block).
        data_size: N.  lr: α.  beta: β, the factor EMA step.  momentum: heavy-ball on the natural step.
        prior_var: η of the prior N(0, ηI) (default 1).  kl_weight: λ (1 for the ELBO).  damping: γ_ex.
        init_prec: where q starts: ``"auto"`` (A₀ = S₀ = I), ``None`` (the prior, with the warm start) or a
            precision (see the module docstring).
        prior_prec: the prior's precision 1/η, the name every ngvi optimizer accepts (give one of the two).
        stats_every: T_stats.  inv_every: T_inv.  mc_samples: posterior samples per step.
        curvature: "ef" (the closure's own loss) or "fisher" (targets sampled from ``likelihood``).
        sampling: "auto" (default), "local" or "weights" (Alg. 2's shared weight draw): how a training
            sample draws the nn.Linear layers (see :mod:`ngvi.optim._kfac_local`).
        likelihood, noise_prec, loss_reduction, chunk_bytes: as for :class:`~ngvi.optim.vogn.VOGN`.
        **engine_kwargs: ``seed``, ``skip_nonfinite``.
    """

    takes_model = True
    curvatures = ("ef", "fisher")  # the K-FAC factors from the closure's or sampled targets

    def __init__(
        self,
        model: nn.Module,
        data_size: int,
        lr: float = 0.1,
        beta: float = 1e-3,
        momentum: float = 0.5,
        prior_var: float | None = None,
        kl_weight: float = 1.0,
        damping: float = 1e-3,
        stats_every: int = 1,
        inv_every: int = 20,
        mc_samples: int = 1,
        curvature: str = "ef",
        *,
        init_prec: float | str | None = AUTO,
        likelihood: str | Likelihood | None = None,
        prior_prec: float | None = None,
        noise_prec: float = 1.0,
        loss_reduction: str = "mean",
        chunk_bytes: int = 64 * 2**20,
        sampling: str = "auto",
        **engine_kwargs: Any,
    ):
        self.sampling = check.choice("sampling", sampling, SAMPLINGS)
        estimator = KroneckerFactors(
            model,
            curvature,
            likelihood=likelihood,
            noise_prec=noise_prec,
            loss_reduction=loss_reduction,
            chunk_bytes=chunk_bytes,
        )
        defaults = dict(
            data_size=data_size,
            lr=lr,
            beta=beta,
            momentum=momentum,
            prior_var=check.prior_var(prior_var, prior_prec),
            kl_weight=kl_weight,
            damping=damping,
            stats_every=stats_every,
            inv_every=inv_every,
            init_prec=init_prec,
        )
        self.local_sampling = LocalPreactivations(
            [] if sampling == "weights" else _local_layers(estimator), sampling
        )
        super().__init__(
            estimator.parameters,
            defaults,
            mc_samples=mc_samples,
            curvature=estimator,
            plugins=(self.local_sampling,),
            **engine_kwargs,
        )
        self.local_sampling.bind(self)

    @property
    def _hooks(self) -> CurvatureHooks:
        return self.curvature_estimator.hooks

    @property
    def _layer_of(self) -> dict[Tensor, int]:
        return self.curvature_estimator.layer_of

    def _check_group(self, group):
        check.data_size(group["data_size"])
        check.nonnegative("lr", group["lr"])
        check.unit_interval("beta", group["beta"], closed_low=False, closed_high=True)
        check.unit_interval("momentum", group["momentum"])
        check.positive("prior_var", group["prior_var"])
        check.positive("kl_weight", group["kl_weight"])
        check.nonnegative("damping", group["damping"])
        check.positive_int("stats_every", group["stats_every"])
        check.positive_int("inv_every", group["inv_every"])
        check.init_prec(group["init_prec"], 1.0 / group["prior_var"])

    @staticmethod
    def intrinsic_damping(group: dict[str, Any]) -> float:
        """γ_in = λ/(Nη)."""
        return group["kl_weight"] / (group["data_size"] * group["prior_var"])

    @classmethod
    def initial_factor_scale(cls, group: dict[str, Any]) -> float:
        """a of A₀ = S₀ = aI: 1 for ``init_prec="auto"``, 0 for ``None``, else √(λc/N − γ_in)."""
        init = group["init_prec"]
        if init is None:
            return 0.0
        if init == AUTO:
            return 1.0
        return math.sqrt(
            max(group["kl_weight"] * init / group["data_size"] - cls.intrinsic_damping(group), 0.0)
        )

    # ----------------------------------------------------------------------------------------------------
    # Layer layout: a layer's parameters as one [G, o, d'] block (weight columns, then the bias column)
    # ----------------------------------------------------------------------------------------------------
    def _block_dims(self, index: int) -> tuple[int, int, int]:
        layer = self._hooks.layers[index]
        groups, rows, cols = layer.kind.weight_block(layer.module)
        return groups, rows, (cols if layer.weight is not None else 0) + (layer.bias is not None)

    def _join(self, index: int, tensors: list[Tensor]) -> Tensor:
        groups, rows, _ = self._block_dims(index)
        return join_block(tensors, groups, rows)

    def _split(self, index: int, block: Tensor) -> list[Tensor]:
        groups, rows, _ = self._block_dims(index)
        return split_block(block, [p.shape for p in self._hooks.layers[index].params], groups, rows)

    def _positions(self, params: list[Tensor]) -> list[tuple[int, list[int]]]:
        """(layer, indices of its parameters in ``params``) for the layers present in ``params``."""
        where = {p: k for k, p in enumerate(params)}
        out = []
        for i, layer in enumerate(self._hooks.layers):
            ks = [where.get(p) for p in layer.params]
            if all(k is None for k in ks):
                continue
            if any(k is None for k in ks):
                raise RuntimeError(
                    f"NoisyKFAC updates the weight and bias of layer {layer.name!r} together, but only "
                    "some of them have a gradient or require grad"
                )
            out.append((i, ks))
        return out

    # ----------------------------------------------------------------------------------------------------
    # The rule
    # ----------------------------------------------------------------------------------------------------
    def _init_state(self, group, p, state):
        i = self._layer_of[p]
        if p is not self._hooks.layers[i].params[0]:
            return  # a layer's state lives with its first parameter
        groups, rows, cols = self._block_dims(i)
        scale = self.initial_factor_scale(group)
        state["factor_A"] = (
            torch.eye(cols, dtype=p.dtype, device=p.device).mul_(scale).expand(groups, -1, -1).clone()
        )
        state["factor_S"] = (
            torch.eye(rows, dtype=p.dtype, device=p.device).mul_(scale).expand(groups, -1, -1).clone()
        )
        state["factor_updates"] = 0
        state.update(self._inverses(group, state["factor_A"], state["factor_S"]))

    def _optional_state_shapes(self, p: Tensor) -> dict[str, tuple[int, ...]]:
        """The heavy-ball buffer of a layer is one [G, rows, cols] block, kept with its first parameter."""
        return {"momentum_buffer": self._block_dims(self._layer_of[p])}

    def _inverses(self, group: dict[str, Any], a: Tensor, s: Tensor) -> dict[str, Tensor]:
        """Sampling roots (damping γ_in) and update inverses (damping γ) of both factors, eq. (13)."""
        gamma_in = self.intrinsic_damping(group)
        root_in, root = math.sqrt(gamma_in), math.sqrt(gamma_in + group["damping"])
        pi = pi_split(a, s)
        a_root, a_inv = damped_inverses(a, pi * root_in, pi * root)
        s_root, s_inv = damped_inverses(s, root_in / pi, root / pi)
        return {"A_root": a_root, "A_inv": a_inv, "S_root": s_root, "S_inv": s_inv}

    def unsampled(self, p: Tensor, train: bool) -> bool:  # point estimates, and the locally sampled layers
        return super().unsampled(p, train) or (train and p in self.local_sampling.params)

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

    def _update(self, group, means, grads, curvs, states):
        params = self.accumulator.params(group)  # the engine's order of means/grads
        lr, beta, momentum = group["lr"], group["beta"], group["momentum"]
        gamma_in = self.intrinsic_damping(group)
        invert = self.num_steps % group["inv_every"] == 0
        pending = []  # computed for every layer first, committed after: an error leaves the state as it was
        for i, ks in self._positions(params):
            st = states[ks[0]]
            new: dict[str, Any] = {}
            a, s = st["factor_A"], st["factor_S"]
            if curvs is not None:
                count = st["factor_updates"] + 1
                weight = max(beta, 1.0 / count) if group["init_prec"] is None else beta  # warm start from 0
                flat = curvs[ks[0]]
                a_hat, s_hat = flat[: a.numel()].view_as(a), flat[a.numel() :].view_as(s)
                a, s = F.kfac_factor_ema(a, s, a_hat, s_hat, weight)  # (12)
                new.update(factor_A=a, factor_S=s, factor_updates=count)
            if invert:
                new.update(self._inverses(group, a, s))  # (13)
            a_inv, s_inv = new.get("A_inv", st["A_inv"]), new.get("S_inv", st["S_inv"])
            step = F.kfac_natural_step(  # S⁻¹ (ĝ + γ_in M) A⁻¹, plus heavy-ball momentum
                self._join(i, [grads[k] for k in ks]),
                self._join(i, [means[k] for k in ks]),
                a_inv,
                s_inv,
                gamma_in=gamma_in,
                momentum=momentum,
                buffer=st.get("momentum_buffer"),
            )
            if momentum:
                new["momentum_buffer"] = step
            pending.append((i, ks, st, new, step))
        for i, ks, st, new, step in pending:
            st.update(new)
            for k, part in zip(ks, self._split(i, step), strict=True):
                means[k].add_(part, alpha=-lr)

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


def _local_layers(estimator: KroneckerFactors) -> list[tuple[str, nn.Linear, Tensor]]:
    """The Linear layers with a trained weight, each with the parameter that carries its state."""
    return [
        (layer.name, layer.module, layer.weight)
        for layer in estimator.hooks.layers
        if isinstance(layer.module, nn.Linear) and layer.weight is not None
    ]
