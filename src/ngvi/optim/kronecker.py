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
``kl_clip="auto"`` is κ = :data:`KL_CLIP` = 10⁻² for every start but the papers' (``init_prec=None``, which
the golden trajectories and the experiments pin), as for every rule; a number is κ; None: off.
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
from .engine.prior import AUTO, KL_CLIP, check_kl_clip, kl_clip_of
from .forgetting import check_forget_start, update_weight

__all__ = ["DEFAULTS", "KL_CLIP", "KroneckerFamily"]

#: the family's defaults (NoisyKFAC, NNGBlkTri, NNGFull, baselines.KFAC): one kind of step for all four
DEFAULTS: dict[str, Any] = dict(
    lr=0.1, beta=1e-3, momentum=0.5, damping=1e-3, stats_every=1, inv_every=20, init_prec=AUTO, kl_clip=AUTO
)


class KroneckerFamily(VariationalOptimizer):
    """The shared part of the K-FAC family (module docstring). A member builds its curvature estimator and
    calls ``super().__init__(estimator, hyperparameters, mc_samples=..., sampling=...)``."""

    _additive_prior = False  # the prior is damping inside the factors (empirical_bayes needs no floor)

    takes_model = True
    curvatures = ("ef", "fisher")  # the factors from the closure's or sampled targets
    #: the update replaces the factors, inverses and heavy-ball buffer in the state, which the device path
    #: masks (:mod:`.engine.device_check`); its inversions read one value back, no other step does
    _maskable_update = True
    #: ``finite_check="auto"`` keeps the host read: on an H200 (docs/results/bench/gpu) the mask made K-FAC's
    #: step 1.10× slower and its peak 3.5× higher (a select of every factor and inverse it replaces)
    _device_check_by_default = False

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
        check_kl_clip(group)
        check_forget_start(group)

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
        """The EMA weight of the count-th factor update: β, or max(β, 1/count) from 0 (the warm start), or
        ``forget_start``'s early weight while the start F₀ is forgotten (:mod:`ngvi.optim.forgetting`; a
        group without the key, plain K-FAC's or an old checkpoint's, keeps β)."""
        if group["init_prec"] is None:
            return max(group["beta"], 1.0 / count)
        if group.get("forget_start") is None:
            return group["beta"]
        return update_weight(
            group["beta"], count, group, nng.initial_curvature(group), nng.intrinsic_damping(group)
        )

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
        """κ, or None for no trust region (:func:`~.engine.prior.kl_clip_of`: one meaning for every rule)."""
        return kl_clip_of(group)

    @staticmethod
    def _trust_region(group: dict[str, Any], steps: list[Tensor], vs: list[Tensor]) -> Tensor:
        """ν = min(1, √(κ/m)) with m = α²·Σ vᵀP⁻¹v, the natural step's squared length in the metric P that
        preconditions it (``steps`` P⁻¹v, ``vs`` v = ĝ + γ_in μ): Ba et al.'s (2017) KL clipping. A tensor,
        so no host read; exactly 1 where the cap does not bind."""
        m = sum(torch.vdot(s.reshape(-1), v.reshape(-1)) for s, v in zip(steps, vs, strict=True))
        return F.trust_region(m.float().clamp_min(0.0), lr=group["lr"], kappa=kl_clip_of(group))

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
        """One step for every layer, the layers of one block shape as one batch (issue 30, item 4: the step
        was host-bound, ~90 small ops per layer): their factors are factorised as one stack, the step
        S⁻¹VA⁻¹ is one batched product, and the momentum and the mean update are one op each. Bitwise the
        per-layer step on the CPU (``tests/optim/test_kfac_host_reads.py``): a batched matmul and
        cholesky_ex compute each matrix as alone; cholesky_inverse and solve_triangular do not, so those
        run per layer, on views of the batch's Cholesky factors (at inversions only)."""
        params = self.accumulator.params(group)  # the engine's order of means/grads
        gamma_in = self.intrinsic_damping(group)
        layers = [_Layer(i, ks, states[ks[0]], self._block_dims(i)) for i, ks in self._positions(params)]
        if curvs is not None:
            for layer in layers:  # (12), per layer: lerp writes over the step's own Â, Ŝ (then discarded)
                st = layer.state
                a, s, count = st["factor_A"], st["factor_S"], st["factor_updates"] + 1
                a_hat, s_hat = curvs[layer.ks[0]].split([a.numel(), s.numel()])
                a, s = F.kfac_factor_ema(
                    a, s, a_hat.view_as(a), s_hat.view_as(s), self._factor_step(group, count), into_hats=True
                )
                layer.new.update(factor_A=a, factor_S=s, factor_updates=count)
        batches: dict[tuple, list[_Layer]] = {}
        for layer in layers:
            batches.setdefault(self._batch_key(layer, grads[layer.ks[0]]), []).append(layer)
        if self._inverting(group):
            self._invert(group, list(batches.values()))  # (13)
        steps = [self._precondition(batch, means, grads, gamma_in) for batch in batches.values()]
        if self._kl_clip(group) is not None:  # the trust region (one ν for the group)
            blocks = {id(layer): block for batch, step in zip(batches.values(), steps, strict=True)
                      for layer, block in zip(batch, step.unbind(0), strict=True)}  # fmt: skip
            nu = self._trust_region(  # summed in the layers' order, as one layer at a time did
                group,
                [blocks[id(layer)] for layer in layers],
                [
                    self._join(layer.index, [grads[k] + gamma_in * means[k] for k in layer.ks])
                    for layer in layers
                ],
            )
            steps = [step * nu.to(step.dtype) for step in steps]
        parts, targets = [], []
        for batch, step in zip(batches.values(), steps, strict=True):
            step = self._batched_heavy_ball(group, batch, step)
            for layer, block in zip(batch, step.unbind(0), strict=True):
                parts += self._split(layer.index, block)
                targets += [means[k] for k in layer.ks]
        for layer in layers:  # computed for every layer first, committed after: an error changes nothing
            layer.state.update(layer.new)
        torch._foreach_add_(targets, parts, alpha=-group["lr"])

    @staticmethod
    def _batch_key(layer: _Layer, grad: Tensor) -> Any:
        """Layers with one key are one batch: equal blocks [G, rows, cols] of one dtype, on one device."""
        return layer.dims, grad.dtype, grad.device

    def _invert(self, group: dict[str, Any], batches: list[list[_Layer]]) -> None:
        """The damped inverses (13) of every layer into ``layer.new``: a batch's factors stacked and
        factorised as one, all factorisations checked with one host read, then each layer's inverses from
        its slice (a layer whose factorisation failed falls back alone)."""
        factorisations = []
        for batch in batches:
            factors = [
                torch.stack([layer.new.get(k, layer.state[k]) for layer in batch]).flatten(0, 1)
                for k in ("factor_A", "factor_S")
            ]
            # a step the device path masks may hold NaN factors: factorise finite ones (the identity on a
            # step that is kept), so the inversion cannot fail before the mask selects the old state back
            finite = [torch.nan_to_num(f, nan=0.0, posinf=0.0, neginf=0.0) for f in factors]
            factorisations.append(self._factorisations(group, *finite))
        ok = all_succeeded([f for fs in factorisations for f in fs])
        for batch, fs in zip(batches, factorisations, strict=True):
            g = batch[0].dims[0]
            inverses = [
                self._inverses_from(group, [f.part(j * g, (j + 1) * g) for f in fs], ok)
                for j in range(len(batch))
            ]
            for key in inverses[0]:
                # A⁻¹ and S⁻¹, which only the batched product reads, are stacked once and kept as views of
                # the stack; the roots stay tensors of their own: the sampling's matmuls round differently
                # for an operand at an unaligned address (a view into a stack), measured on this CPU
                per_layer = [inv[key] for inv in inverses]
                if key in ("A_inv", "S_inv"):
                    per_layer = _stack(per_layer).unbind(0)
                for layer, tensor in zip(batch, per_layer, strict=True):
                    layer.new[key] = tensor

    @staticmethod
    def _precondition(
        batch: list[_Layer], means: list[Tensor], grads: list[Tensor], gamma_in: float
    ) -> Tensor:
        """S⁻¹ (ĝ + γ_in M) A⁻¹ for a batch of layers of one block shape, as one [L, G, rows, cols] product
        (V written in place, each parameter into its columns, as :func:`.functional.kfac_natural_step`)."""
        groups, rows, cols = batch[0].dims
        v = grads[batch[0].ks[0]].new_empty(len(batch), groups, rows, cols)
        for j, layer in enumerate(batch):
            start = 0
            for k in layer.ks:
                g, m = grads[k].reshape(groups, rows, -1), means[k].reshape(groups, rows, -1)
                torch.add(g, m, alpha=gamma_in, out=v[j, ..., start : start + g.shape[-1]])
                start += g.shape[-1]
        s_inv = _stacked([layer.new.get("S_inv", layer.state["S_inv"]) for layer in batch])
        a_inv = _stacked([layer.new.get("A_inv", layer.state["A_inv"]) for layer in batch])
        return s_inv @ v @ a_inv

    @staticmethod
    def _batched_heavy_ball(group: dict[str, Any], batch: list[_Layer], step: Tensor) -> Tensor:
        """buf ← m·buf + step for a batch's stacked steps (each layer's buffer a view of the result)."""
        momentum = group["momentum"]
        if not momentum:
            return step
        buffers = [layer.state.get("momentum_buffer") for layer in batch]
        if all(b is not None for b in buffers):
            step = _stacked(buffers).mul(momentum).add_(step)
        elif any(b is not None for b in buffers):  # a layer without a gradient on earlier steps
            step = torch.stack(
                [s if b is None else b.mul(momentum).add_(s) for b, s in zip(buffers, step, strict=True)]
            )
        for layer, view in zip(batch, step.unbind(0), strict=True):
            layer.new["momentum_buffer"] = view
        return step


class _Layer:
    """A layer in one step: its index, its parameters' positions, its state, its [G, rows, cols] block and
    the state entries the step replaces (committed at the end)."""

    __slots__ = ("dims", "index", "ks", "new", "state")

    def __init__(self, index: int, ks: list[int], state: dict[str, Any], dims: tuple[int, int, int]) -> None:
        self.index, self.ks, self.state, self.dims = index, ks, state, dims
        self.new: dict[str, Any] = {}


def _stack(tensors: list[Tensor]) -> Tensor:
    """torch.stack, keeping each matrix's memory layout: LAPACK leaves its inverses column-major, and a
    product rounds by its operands' layout (measured with the golden trajectories' pinned numerics)."""
    if not tensors[0].is_contiguous() and tensors[0].mT.is_contiguous():
        return torch.stack([t.mT for t in tensors]).mT
    return torch.stack(tensors)


def _stacked(tensors: list[Tensor]) -> Tensor:
    """The tensors (all of one shape) as one [L, ...] tensor: the stack they are consecutive views of, as
    the last inversion or step left them (no copy), else a new stack (after a checkpoint or a masked step)."""
    first = tensors[0]
    base = first._base
    if base is not None and base.is_contiguous() and base.numel() == len(tensors) * first.numel():
        size, stride = first.numel() * first.element_size(), first.stride()
        if all(
            t._base is base and t.stride() == stride and t.data_ptr() == base.data_ptr() + j * size
            for j, t in enumerate(tensors)
        ):
            return base.as_strided(
                (len(tensors), *first.shape), (first.numel(), *stride), base.storage_offset()
            )
    return _stack(tensors)


def _local_layers(estimator: KroneckerFactors) -> list[tuple[str, nn.Linear, Tensor]]:
    """The Linear layers with a trained weight, each with the parameter that carries its state."""
    return [
        (layer.name, layer.module, layer.weight)
        for layer in estimator.hooks.layers
        if isinstance(layer.module, nn.Linear) and layer.weight is not None
    ]
