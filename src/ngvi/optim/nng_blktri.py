r"""NNG-BlkTri: noisy K-FAC with a block-tridiagonal posterior (Zhang et al. 2018, §3.5).

NNG §3.5 replaces noisy K-FAC's block-diagonal Fisher by Martens & Grosse's block-tridiagonal approximation
(K-FAC 2015, §4.3; :mod:`ngvi.curvature.tridiagonal`): the F̂ that matches the Kronecker-factored Fisher F̃
on each layer's block and on the blocks between adjacent layers, and whose inverse is block tridiagonal.
With λ = ``kl_weight``, η = ``prior_var``, γ_in = λ/(Nη), γ = γ_in + γ_ex (``damping``), everything else as
in :class:`~ngvi.NoisyKFAC` (Alg. 2):

.. math::
    A_{i,j} &\leftarrow (1-\beta)A_{i,j} + \beta\hat A_{i,j},\quad
    S_{i,j} \leftarrow (1-\beta)S_{i,j} + \beta\hat S_{i,j}\qquad (j \in \{i, i+1\};\ \text{eq. 12})\\
    w &\sim \mathcal N\big(\mu,\ \tfrac{\lambda}{N}\hat F_{\gamma_{in}}^{-1}\big),\qquad
    \hat F_{\gamma_{in}}^{-1} = \Xi^\top\Lambda\,\Xi \quad (\text{M\&G §4.3, damped diagonal blocks §6.3})\\
    \mu &\leftarrow \mu - \alpha\,\hat F_{\gamma}^{-1}(\hat g + \gamma_{in}\mu)

where the damped diagonal blocks are the π-split ones of eq. 13 (S_{i,i} + √γ/π I, A_{i,i} + π√γ I), used
in every formula, Ψ included. For two layers the block-tridiagonal F̂ is F̃ itself (every block is on the
tridiagonal): the posterior then has the full cross-layer covariance of the Kronecker-factored Fisher.
The posterior covariance (λ/N)ΞᵀΛΞ is block tridiagonal (:class:`~ngvi.BlockTridiagonalGaussian`).

Sampling draws the layers jointly, w − μ = √(λ/N) ΞᵀRε with RRᵀ = Λ; like Alg. 2 one draw is shared by the
minibatch. The model must be a chain of nn.Linear layers (an MLP) run in the order it registers them, each
reading only the previous layer's output (checked in every sample; branches and skips are refused). R is
:func:`~ngvi.curvature.tridiagonal.lam_sqrt`'s, which is independent of the eigenbasis that degenerate factors
leave arbitrary, so ranks and reruns draw alike.
Schedules, the start (``init_prec``: A₀ = S₀ = I by default, none between layers; ``None``: zeros and the
warm start), momentum, the trust region (``kl_clip``), ``forget_start`` and the defaults are the family's
(:mod:`ngvi.optim.kronecker`); the experiments pin NNG's settings (lr 10⁻³, β 10⁻³ or 0.01, their momentum)
explicitly.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .. import _validation as check
from .._tensorlist import TensorList
from ..curvature.kfac import pi_split
from ..curvature.likelihoods import Likelihood
from ..curvature.tridiagonal import (
    ChainLayer,
    TridiagonalFactors,
    chain_factors,
    lam_sqrt,
    precondition,
    xi_t,
)
from ..posterior import BlockTridiagonalGaussian
from .kronecker import DEFAULTS, KroneckerFamily

__all__ = ["NNGBlkTri"]

#: the state of a layer's two chain factorisations: "_in" for sampling (γ_in), none for the update (γ)
_CHAIN_KEYS = ("K_S", "K_A", "e_S", "e_A", "Psi_S", "Psi_A")


class NNGBlkTri(KroneckerFamily):
    """Noisy K-FAC with Martens & Grosse's block-tridiagonal inverse (NNG-BlkTri) on a chain of nn.Linear
    layers.

    Arguments and defaults as for :class:`~ngvi.NoisyKFAC`, without ``sampling`` (the layers are drawn
    jointly) and ``chunk_bytes``.

    Args:
        model: the network: a chain of nn.Linear layers, each feeding the next.
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
        curvature: ``"ef"`` or ``"fisher"``, as NoisyKFAC's.
        init_prec: where q starts, as NoisyKFAC's.
        kl_clip: the trust region κ on the natural step, as NoisyKFAC's.
        forget_start: the factors' early weight, as NoisyKFAC's (:mod:`ngvi.optim.forgetting`).
        likelihood: as NoisyKFAC's (``"fisher"`` only).
        prior_prec: 1/η, the name every ngvi optimizer accepts (give ``prior_var`` or this).
        noise_prec: τ of the ``"gaussian"`` likelihood.
        loss_reduction: ``"mean"`` or ``"sum"``, as NoisyKFAC's.
        **engine_kwargs: ``seed``, ``skip_nonfinite``, ``engine`` (:class:`~ngvi.EngineOptions`), ...

    Raises:
        ValueError: a hyperparameter out of its range, or a model that is not a chain of nn.Linear layers;
            the message names it.
    """

    #: its own update (the joint posterior's factorisations) is not reviewed for the device path's mask
    _maskable_update = False

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
        **engine_kwargs: Any,
    ):
        estimator = TridiagonalFactors(
            model, curvature, likelihood=likelihood, noise_prec=noise_prec, loss_reduction=loss_reduction
        )
        hyper = dict(
            data_size=data_size, lr=lr, beta=beta, momentum=momentum,
            prior_var=check.prior_var(prior_var, prior_prec), kl_weight=kl_weight, damping=damping,
            stats_every=stats_every, inv_every=inv_every, init_prec=init_prec, kl_clip=kl_clip,
            forget_start=forget_start,
        )  # fmt: skip
        super().__init__(estimator, hyper, mc_samples=mc_samples, **engine_kwargs)

    # ----------------------------------------------------------------------------------------------------
    # State: per layer (with its weight) the factors to the next layer and two chain factorisations
    # ----------------------------------------------------------------------------------------------------
    def _dims(self, index: int) -> tuple[int, int]:
        _, rows, cols = self._block_dims(index)
        return rows, cols

    def _init_state(self, group, p, state):
        i = self._layer_of[p]
        if p is not self._hooks.layers[i].params[0]:
            return
        rows, cols = self._dims(i)
        scale = self.initial_factor_scale(group)  # NoisyKFAC's start: aI on the diagonal blocks, 0 between
        state["factor_A"] = torch.eye(cols, dtype=p.dtype, device=p.device).mul_(scale)
        state["factor_S"] = torch.eye(rows, dtype=p.dtype, device=p.device).mul_(scale)
        if i + 1 < len(self._hooks.layers):
            next_rows, next_cols = self._dims(i + 1)
            state["factor_A_next"] = p.new_zeros(cols, next_cols)
            state["factor_S_next"] = p.new_zeros(rows, next_rows)
        state["factor_updates"] = 0
        # factors aI, none between layers: every layer independent (Ψ = 0, e = 0), with π = 1 and damped
        # blocks (a + √γ)I, so K = (a + √γ)^(-1/2) I
        gamma_in = self.intrinsic_damping(group)
        for suffix, damping in (("_in", gamma_in), ("", gamma_in + group["damping"])):
            root = scale + math.sqrt(damping)
            state["K_S" + suffix] = torch.eye(rows, dtype=p.dtype, device=p.device) / math.sqrt(root)
            state["K_A" + suffix] = torch.eye(cols, dtype=p.dtype, device=p.device) / math.sqrt(root)
            state["e_S" + suffix] = p.new_zeros(rows)
            state["e_A" + suffix] = p.new_zeros(cols)
            if i + 1 < len(self._hooks.layers):
                state["Psi_S" + suffix] = p.new_zeros(rows, next_rows)
                state["Psi_A" + suffix] = p.new_zeros(cols, next_cols)

    def _optional_state_shapes(self, p: Tensor) -> dict[str, tuple[int, ...]]:
        return {"momentum_buffer": self._dims(self._layer_of[p])}

    @staticmethod
    def _chain(states: list[dict[str, Any]], suffix: str) -> list[ChainLayer]:
        return [
            ChainLayer(*(st.get(key + suffix) for key in _CHAIN_KEYS)) for st in states
        ]  # last layer: no links

    def _layer_states(self, states: list[dict[str, Any]], ks_of_layers: list[list[int]]) -> list[dict]:
        return [states[ks[0]] for ks in ks_of_layers]

    def _all_layers(self, params: list[Tensor]) -> list[list[int]]:
        positions = self._positions(params)
        if len(positions) != len(self._hooks.layers):
            present = {i for i, _ in positions}
            missing = [layer.name for i, layer in enumerate(self._hooks.layers) if i not in present]
            raise RuntimeError(
                f"NNGBlkTri samples and updates its chain of layers jointly, but layer(s) {missing} have no "
                "gradient or do not require grad"
            )
        return [ks for _, ks in positions]

    def _join2(self, index: int, tensors: list[Tensor]) -> Tensor:
        return self._join(index, tensors)[0]  # [o, d'] (Linear layers: one group)

    def _chains(self, group: dict[str, Any], factors: list[dict[str, Tensor]]) -> dict[str, Tensor]:
        """Both chain factorisations (damping γ_in and γ) of the damped factors; returns per-layer state."""
        gamma_in = self.intrinsic_damping(group)
        out: list[dict[str, Tensor]] = [{} for _ in factors]
        half = (torch.float16, torch.bfloat16)  # their factors are handled in float32
        worked = [
            tuple(f[k].float() if f[k].dtype in half else f[k] for k in ("factor_A", "factor_S"))
            for f in factors
        ]
        # every layer's π, read back once for the chain (not once per layer and damping)
        pis = torch.stack([pi_split(a[None], s[None])[0].double() for a, s in worked]).tolist()
        for suffix, damping in (("_in", gamma_in), ("", gamma_in + group["damping"])):
            root = math.sqrt(damping)
            rows_d, cols_d = [], []
            for (a, s), pi in zip(worked, pis, strict=True):
                cols_d.append(a + pi * root * torch.eye(a.shape[0], dtype=a.dtype, device=a.device))
                rows_d.append(s + root / pi * torch.eye(s.shape[0], dtype=s.dtype, device=s.device))
            row_cross = [f["factor_S_next"].to(rows_d[0].dtype) for f in factors[:-1]]
            col_cross = [f["factor_A_next"].to(rows_d[0].dtype) for f in factors[:-1]]
            chain = chain_factors(rows_d, cols_d, row_cross, col_cross)
            for layer_out, c, f in zip(out, chain, factors, strict=True):
                dtype = f["factor_A"].dtype
                values = (c.row_basis, c.col_basis, c.row_eig, c.col_eig, c.row_link, c.col_link)
                for key, value in zip(_CHAIN_KEYS, values, strict=True):
                    if value is not None:
                        layer_out[key + suffix] = value.to(dtype)
        return out

    # ----------------------------------------------------------------------------------------------------
    # The rule
    # ----------------------------------------------------------------------------------------------------
    def _perturb(self, group, params, noise, states):
        """w ← μ + √(λ/N) ΞᵀRε, all layers at once (the γ_in chain)."""
        layers = self._all_layers(self.trainable(group))
        chain = self._chain(self._layer_states(states, layers), "_in")
        eps = [self._join2(i, [noise[k] for k in ks]) for i, ks in enumerate(layers)]
        draws = xi_t(chain, lam_sqrt(chain, eps))
        scale = math.sqrt(group["kl_weight"] / group["data_size"])
        for i, (ks, draw) in enumerate(zip(layers, draws, strict=True)):
            for k, part in zip(ks, self._split(i, draw[None].mul(scale)), strict=True):
                params[k].add_(part)

    def _precision(self, group, states):
        """Marginal precisions 1/Σⱼⱼ of the posterior (sampling uses the whole block-tridiagonal Σ)."""
        layers = self._all_layers(self.trainable(group))
        post = self._posterior(group, self.trainable(group), states, layers)
        return TensorList(v.reciprocal() for v in post.variance)

    def _update(self, group, means, grads, curvs, states):
        params = self.accumulator.params(group)
        layers = self._all_layers(params)
        gamma_in = self.intrinsic_damping(group)
        current = self._layer_states(states, layers)
        new: list[dict[str, Any]] = [{} for _ in layers]
        if curvs is not None:
            for ks, st, nw in zip(layers, current, new, strict=True):
                count = st["factor_updates"] + 1
                weight = self._factor_step(group, count)
                flat, offset = curvs[ks[0]], 0
                for key in ("factor_A", "factor_S", "factor_A_next", "factor_S_next"):
                    if key not in st:
                        continue
                    size = st[key].numel()
                    hat = flat[offset : offset + size].view_as(st[key])
                    nw[key] = st[key].lerp(hat, weight)  # eq. 12, for the diagonal and the cross factors
                    offset += size
                nw["factor_updates"] = count
        if self._inverting(group):
            factors = [{**st, **nw} for st, nw in zip(current, new, strict=True)]
            for nw, chain_state in zip(new, self._chains(group, factors), strict=True):
                nw.update(chain_state)
        chain = self._chain([{**st, **nw} for st, nw in zip(current, new, strict=True)], "")
        v = [
            self._join2(i, [grads[k] for k in ks]).add_(
                self._join2(i, [means[k] for k in ks]), alpha=gamma_in
            )
            for i, ks in enumerate(layers)
        ]  # V = ĝ + γ_in μ
        steps = precondition(chain, v)  # F̂_γ⁻¹ V = Ξᵀ Λ Ξ V
        if self._kl_clip(group) is not None:  # the family's trust region (kronecker.py)
            nu = self._trust_region(group, steps, v)
            steps = [step * nu.to(step.dtype) for step in steps]
        for st, nw, step, ks, i in zip(current, new, steps, layers, range(len(layers)), strict=True):
            step = self._heavy_ball(group, step, st, nw)
            st.update(nw)
            for k, part in zip(ks, self._split(i, step[None]), strict=True):
                means[k].add_(part, alpha=-group["lr"])

    # ----------------------------------------------------------------------------------------------------
    # The posterior
    # ----------------------------------------------------------------------------------------------------
    def _posterior(self, group, params, states, layers) -> BlockTridiagonalGaussian:
        chain = self._chain(self._layer_states(states, layers), "_in")
        scale = group["kl_weight"] / group["data_size"]
        return BlockTridiagonalGaussian([self.mean_of(p) for p in params], layers, chain, scale)

    @torch.no_grad()
    def posterior(self) -> BlockTridiagonalGaussian:
        """A snapshot of q = N(μ, (λ/N) ΞᵀΛΞ) over the chain, in parameter order."""
        group = self.param_groups[0]
        params = self.trainable(group)
        states = [self.state_of(group, p) for p in params]
        return self._posterior(group, params, states, self._all_layers(params))
