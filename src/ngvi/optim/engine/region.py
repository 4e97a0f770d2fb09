"""One update of the parameter groups, with one trust-region ν per group however the update is cut.

A group's update runs as calls of its rule's core on pieces: the CPU pieces of a flat bucket, the buckets of a
group with several dtypes or devices, the slices of the per-tensor path, one FSDP2 rank's shards. A core with
a trust region (:func:`~ngvi.optim.functional.blocks.region_core`) stops before it moves μ and yields its
terms of m = Σ u²/P. :class:`GroupUpdate` runs every call to that point, sums m over all the pieces of a
scope (the group, or the group that ``empirical_bayes="layer"`` split into one per tensor), over the ranks
in one all-reduce where a piece is a shard, and sends every piece the same ν. So a step means the same on
every path: one piece or four, flat or per tensor, one process or R.

A scope updated in one call with no shards runs its core to the end as before (compiled where asked); the
ν it takes itself is the one :class:`GroupUpdate` would send.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator, Hashable
from typing import Any

import torch
from torch import Tensor

from ..functional._capture import deferring_region
from ..functional.blocks import LengthSum, RegionTerm, trust_region


class GroupUpdate:
    """The calls of one step's update, each with its scope; :meth:`run` runs them (see the module)."""

    def __init__(self) -> None:
        self._calls: list[tuple[Hashable, bool, Callable[[], Any]]] = []
        self._after: list[Callable[[], None]] = []

    def add(self, scope: Hashable, call: Callable[[], Any], *, sharded: bool = False) -> None:
        """``call()`` runs the rule's update on one piece of ``scope`` (it returns what ``_update`` does)."""
        self._calls.append((scope, sharded, call))

    def then(self, action: Callable[[], None]) -> None:
        """``action()`` after every piece has moved μ (a write-back, joining a bucket's state)."""
        self._after.append(action)

    def run(self) -> None:
        counts = Counter(scope for scope, _, _ in self._calls)
        sharded = {scope for scope, shard, _ in self._calls if shard}
        waiting: list[tuple[Hashable, Generator[RegionTerm, Tensor, None]]] = []
        lengths: dict[Hashable, _ScopeLength] = {}
        try:
            for scope, _, call in self._calls:
                with deferring_region(counts[scope] > 1 or scope in sharded):
                    steps = call()
                if isinstance(steps, Generator):
                    term = next(steps, None)
                    if term is not None:
                        lengths.setdefault(scope, _ScopeLength()).add(term)
                        term.products = []  # summed: the piece's terms are freed before the next piece
                        waiting.append((scope, steps))
            nus = _nus(lengths, sharded)
            for scope, steps in waiting:
                try:
                    steps.send(nus[scope])
                except StopIteration:
                    continue
                raise RuntimeError("a trust-region core yields once")
        finally:
            for _, steps in waiting:
                steps.close()
        for action in self._after:
            action()


class _ScopeLength:
    """m of one scope, summed as its pieces arrive (:class:`~ngvi.optim.functional.blocks.LengthSum`), with
    its lr and κ. Pieces of another lr (groups split from one, then given their own) are summed apart and
    weighted by α²."""

    def __init__(self) -> None:
        self.parts: list[tuple[Any, LengthSum]] = []
        self.kappas: set[float] = set()

    def add(self, term: RegionTerm) -> None:
        if not self.parts or float(self.parts[-1][0]) != float(term.lr):
            self.parts.append((term.lr, LengthSum()))
        self.parts[-1][1].add(term.products)
        self.kappas.add(float(term.kappa))

    def scaled(self) -> tuple[Tensor, Any]:
        """(m, α) with ν = trust_region(m, lr=α): the one sum where the pieces share α (the bits one call on
        the whole group gives), else Σ α²m with α = 1."""
        if len(self.parts) == 1:
            return self.parts[0][1].total(), self.parts[0][0]
        return sum(part.total() * (lr * lr) for lr, part in self.parts), 1.0


def _nus(lengths: dict[Hashable, _ScopeLength], sharded: set[Hashable]) -> dict[Hashable, Tensor]:
    """ν of each scope; the m of a scope of FSDP2 shards is summed over the ranks first, in one all-reduce
    for all of them (every rank has the same sharded scopes, in the same order: a rank whose shard of a
    group is empty still runs its empty piece)."""
    scaled = {scope: length.scaled() for scope, length in lengths.items()}
    over_ranks = [scope for scope in scaled if scope in sharded]
    if over_ranks:
        stacked = torch.stack([scaled[scope][0].to(torch.float64) for scope in over_ranks])
        torch.distributed.all_reduce(stacked)
        for scope, total in zip(over_ranks, stacked, strict=True):
            m, lr = scaled[scope]
            scaled[scope] = (total.to(m.dtype), lr)
    nus = {}
    for scope, (m, lr) in scaled.items():
        kappas = lengths[scope].kappas
        if len(kappas) > 1:
            raise ValueError(
                "the parameter groups that empirical_bayes='layer' made from one group share one trust "
                f"region, but their kl_clip differ ({sorted(kappas)}): set one kl_clip for them"
            )
        nus[scope] = trust_region(m, lr=lr, kappa=next(iter(kappas)))
    return nus
