r"""The Kronecker family: what noisy K-FAC, NNG-BlkTri, NNG-full and plain K-FAC share.

All four precondition the gradient with a damped, slowly averaged Fisher. With λ = ``kl_weight``,
η = ``prior_var``, γ_in = λ/(Nη) (the prior as intrinsic damping; K-FAC: the ℓ2 term λ̃ = ``prior_prec``/N)
and γ = γ_in + γ_ex (γ_ex = ``damping``), a step of any member is

.. math::
    F &\leftarrow (1-\beta)F + \beta\hat F && \text{every } T_{stats} \text{ steps (NNG eq. 12)} \\
    \text{buf} &\leftarrow m\,\text{buf} + (F + \gamma)^{-1}(\hat g + \gamma_{in}\mu)
        && (F + \gamma)^{-1} \text{ recomputed every } T_{inv} \text{ steps} \\
    \mu &\leftarrow \mu - \alpha\,\text{buf}

and (for the noisy members) w ~ N(μ, (λ/N)(F + γ_in)⁻¹). The members differ in F and in how it is inverted:

* :class:`~ngvi.NoisyKFAC` (NNG Alg. 2): per layer F = S ⊗ A, the factors A = E[āāᵀ], S = E[δδᵀ], the damping
  split between them by π, A + π√γ I and S + √γ/π I (eq. 13); the matrix-variate posterior.
* :class:`~ngvi.baselines.KFAC` (Martens & Grosse 2015): the same factors and step, without the noise.
* :class:`~ngvi.NNGBlkTri` (NNG §3.5, M&G §4.3): also the factors between adjacent layers, inverted as a
  block-tridiagonal chain.
* :class:`~ngvi.NNGFull` (NNG §3.1): a dense F̄ over all weights from per-example gradients.

This base owns the hyperparameters and their checks (one set of defaults: :data:`DEFAULTS`), the layers'
[G, o, d'] blocks, the start and the warm start of the factors, the schedules, heavy-ball momentum, the
sampling of Linear pre-activations (:mod:`._kfac_local`) and the block-diagonal K-FAC step; a member adds its
inverses, its noise and its posterior.

**Defaults** (every member): α = 0.1 in natural-gradient units, β = 10⁻³, momentum 0.5, γ_ex = 10⁻³,
T_stats = 1, T_inv = 20 and ``init_prec="auto"``: the factors start at the identity (A₀ = S₀ = I, F̄₀ = I),
one unit of curvature per example, so the first steps are SGD steps of size α and σ₀ ≈ 1/√N (VOGN's and
noisy Adam's start). ``init_prec=None`` starts the factors at 0 with K-FAC's warm start: the k-th update uses
the weight max(β, 1/k), a running mean until k = 1/β (the papers' start, which the experiments pin with their
step sizes: lr 10⁻³, β 0.01, no momentum). A number c (the noisy members) starts q at precision c.

**Trust region** (``kl_clip``, issue 32). With the identity start the first ``inv_every`` steps precondition
with ≈ I, so the step grew with the loss's scale (a Gaussian NLL mse/(2·0.3²) diverged by step 20). The
natural step is scaled by ν = min(1, √(κ/m)), m = α²·vᵀP⁻¹v its squared length in the metric P that
preconditions it (Ba, Grosse & Martens 2017's KL clipping), before the momentum: at the identity start
‖Δμ‖ ≤ √κ.
``kl_clip="auto"`` is κ = :data:`KL_CLIP` = 10⁻² with ngvi's starts and no region with the papers'
(``init_prec=None``, which the golden trajectories and the experiments pin); a number is κ; None: off.
Measured alternatives (factors from the first batch; inverting every step early) in docs/CHOOSING.md.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .. import _validation as check
from ..curvature.hooks import CurvatureHooks
from ..curvature.kfac import Factorisation, all_succeeded
from ..curvature.layer import KroneckerFactors, LayerCurvature
from ..posterior import join_block, split_block
from . import _nng_prior as nng
from . import functional as F
from ._kfac_local import SAMPLINGS, LocalPreactivations
from .engine.optimizer import VariationalOptimizer
from .engine.prior import AUTO, KL_CLIP

__all__ = ["DEFAULTS", "KL_CLIP", "KroneckerFamily"]

#: the family's defaults (NoisyKFAC, NNGBlkTri, NNGFull, baselines.KFAC): one kind of step for all four
DEFAULTS: dict[str, Any] = dict(
    lr=0.1, beta=1e-3, momentum=0.5, damping=1e-3, stats_every=1, inv_every=20, init_prec=AUTO, kl_clip=AUTO
)


class KroneckerFamily(VariationalOptimizer):
    """The shared part of the K-FAC family (module docstring). A member builds its curvature estimator and
    calls ``super().__init__(estimator, hyperparameters, mc_samples=..., sampling=...)``."""

    additive_prior = False  # the prior is damping inside the factors (empirical_bayes needs no floor)

    takes_model = True
    curvatures = ("ef", "fisher")  # the factors from the closure's or sampled targets
    #: the update replaces the factors, inverses and heavy-ball buffer in the state, which the device path
    #: masks (:mod:`.engine.device_check`); its inversions read one value back, no other step does
    maskable_update = True
    #: ``finite_check="auto"`` keeps the host read: on an H200 (docs/results/bench/gpu) the mask made K-FAC's
    #: step 1.10× slower and its peak 3.5× higher (a select of every factor and inverse it replaces)
    device_check_by_default = False

    def __init__(
        self,
        estimator: LayerCurvature,
        defaults: dict[str, Any],
        *,
        mc_samples: int,
        sampling: str = "weights",
        **engine_kwargs: Any,
    ) -> None:
        self.sampling = check.choice("sampling", sampling, SAMPLINGS)
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

    # ----------------------------------------------------------------------------------------------------
    # Hyperparameters: the checks, the prior as damping, the start, the schedules
    # ----------------------------------------------------------------------------------------------------
    def _check_group(self, group):
        check.data_size(group["data_size"])
        check.nonnegative("lr", group["lr"])
        check.unit_interval("beta", group["beta"], closed_low=False, closed_high=True)
        check.unit_interval("momentum", group["momentum"])
        self._check_prior(group)
        if "stats_every" in group:
            check.positive_int("stats_every", group["stats_every"])
        check.positive_int("inv_every", group["inv_every"])
        if group.get("kl_clip", AUTO) not in (AUTO, None):
            check.positive("kl_clip", group["kl_clip"], allow_inf=True)

    def _check_prior(self, group: dict[str, Any]) -> None:
        nng.check_prior(group)

    @staticmethod
    def intrinsic_damping(group: dict[str, Any]) -> float:
        """γ_in = λ/(Nη)."""
        return nng.intrinsic_damping(group)

    @classmethod
    def initial_factor_scale(cls, group: dict[str, Any]) -> float:
        """a of A₀ = S₀ = aI: 1 for ``init_prec="auto"``, 0 for ``None``, else √(λc/N − γ_in)."""
        return math.sqrt(nng.initial_curvature(group))

    @staticmethod
    def _factor_step(group: dict[str, Any], count: int) -> float:
        """The EMA weight of the count-th factor update: β, or max(β, 1/count) from 0 (the warm start)."""
        return max(group["beta"], 1.0 / count) if group["init_prec"] is None else group["beta"]

    def _inverting(self, group: dict[str, Any]) -> bool:
        """Inverses at the first step and every T_inv steps after."""
        return self.num_steps % group["inv_every"] == 0

    @staticmethod
    def _heavy_ball(
        group: dict[str, Any], step: Tensor, state: dict[str, Any], new: dict[str, Any]
    ) -> Tensor:
        """buf ← m·buf + step (kept in ``new``); the step itself without momentum."""
        momentum = group["momentum"]
        if not momentum:
            return step
        buffer = state.get("momentum_buffer")
        step = step if buffer is None else buffer.mul(momentum).add_(step)
        new["momentum_buffer"] = step
        return step

    @staticmethod
    def _kl_clip(group: dict[str, Any]) -> float | None:
        """κ, or None for no trust region: ``"auto"`` is :data:`KL_CLIP` with ngvi's starts and None with the
        papers' (``init_prec=None``, which the golden trajectories and the experiments pin)."""
        kappa = group.get("kl_clip", AUTO)  # (absent from checkpoints saved before it: "auto")
        if kappa == AUTO:
            return None if group["init_prec"] is None else KL_CLIP
        return kappa

    @staticmethod
    def _trust_region(group: dict[str, Any], steps: list[Tensor], vs: list[Tensor]) -> Tensor:
        """ν = min(1, √(κ/m)) with m = α²·Σ vᵀP⁻¹v, the natural step's squared length in the metric P that
        preconditions it (``steps`` P⁻¹v, ``vs`` v = ĝ + γ_in μ): Ba et al.'s (2017) KL clipping. A tensor,
        so no host read; exactly 1 where the cap does not bind."""
        m = sum(torch.vdot(s.reshape(-1), v.reshape(-1)) for s, v in zip(steps, vs, strict=True))
        m = m.float().clamp_min(0.0).mul_(group["lr"] ** 2)
        return torch.rsqrt(m / KroneckerFamily._kl_clip(group)).clamp_(max=1.0)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As the engine's; a checkpoint from before ``kl_clip`` existed resumes with ``"auto"``."""
        groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
        if isinstance(groups, list) and any(isinstance(g, dict) and "kl_clip" not in g for g in groups):
            groups = [
                {**g, "kl_clip": AUTO} if isinstance(g, dict) and "kl_clip" not in g else g for g in groups
            ]
            state_dict = {**state_dict, "param_groups": groups}
        super().load_state_dict(state_dict)

    # ----------------------------------------------------------------------------------------------------
    # Layer layout: a layer's parameters as one [G, o, d'] block (weight columns, then the bias column)
    # ----------------------------------------------------------------------------------------------------
    @property
    def _hooks(self) -> CurvatureHooks:
        return self.curvature_estimator.hooks

    @property
    def _layer_of(self) -> dict[Tensor, int]:
        return self.curvature_estimator.layer_of

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
                    f"{type(self).__name__} updates the weight and bias of layer {layer.name!r} together, "
                    "but only some of them have a gradient or require grad"
                )
            out.append((i, ks))
        return out

    def unsampled(self, p: Tensor, train: bool) -> bool:  # point estimates, and the locally sampled layers
        return super().unsampled(p, train) or (train and p in self.local_sampling.params)

    # ----------------------------------------------------------------------------------------------------
    # The block-diagonal K-FAC step (NoisyKFAC, KFAC): factors per layer, a member's ``_inverses``
    # ----------------------------------------------------------------------------------------------------
    def _inverses(self, group: dict[str, Any], a: Tensor, s: Tensor) -> dict[str, Tensor]:
        """At least ``A_inv`` and ``S_inv``, the damped inverses of eq. 13 (one host read of its own)."""
        return self._inverses_from(group, self._factorisations(group, a, s), None)

    def _factorisations(self, group: dict[str, Any], a: Tensor, s: Tensor) -> list[Factorisation]:
        """The layer's damped factors, factorised without reading back whether that succeeded."""
        raise NotImplementedError

    def _inverses_from(
        self, group: dict[str, Any], factorisations: list[Factorisation], ok: bool | None
    ) -> dict[str, Tensor]:
        """The inverses from the layer's factorisations; ``ok``: whether every layer's succeeded, read once
        for all layers of a step (None: read here)."""
        raise NotImplementedError

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

    def _update(self, group, means, grads, curvs, states):
        params = self.accumulator.params(group)  # the engine's order of means/grads
        gamma_in = self.intrinsic_damping(group)
        invert = self._inverting(group)
        layers = []  # (12) for every layer first: all factorisations are then checked with one host read
        for i, ks in self._positions(params):
            st = states[ks[0]]
            new: dict[str, Any] = {}
            a, s = st["factor_A"], st["factor_S"]
            if curvs is not None:
                count = st["factor_updates"] + 1
                flat = curvs[ks[0]]
                a_hat, s_hat = flat[: a.numel()].view_as(a), flat[a.numel() :].view_as(s)
                weight = self._factor_step(group, count)  # (12), over the step's own Â, Ŝ (then discarded)
                a, s = F.kfac_factor_ema(a, s, a_hat, s_hat, weight, into_hats=True)
                new.update(factor_A=a, factor_S=s, factor_updates=count)
            # a step the device path masks may hold NaN factors: factorise finite ones (the identity on a
            # step that is kept), so the inversion cannot fail before the mask selects the old state back
            finite = [torch.nan_to_num(f, nan=0.0, posinf=0.0, neginf=0.0) for f in (a, s)] if invert else []
            layers.append((i, ks, st, new, self._factorisations(group, *finite) if invert else []))
        ok = all_succeeded([f for *_, factorisations in layers for f in factorisations]) if invert else None
        pending = []  # computed for every layer first, committed after: an error leaves the state as it was
        for i, ks, st, new, factorisations in layers:
            if invert:
                new.update(self._inverses_from(group, factorisations, ok))  # (13)
            a_inv, s_inv = new.get("A_inv", st["A_inv"]), new.get("S_inv", st["S_inv"])
            step = F.kfac_natural_step(  # S⁻¹ (ĝ + γ_in M) A⁻¹
                [grads[k] for k in ks], [means[k] for k in ks], a_inv, s_inv, gamma_in=gamma_in
            )
            pending.append((i, ks, st, new, step))
        if self._kl_clip(group) is not None:  # the trust region (one ν for the group)
            nu = self._trust_region(
                group,
                [step for *_, step in pending],
                [self._join(i, [grads[k] + gamma_in * means[k] for k in ks]) for i, ks, *_ in pending],
            )
            pending = [(i, ks, st, new, step * nu.to(step.dtype)) for i, ks, st, new, step in pending]
        pending = [
            (i, ks, st, new, self._heavy_ball(group, step, st, new)) for i, ks, st, new, step in pending
        ]
        for i, ks, st, new, step in pending:
            st.update(new)
            for k, part in zip(ks, self._split(i, step), strict=True):
                means[k].add_(part, alpha=-group["lr"])


def _local_layers(estimator: KroneckerFactors) -> list[tuple[str, nn.Linear, Tensor]]:
    """The Linear layers with a trained weight, each with the parameter that carries its state."""
    return [
        (layer.name, layer.module, layer.weight)
        for layer in estimator.hooks.layers
        if isinstance(layer.module, nn.Linear) and layer.weight is not None
    ]
