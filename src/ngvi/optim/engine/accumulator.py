"""The sample accumulator: sums of ĝ and ĥ over the MC samples of one step, and what is done with them.

Between ``step()`` calls it holds the pending samples (the closure form fills it within one ``step``; the
manual form across ``sampled_params(train=True)`` blocks). At the step it yields, per parameter group, the
means that the rule's update reads, after averaging over ranks what each rank computed from its own data and
checking that everything is finite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ... import distributed as dist_util
from ..._tensorlist import TensorList
from ...curvature.estimators import CurvatureInput
from . import flat, mixed_precision

__all__ = ["GroupSums", "SampleAccumulator"]


@dataclass
class GroupSums:
    """One parameter group's pending sums, in the group's parameter order (parameters with a gradient)."""

    group: dict[str, Any]
    params: list[Tensor]
    grads: TensorList
    curvs: TensorList | None
    bucket: flat.Bucket | None = None  # the sums are the bucket's flat tensors (one per list)

    def per_param(self) -> tuple[list[Tensor], list[Tensor]]:
        """The gradients and curvatures one tensor per parameter (1-D pieces of a bucket's sums), for the
        per-parameter finiteness flags and messages."""
        curvs = self.curvs.tensors if self.curvs is not None else []
        if self.bucket is None:
            return self.grads.tensors, curvs
        cut = self.bucket.pieces
        return list(cut(self.grads[0])), list(cut(curvs[0])) if curvs else []


class SampleAccumulator:
    """Σ ĝ and Σ ĥ per parameter, and the number of samples they hold."""

    def __init__(self) -> None:
        self.grads: dict[Tensor, Tensor] = {}
        self.curvs: dict[Tensor, Tensor] = {}
        self.buckets: list[tuple[dict[str, Any], flat.Bucket]] = []  # (group, bucket) with pending sums
        self.count = 0

    def params(self, group: dict[str, Any]) -> list[Tensor]:
        """The parameters of ``group`` with pending sums, in group order (the order of the rule's lists)."""
        return [p for p in group["params"] if p in self.grads]

    def add_sample(self, opt: Any, keep_grad_refs: bool) -> None:
        """Add the sample now in ``p.grad`` of ``opt``'s trainable parameters, with its ĥ from ``opt``'s
        curvature estimator. With ``keep_grad_refs`` the first sample's gradients are kept by reference (no
        copy: with one sample per step ``p.grad`` itself is ĝ)."""
        est = opt.curvature_estimator
        for group in opt.param_groups:
            params = [p for p in opt.trainable(group) if p.grad is not None]
            if not params:
                continue
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError(f"{type(opt).__name__} does not support sparse gradients")
            if self._add_flat(opt, group, params):
                continue
            self._spill(group)  # earlier samples of this step went to the buckets: one sum per parameter
            states = [opt.state_of(group, p) for p in params]
            grads = TensorList(mixed_precision.upcast(opt, p, p.grad.detach()) for p in params)
            curvs = None
            if est is not None:
                noise = TensorList(flat.noise_of(opt, p) for p in params) if opt.needs_noise else None
                sqrt_prec = _sqrt_precision(opt, group, params, states)
                sample = CurvatureInput(
                    group, params, grads, noise, states, sqrt_prec, opt.noise_source.generator, opt.num_steps
                )
                with torch.no_grad():
                    curvs = est.estimate(sample)
            for i, p in enumerate(params):
                _add(self.grads, p, grads[i], keep_grad_refs)
                if curvs is not None:
                    _add(self.curvs, p, mixed_precision.upcast(opt, p, curvs[i]), keep_ref=True)
        self.count += 1

    def _add_flat(self, opt: Any, group: dict[str, Any], params: list[Tensor]) -> bool:
        """The sample of a group whose parameters all have a gradient, into its buckets' flat sums (True),
        or False for the per-tensor path."""
        trainable = opt.trainable(group)
        if not flat.enabled(opt) or len(params) != len(trainable) or any(p in self.grads for p in params):
            return False
        buckets = flat.buckets_of(opt, group, params, [opt.state_of(group, p) for p in params])
        if buckets is None:
            return False
        for b in buckets:
            first = all(b is not pending for _, pending in self.buckets)
            flat.add_sample(b, first, _bucket_estimator(opt, group, b))
            if first:
                self.buckets.append((group, b))
        return True

    def _spill(self, group: dict[str, Any]) -> None:
        """Move the pending bucket sums of ``group`` into per-parameter sums (copies: θ's buffer, where a
        bucket keeps its Σĝ, is written by the next draw), for a sample that takes the per-tensor path (a
        parameter without a gradient): every parameter then has one sum and the group one update."""
        for b in [b for g, b in self.buckets if g is group]:
            grads = b.pieces(b.grad.clone())
            curvs = b.pieces(b.curv.clone()) if b.curv is not None else None
            for i, p in enumerate(b.params):
                self.grads[p] = grads[i].view(b.locals[i].shape)
                if curvs is not None:
                    self.curvs[p] = curvs[i].view(b.locals[i].shape)
            b.grad = b.curv = None
            self.buckets = [(h, c) for h, c in self.buckets if c is not b]

    def clear(self) -> None:
        self.grads.clear()
        self.curvs.clear()
        for _, b in self.buckets:
            b.grad = b.curv = None
        self.buckets.clear()
        self.count = 0

    def sums(self, param_groups: list[dict[str, Any]]) -> list[GroupSums]:
        """The pending sums of each group that has any, in the groups' parameter order."""
        out = []
        for group in param_groups:
            out += [
                GroupSums(
                    g, b.params, TensorList([b.grad]), None if b.curv is None else TensorList([b.curv]), b
                )
                for g, b in self.buckets
                if g is group
            ]
            params = self.params(group)
            if not params:
                continue
            grads = TensorList(self.grads[p] for p in params)
            curvs = TensorList(self.curvs[p] for p in params) if params[0] in self.curvs else None
            out.append(GroupSums(group, params, grads, curvs))
        return out

    @staticmethod
    def reduce(sums: list[GroupSums], *, independent: bool, local: bool) -> None:
        """Under torch.distributed, average over ranks (in place) what each rank computed from its own
        data: ĝ and ĥ with independent rank noise, else ĥ if the estimator is ``local``. A no-op in a single
        process. (The sums over MC samples are averaged; the division by the sample count comes after.)"""
        local = {"grad", "curv"} if independent else ({"curv"} if local else set())
        if not dist_util.is_distributed() or not local:
            return
        tensors: list[Tensor] = []
        for s in sums:
            if "grad" in local:  # with mc_samples=1 ĝ is p.grad itself, averaged in place as DDP would
                tensors += s.grads.tensors
            if "curv" in local and s.curvs is not None:
                tensors += s.curvs.tensors
        dist_util.all_reduce_mean_(tensors)

    @staticmethod
    def all_finite(sums: list[GroupSums], loss: Tensor | None) -> bool:
        """One fused finiteness check of every sum (and the loss), agreed by all ranks."""
        everything = [t for s in sums for t in (*s.grads, *(s.curvs or []))]
        if loss is not None:
            everything.append(loss.reshape(1))
        return dist_util.all_agree(TensorList(everything).all_finite())

    def mean_(self, sums: list[GroupSums]) -> None:
        """Turn the sums into means over the samples, in place."""
        if self.count > 1:
            scale = 1.0 / self.count
            for s in sums:
                s.grads.mul_(scale)
                if s.curvs is not None:
                    s.curvs.mul_(scale)

    @staticmethod
    def nonfinite_message(name: str, sums: list[GroupSums], param_groups: list[dict[str, Any]], loss) -> str:
        where = ", ".join(SampleAccumulator.nonfinite_places(sums, param_groups))
        what = where or f"the loss ({loss.item() if loss is not None else 'n/a'})"
        return (
            f"{name}: non-finite gradient or curvature in {what}. The parameters and optimizer state are "
            "unchanged. Check the loss for NaN/Inf, lower the learning rate or the initial variance "
            "(init_prec), or pass skip_nonfinite=True to skip such steps."
        )

    @staticmethod
    def nonfinite_places(sums: list[GroupSums], param_groups: list[dict[str, Any]]) -> list[str]:
        """``param_groups[i]['params'][j] (shape ...)`` for each parameter with a non-finite ĝ or ĥ."""
        where = []
        for s in sums:
            gi = next(i for i, g in enumerate(param_groups) if g is s.group)
            grads, curvs = s.per_param()
            bad = set(TensorList(grads).nonfinite_indices()) | set(TensorList(curvs).nonfinite_indices())
            for k in sorted(bad):
                j = next(i for i, q in enumerate(s.group["params"]) if q is s.params[k])
                where.append(f"param_groups[{gi}]['params'][{j}] (shape {tuple(s.params[k].shape)})")
        return where


def _sqrt_precision(opt: Any, group: dict[str, Any], params: list[Tensor], states: list) -> Any:
    """1/σ at the sample: inside a sample the state has not changed since the draw, so this is the value
    the draw computed (no second pass over the state); otherwise it is computed."""
    if opt.needs_noise and all(p in opt._sqrt_prec for p in params):
        return lambda: TensorList(opt._sqrt_prec[p] for p in params)
    return lambda: opt._precision(group, states).sqrt_()


def _bucket_estimator(opt: Any, group: dict[str, Any], b: flat.Bucket) -> Any:
    """ĥ of a bucket's flat sample ĝ from ``opt``'s estimator (element-wise, or per parameter from the
    layers), or None without one: ε and √precision as the draw kept them (else computed from the state)."""
    est = opt.curvature_estimator

    def estimate(grads: Tensor) -> Tensor | list[Tensor] | None:
        if est is None:
            return None
        noise = TensorList([opt.noise_source.buffer(b.param_flat)]) if opt.needs_noise else None
        kept = opt._sqrt_prec.get(b.param_flat)
        sqrt_prec = (
            (lambda: TensorList([kept]))
            if kept is not None
            else lambda: opt._precision(group, [b.state]).sqrt_()
        )
        sample = CurvatureInput(
            group,
            b.params,
            TensorList([grads]),
            noise,
            [b.state],
            sqrt_prec,
            opt.noise_source.generator,
            opt.num_steps,
        )
        with torch.no_grad():
            curvs = est.estimate(sample)
        if not est.elementwise:  # one ĥ per parameter (hooks), which the bucket gathers
            return list(curvs)
        curv = curvs[0]
        return curv if curv.dtype == b.mu.dtype else curv.to(b.mu.dtype)

    return estimate


def _add(acc: dict[Tensor, Tensor], p: Tensor, value: Tensor, keep_ref: bool) -> None:
    if p in acc:
        acc[p].add_(value)
    else:
        acc[p] = value if keep_ref else value.clone()
