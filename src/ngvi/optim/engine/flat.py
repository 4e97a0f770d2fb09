r"""Flat buffers: the element-wise rules' passes as one kernel per parameter group, not one per tensor.

For a rule whose precision and update act weight by weight (``elementwise``) with a diagonal draw (the default
one, or a rule's own whose factors ``_draw_factors`` gives: VOGN's), the trainable parameters of a group that
share a device and dtype form a :class:`Bucket`: μ, every state tensor, θ, ε and the MC sum of ĝ each live in
one contiguous tensor, and each parameter (and each of its state entries) is a view into it. The rule then
runs on the bucket as if it were one parameter: its ``_precision`` and ``_update`` get one-tensor lists and
one state dict (the flat tensors and the scalars the parameters share, such as the step), so a pass is one
kernel (or one multi-tensor kernel on the few per-tensor lists that remain) whatever the number of tensors,
and one ``normal_`` draws ε for the bucket.

The same arithmetic on the same operands: fed the same ε, the per-tensor path and this one give bitwise the
same trajectories (``tests/optim/test_flat.py``). With ``noise="normal"`` the random stream differs from the
per-tensor path's (one draw per bucket, not one per parameter), which is why the golden trajectories were
re-recorded with it; ``noise="chunked"`` keys each parameter's ε as before, and FSDP2's shards
(:mod:`.sharded`) use that.

A bucket is built at the first draw and checked at each one (metadata only: the tensor each parameter and
state entry is bound to, and the scalars): a parameter rebound since (``model.to()``, ``p.data = ...``), a
state replaced (``load_state_dict``, ``opt.state.clear()``) or parameters that no longer step together
(one without a gradient) rebuild it or fall back to the per-tensor path, never silently use stale buffers.
Memory: θ's buffer is kept between steps (the per-tensor path allocated θ at each draw); once μ is
restored it holds the sample's ĝ, copied from ``p.grad`` with one multi-tensor op, and after a closure
step each ``p.grad`` views that copy (the next draw sets it to None before writing θ there), so ĝ is not
held twice; with the chunked passes the peak is below the per-tensor path's for most rules.
:func:`enabled` is the one place that chooses the path.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..._tensorlist import TensorList
from ..functional import blocks
from . import mixed_precision, sharded


def enabled(opt: Any) -> bool:
    """Whether ``opt`` keeps flat buckets: asked for (``flat=None`` or ``True``), an element-wise rule with a
    diagonal draw (the default, or a rule's own in :meth:`~.optimizer.VariationalOptimizer._draw_factors`)
    that samples every weight, and a curvature estimator that acts weight by weight or per parameter."""
    est = opt.curvature_estimator
    return bool(
        opt.flat is not False
        and opt._elementwise
        and opt._flat_draw
        and not opt._local_params
        and (est is None or est.elementwise or (est.per_parameter and not _point_estimates(est)))
    )


def _point_estimates(est: Any) -> Any:
    """The parameters a hooked estimator leaves unsampled (batch norm's), which a bucket would sample."""
    return getattr(getattr(est, "hooks", None), "point_params", None)


def takes_shards(opt: Any) -> bool:
    """Whether ``opt`` can step FSDP2's shards (:mod:`.sharded`): the flat path, with an estimator that reads
    ĝ alone (hooks see whole layers, not a rank's rows)."""
    est = opt.curvature_estimator
    return enabled(opt) and (est is None or est.elementwise)


def _views(flat: Tensor, like: list[Tensor]) -> list[Tensor]:
    out, start = [], 0
    for t in like:
        out.append(flat[start : start + t.numel()].view(t.shape))
        start += t.numel()
    return out


@torch.no_grad()
def _flatten(tensors: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
    """One new contiguous tensor holding ``tensors`` one after the other, and its views shaped like them."""
    flat = tensors[0].new_empty(sum(t.numel() for t in tensors))
    views = _views(flat, tensors)
    for view, t in zip(views, tensors, strict=True):
        view.copy_(t)
    return flat, views


class Bucket:
    """The trainable parameters of one group that share a device and dtype, flattened (see the module).

    Attributes: ``params``; ``states`` (their state dicts); ``param_flat`` (the parameters' values, whose
    views the parameters are bound to between samples); ``mu`` (μ as the rule updates it: ``param_flat``,
    or the float32 master of promoted parameters); ``state`` (the rule's one state dict for the bucket);
    ``theta`` and ``grad`` (θ and the sum of ĝ, kept between steps) with their views; ``curv`` (the sum of
    ĥ while a step is pending). ``param_flat`` also keys the bucket's ε and √precision in the engine's
    dictionaries. ``segments``: per parameter (start in the bucket, length, the whole parameter's size,
    the start of this part in it), what keys its noise. For FSDP2's sharded parameters (``sharded``,
    :mod:`.sharded`) ``locals`` are the rank's shards, which the engine writes in place: ``param_flat`` is a
    copy of them, gathered again before each draw and update.
    """

    def __init__(self, opt: Any, params: list[Tensor], states: list[dict[str, Any]]) -> None:
        self.params, self.states = params, states
        self.position = {p: i for i, p in enumerate(params)}
        self.promoted = mixed_precision.promoted(opt, params[0])
        self.sharded = sharded.is_sharded(params[0])
        self.locals = [sharded.local(p) for p in params]
        self.numels = [t.numel() for t in self.locals]
        offsets = [sharded.global_offset(p) if self.sharded else 0 for p in params]
        starts = list(itertools.accumulate(self.numels, initial=0))
        self.segments = [
            (start, n, p.numel(), offset)
            for start, n, p, offset in zip(starts, self.numels, params, offsets, strict=False)
        ]
        with torch.no_grad():
            self.param_flat, self.param_views = _flatten([t.detach() for t in self.locals])
            for p, view in zip(params, self.param_views, strict=True):
                if not self.sharded:  # a shard stays in FSDP2's storage, which its gathers read
                    p.data = view
            self.flat: dict[str, Tensor] = {}
            self.views: dict[str, list[Tensor]] = {}
            for key in [k for k, v in states[0].items() if isinstance(v, Tensor)]:
                self.register(key, *_flatten([st[key] for st in states]))
            self.scalars = [k for k, v in states[0].items() if not isinstance(v, Tensor)]
            self.mu = self.flat["master"] if self.promoted else self.param_flat
            self.theta = torch.empty_like(self.param_flat)
            self.theta_views = _views(self.theta, self.locals)
        self.bound = self._binding(params)  # what `current` compares, per parameter
        self.grad: Tensor | None = None  # Σĝ while a step is pending (θ's buffer after the first sample)
        self.curv: Tensor | None = None  # Σĥ while a step is pending
        self._gathered: tuple[Tensor, list[Tensor]] | None = None  # Σĥ of a per-parameter estimator, views
        self.state: dict[str, Any] = {**{k: states[0][k] for k in self.scalars}, **self.flat}

    def register(self, key: str, flat: Tensor, views: list[Tensor]) -> None:
        """A flat state tensor: each parameter's state entry becomes its view."""
        self.flat[key], self.views[key] = flat, views
        for st, view in zip(self.states, views, strict=True):
            st[key] = view

    def gather_curvature(self, curvs: list[Tensor], first: bool) -> Tensor:
        """Per-parameter ĥ (in parameter order) into the bucket's flat Σĥ with one multi-tensor op: copied at
        a step's first sample, added at the others, as the per-tensor path sums them. The buffer and its
        views are kept between steps (the update consumes Σĥ within its step)."""
        if self._gathered is None:
            flat = self.mu.new_empty(self.mu.numel())
            self._gathered = flat, _views(flat, self.locals)
        flat, views = self._gathered
        (torch._foreach_copy_ if first else torch._foreach_add_)(views, curvs)
        return flat

    @staticmethod
    def eligible(params: list[Tensor], states: list[dict[str, Any]]) -> bool:
        """Parameters that can share buffers: contiguous, not overlapping in memory (tied views would be
        untied), every state entry shaped like its parameter (its shard) with one dtype per entry, and the
        same scalars (they stepped together)."""
        first = states[0]
        keys = set(first)
        params = [sharded.local(p) for p in params]
        if not all(p.is_contiguous() for p in params) or not _disjoint(params):
            return False
        for p, st in zip(params, states, strict=True):
            if set(st) != keys:
                return False
            for k, v in st.items():
                ref = first[k]
                if isinstance(v, Tensor):
                    if v.shape != p.shape or v.dtype != ref.dtype or not v.is_contiguous():
                        return False
                elif v != ref:
                    return False
        return True

    def _binding(self, params: list[Tensor]) -> list[tuple[int, torch.Size, torch.dtype]]:
        """(address, shape, dtype) of the tensor each parameter (its shard) is bound to."""
        tensors = [sharded.local(p) for p in params] if self.sharded else params
        return [(t.data_ptr(), t.shape, t.dtype) for t in tensors]

    def current(self, params: list[Tensor], states: list[dict[str, Any]]) -> bool:
        """Still what was built: the same parameters bound to their views, the same state entries, and
        scalars that agree (metadata only: nothing is read from the device). Asked twice a step, so written
        as whole-list comparisons: per parameter it is the host's largest cost in a step."""
        if len(params) != len(self.params) or not all(map(operator.is_, params, self.params)):
            return False
        if self._binding(params) != self.bound:
            return False
        n_keys = len(self.flat) + len(self.scalars)
        if not all(map(operator.is_, states, self.states)) or any(len(st) != n_keys for st in states):
            return False
        for key, views in self.views.items():
            if not all(map(operator.is_, [st.get(key) for st in states], views)):
                return False
        return all(st.get(k) == self.state[k] for k in self.scalars for st in states)

    def sync_state(self) -> None:
        """The scalars of the rule's state (the step, a decayed weight) into every parameter's state, and a
        state tensor the rule created on the bucket (a lazily made buffer) into views."""
        for key, value in self.state.items():
            if isinstance(value, Tensor):
                if key not in self.flat:
                    self.register(key, value, _views(value, self.locals))
            else:
                if key not in self.scalars:
                    self.scalars.append(key)
                for st in self.states:
                    st[key] = value

    def pieces(self, flat: Tensor) -> tuple[Tensor, ...]:
        """``flat`` cut into one 1-D piece per parameter (one op), for per-parameter checks and messages."""
        return flat.split(self.numels)

    def written(self) -> list[Tensor]:
        """What an update writes: μ, the state tensors, and the parameters of a promoted bucket (the shards
        of a sharded one)."""
        out = [self.mu, *(v for k, v in self.flat.items() if v is not self.mu)]
        if self.sharded:
            return out + self.locals
        return out + ([self.param_flat] if self.promoted else [])

    @torch.no_grad()
    def gather(self) -> None:
        """A sharded bucket's μ from its shards, which are the truth between steps (a load writes there);
        a promoted bucket's truth is its master."""
        if self.sharded and not self.promoted:
            torch._foreach_copy_(self.param_views, self.locals)

    @torch.no_grad()
    def write_back(self) -> None:
        """μ into the parameters after an update: the float32 master rounded into a promoted bucket (one
        copy), μ into the shards of a sharded one."""
        if self.sharded:
            mu_views = self.views["master"] if self.promoted else self.param_views
            torch._foreach_copy_(self.locals, mu_views)
        elif self.promoted:
            self.param_flat.copy_(self.mu)


def _disjoint(tensors: list[Tensor]) -> bool:
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors)
    return all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))


def noise_of(opt: Any, p: Tensor) -> Tensor:
    """The kept ε of ``p``'s current sample: its own buffer, or its view of its bucket's (the per-tensor path
    of a step where a parameter had no gradient, after a flat draw)."""
    noise = opt.noise_source
    for buckets in opt._buckets.values():
        for b in buckets:
            i = b.position.get(p)
            if i is not None and noise.has_buffer(b.param_flat):
                return noise.buffer(b.param_flat).narrow(0, sum(b.numels[:i]), b.numels[i]).view(p.shape)
    return noise.buffer(p)


def buckets_of(
    opt: Any, group: dict[str, Any], params: list[Tensor], states: list[dict[str, Any]]
) -> list[Bucket] | None:
    """The group's buckets, checked or rebuilt; None where the group takes the per-tensor path."""
    cache: dict[int, list[Bucket]] = opt._buckets
    found = cache.get(id(group))
    if found is not None and len(found) == 1 and found[0].current(params, states):
        return found  # the common case: its check covers the split (a move or a cast rebinds the tensors)
    parts = _by_device_and_dtype(params, states)
    if (
        found is not None
        and len(found) == len(parts)
        and all(b.current(ps, sts) for b, (ps, sts) in zip(found, parts, strict=True))
    ):
        return found
    cache.pop(id(group), None)
    if not params or not all(Bucket.eligible(ps, sts) for ps, sts in parts):
        return None
    cache[id(group)] = [Bucket(opt, ps, sts) for ps, sts in parts]
    return cache[id(group)]


def _by_device_and_dtype(
    params: list[Tensor], states: list[dict[str, Any]]
) -> list[tuple[list[Tensor], list[dict[str, Any]]]]:
    if all(p.dtype == params[0].dtype and p.device == params[0].device for p in params):
        return [(params, states)]  # the common case, in one pass
    parts: dict[tuple[torch.dtype, torch.device], tuple[list, list]] = {}
    for p, st in zip(params, states, strict=True):
        ps, sts = parts.setdefault((p.dtype, p.device), ([], []))
        ps.append(p)
        sts.append(st)
    return list(parts.values())


#: on the CPU a pass runs over chunks of at least this many elements, at most four: a chain of passes then
#: works on a piece that stays in cache, and its temporaries never hold a copy of the whole bucket
#: (``ngvi.experiments.bench.before_after``: the MLP's rules ran 0.72–0.95× as fast in one piece)
CPU_CHUNK = 1 << 18


def chunks(b: Bucket, compiled: bool = False) -> list[tuple[int, int]]:
    """(start, length) of the pieces a pass over ``b`` runs on: four for a large bucket on the CPU, else one
    (a compiled core makes no temporaries; an accelerator's kernels want the whole buffer)."""
    total = b.mu.numel()
    count = 1 if compiled or b.mu.device.type != "cpu" else max(1, min(4, total // CPU_CHUNK))
    # cut at whole rows of the trust region's sum, so the pieces' sums are the whole bucket's bits
    row = blocks.SUM_BLOCK if total >= count * blocks.SUM_BLOCK else 1
    bounds = sorted({total * i // count // row * row for i in range(count)} | {total})
    if len(bounds) == 1:  # an empty bucket (a rank's empty shard) still runs its one, empty, piece
        bounds = [0, 0]
    return [(start, end - start) for start, end in itertools.pairwise(bounds)]


def _piece(state: dict[str, Any], start: int, length: int) -> dict[str, Any]:
    return {k: v.narrow(0, start, length) if isinstance(v, Tensor) else v for k, v in state.items()}


def update(
    b: Bucket,
    rule_update: Callable[..., Any],
    grad: Tensor,
    curvs: Any,
    compiled: bool,
    *,
    plan: Any,
    scope: Any,
) -> None:
    """``rule_update(means, grads, curvs, states)`` on the bucket, chunk by chunk (:func:`chunks`), as calls
    of ``plan`` (a :class:`~.region.GroupUpdate`, which takes one trust region over them). A state tensor the
    rule creates on a chunk (a lazily made buffer) is then joined into one flat tensor; the scalars it changes
    (a decayed weight) change alike in every chunk."""
    curv = None if curvs is None else curvs[0]
    pieces = []
    for start, length in chunks(b, compiled):
        state = _piece(b.state, start, length)
        lists = (
            TensorList([b.mu.narrow(0, start, length)]),
            TensorList([grad.narrow(0, start, length)]),
            None if curv is None else TensorList([curv.narrow(0, start, length)]),
        )
        plan.add(scope, functools.partial(rule_update, *lists, [state]), sharded=b.sharded)
        pieces.append(state)
    plan.then(functools.partial(_join, b, pieces))


def _join(b: Bucket, pieces: list[dict[str, Any]]) -> None:
    for key, value in pieces[0].items():
        if not isinstance(value, Tensor):
            b.state[key] = value
        elif key not in b.flat:
            b.state[key] = torch.cat([piece[key] for piece in pieces]) if len(pieces) > 1 else value


@torch.no_grad()
def perturb(opt: Any, group: dict[str, Any], b: Bucket, reuse: bool) -> None:
    """θ = μ + σ⊙ε for the bucket, with one precision pass and one draw, each parameter then bound to its
    view of θ (μ stays in ``param_flat``, kept in ``opt._means``). The rule's ``_draw_factors(group,
    states)`` gives (√precision, r, v) with σ = v·r, as its per-tensor draw computes them, here as
    one-tensor lists."""
    noise = opt.noise_source
    if b.grad is b.theta:  # a pending sample's Σĝ (manual form) lives in θ's buffer: move it out
        b.grad = b.theta.clone()
    b.gather()
    if noise.keep:  # the curvature reads ε: one kept buffer for the bucket
        eps = noise.draw(b.param_flat, reuse, b.segments)
        eps = eps if eps.dtype == b.mu.dtype else eps.to(b.mu.dtype)
        out = b.theta if not b.promoted else torch.empty_like(b.mu)
    else:  # ε drawn straight into θ's buffer (in the master's dtype for a promoted bucket)
        eps = out = noise.into(b.theta if not b.promoted else torch.empty_like(b.mu), b.segments)
    # the curvature reads ĝ⊙ε·√precision: √precision is kept for this sample in one piece, as per tensor
    for start, length in chunks(b, opt.compile) if not opt.needs_noise else [(0, b.mu.numel())]:
        sqrt_prec, factor, value = opt._draw_factors(group, [_piece(b.state, start, length)])
        if opt.needs_noise:
            opt._sqrt_prec[b.param_flat] = sqrt_prec[0]
        piece = out.narrow(0, start, length)
        mu, eps_piece = b.mu.narrow(0, start, length), eps.narrow(0, start, length)
        torch.addcmul(mu, eps_piece, factor[0], value=value, out=piece)
    if b.promoted:
        b.theta.copy_(out)
    if b.sharded:  # θ into the shards, which FSDP2 gathers; μ is written back at the restore
        torch._foreach_copy_(b.locals, b.theta_views)
        opt._in_place.append(b)
    opt._means.update(zip(b.params, b.param_views, strict=True))
    if not b.sharded:
        opt._thetas.update(zip(b.params, b.theta_views, strict=True))
        for p, theta in zip(b.params, b.theta_views, strict=True):
            p.data = theta


def restore(b: Bucket) -> None:
    """μ back into a sharded bucket's shards after a sample (the draw wrote θ there)."""
    b.write_back()


@torch.no_grad()
def add_sample(b: Bucket, first: bool, estimate: Callable[[Tensor], Any]) -> None:
    """Add the sample in ``p.grad`` to the bucket's sums: ĝ copied flat into θ's buffer with one
    multi-tensor copy (the buffer is free once μ is restored; a pending sum is moved out before the next
    draw), in float32 for a promoted bucket, and ĥ from ``estimate(ĝ)`` on the flat sample (or per parameter,
    gathered: :meth:`Bucket.gather_curvature`). ``p.grad`` stays the caller's own tensor: a gradient that user
    code keeps is never a view of a buffer the engine writes again."""
    torch._foreach_copy_(b.theta_views, [sharded.local(p.grad) for p in b.params])
    target = b.theta.float() if b.promoted else b.theta
    curv = estimate(target)
    if isinstance(curv, list):  # one ĥ per parameter (a layer's hooks): summed into the bucket's buffer
        curv = b.gather_curvature(curv, first)
    if first:
        b.grad, b.curv = target, curv
        return
    b.grad.add_(target)
    if curv is not None and curv is not b.curv:  # a gathered ĥ was added into the sum already
        b.curv.add_(curv)
