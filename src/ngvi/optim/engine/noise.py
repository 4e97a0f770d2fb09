r"""The noise source of the engine: where every ε ~ N(0, I) of a weight sample comes from.

One ``torch.Generator`` per device, seeded from one integer, so that a run is reproducible and a resume is
bit-identical. Each draw takes ε parameter by parameter in group order, with ``tensor.normal_(generator=g)``.

* ``mode="antithetic"``: samples come in pairs (ε, −ε). The first of a pair remembers the RNG state it
  started from (``pair_start``); the second negates the kept buffers instead of drawing.
* ``mode="chunked"``: independent ε as ``"normal"``, drawn in chunks from generators seeded by (seed, draw
  count, parameter, chunk) on several threads (:mod:`.chunked`): the same ε at any thread count, another
  stream than ``"normal"``'s.
* ``dtype``: draw ε in another floating dtype (float32 noise for float64 parameters is ~4× faster on CPU).
* ``rank_noise="independent"`` under ``torch.distributed``: each draw reseeds from (seed, rank, draw count),
  so every rank's sample is its own MC sample; ``"shared"`` (default) keeps rank 0's stream on all ranks.

:meth:`checkpoint` / :meth:`rollback` undo draws whose sample was discarded (an exception in the closure, a
non-finite step), so that the stream continues as if they never happened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ... import _validation as check
from ... import distributed as dist_util
from .chunked import chunked_normal_part_

__all__ = ["NOISES", "NoiseCheckpoint", "NoiseSource"]

NOISES = ("normal", "antithetic", "chunked")
#: a flat bucket's parameters: (start in the bucket, length, the whole parameter's size, this part's start)
Segments = list[tuple[int, int, int, int]] | None


@dataclass(frozen=True)
class NoiseCheckpoint:
    """What a discarded draw must roll back."""

    rng: dict[str, Tensor]
    num_draws: int
    pair_start: dict[str, Tensor] | None
    negated: bool


def dtype_name(dtype: torch.dtype | None) -> str | None:
    """``torch.float32`` → ``"float32"`` (plain strings keep ``torch.load(weights_only=True)`` working)."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


class NoiseSource:
    """Seeded standard-normal draws for the parameters, with kept buffers where the rule reads ε.

    Args:
        seed: the seed of every generator (rank 0's under ``torch.distributed``).
        mode: ``"normal"``, ``"antithetic"`` or ``"chunked"``.
        dtype: dtype of ε (``None``: the parameter's).
        rank_noise: ``"shared"`` or ``"independent"`` (see :mod:`ngvi.distributed`).
        keep: keep each parameter's ε after the draw (the rule's curvature reads it); antithetic noise
            always keeps it.
    """

    def __init__(self, seed: int, mode: str, dtype: torch.dtype | None, rank_noise: str, keep: bool) -> None:
        self.seed = seed
        self.mode = mode
        self.dtype = dtype
        self.rank_noise = rank_noise
        self.keep = keep or mode == "antithetic"
        self.num_draws = 0  # samples drawn so far (the counter of rank_noise="independent")
        self.pair_start: dict[str, Tensor] | None = None  # RNG state before an antithetic pair's ε
        self._init_transient()

    @classmethod
    def configured(
        cls, seed: int | None, mode: str, dtype: torch.dtype | None, rank_noise: str, keep: bool
    ) -> NoiseSource:
        """A source from user arguments, validated; under torch.distributed every rank takes rank 0's seed."""
        return cls(
            dist_util.broadcast_seed(check.seed(seed)),
            check.choice("noise", mode, NOISES),
            check.noise_dtype(dtype),
            check.choice("rank_noise", rank_noise, dist_util.RANK_NOISE),
            keep,
        )

    def reseed(self, seed: int) -> None:
        """Generators created from now on start from ``seed``."""
        self.seed = check.seed(seed)

    def _init_transient(self) -> None:
        self._generators: dict[torch.device, torch.Generator] = {}
        self._buffers: dict[Tensor, Tensor] = {}  # ε of the current sample (keep, antithetic)
        self._negated = False  # antithetic: the buffers hold −ε
        self._reseed_to: int | None = None
        self._index = 0  # chunked: the position of the next parameter in the current draw
        self._replay = False  # antithetic: the pair's ε must be redrawn at the next draw (redraw_pair)

    # -- generators and their state --------------------------------------------------------------------
    def generator(self, device: torch.device) -> torch.Generator:
        """The generator for ``device`` (also for a rule's own draws: Rademacher z, sampled targets)."""
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device)
            gen.manual_seed(self._reseed_to if self._reseed_to is not None else self.seed)
            self._generators[device] = gen
        return gen

    def rng_state(self) -> dict[str, Tensor]:
        return {str(dev): gen.get_state() for dev, gen in self._generators.items()}

    def set_rng_state(self, states: dict[str, Tensor]) -> None:
        for dev, state in states.items():
            self.generator(torch.device(dev)).set_state(state)

    def checkpoint(self) -> NoiseCheckpoint:
        return NoiseCheckpoint(self.rng_state(), self.num_draws, self.pair_start, self._negated)

    def rollback(self, checkpoint: NoiseCheckpoint) -> None:
        for dev in [d for d in self._generators if str(d) not in checkpoint.rng]:
            del self._generators[dev]  # created by the discarded draw: recreated from the seed when needed
        self.set_rng_state(checkpoint.rng)
        self.num_draws, self.pair_start = checkpoint.num_draws, checkpoint.pair_start
        if checkpoint.negated != self._negated:  # the antithetic buffers were flipped by the discarded draw
            for buf in self._buffers.values():
                buf.neg_()
            self._negated = checkpoint.negated

    # -- one draw --------------------------------------------------------------------------------------------
    def begin_draw(self, params: list[Tensor]) -> bool:
        """Start a sample over ``params`` (what each ε is drawn for, in draw order: parameters or the engine's
        flat buckets); returns True for the second of an antithetic pair (ε ← −ε)."""
        if self.rank_noise == "independent" and dist_util.is_distributed():
            # each draw's stream depends only on (seed, rank, draw counter)
            seed = dist_util.rank_seed(self.seed, dist_util.rank(), self.num_draws)
            for gen in self._generators.values():
                gen.manual_seed(seed)
            self._reseed_to = seed  # generators created later in this draw start here too
        self._index = 0
        reuse = self.mode == "antithetic" and self.pair_start is not None
        if reuse and self._replay:
            self._replay_pair(params)
        if self.mode == "antithetic" and not reuse:
            for p in params:  # the generators this draw will use exist before the pair's state is taken
                self.generator(p.device)
            self.pair_start = self.rng_state()
        return reuse

    def end_draw(self, reuse: bool) -> None:
        if self.mode == "antithetic":
            self._negated = reuse
            if reuse:
                self.pair_start = None
        self.num_draws += 1

    def draw(self, p: Tensor, reuse: bool, segments: Segments = None) -> Tensor:
        """ε for p: with ``reuse`` (the second of an antithetic pair) −ε of the pair's first, else fresh.
        ``segments``: p is a flat bucket of parameters (:mod:`.flat`), which keys chunked noise."""
        buf = self._buffers.get(p) if reuse else None
        if buf is None:
            return self.fresh(p, segments)
        return buf if self._negated else buf.neg_()

    def fresh(self, p: Tensor, segments: Segments = None) -> Tensor:
        """A fresh ε ~ N(0, I) shaped like p, kept as p's buffer when ``keep``."""
        if not self.keep:
            return self._normal_like(p, segments)
        buf = self._buffers.get(p)
        if buf is None:
            buf = self._buffers[p] = torch.empty_like(p, memory_format=torch.preserve_format)
        if self.dtype in (None, p.dtype):
            return self._fill(buf, segments)
        return buf.copy_(self._normal_like(p, segments))

    def into(self, p: Tensor, segments: Segments = None) -> Tensor:
        """Draw ε straight into p (no buffer: the fast path when nothing reads ε later); returns p."""
        if self.dtype in (None, p.dtype) and p.is_contiguous():
            return self._fill(p, segments)
        return p.copy_(self._normal_like(p, segments))

    def zeros(self, p: Tensor) -> Tensor:
        """ε = 0 for a parameter the draw leaves at μ (it is sampled elsewhere); no RNG is consumed."""
        return self._buffers.setdefault(p, torch.zeros_like(p))

    def has_buffer(self, p: Tensor) -> bool:
        return p in self._buffers

    def buffer(self, p: Tensor) -> Tensor:
        """The kept ε of p's current sample."""
        return self._buffers[p]

    def _normal_like(self, p: Tensor, segments: Segments = None) -> Tensor:
        buf = torch.empty_like(p, dtype=self.dtype or p.dtype, memory_format=torch.preserve_format)
        return self._fill(buf, segments)

    def _fill(self, out: Tensor, segments: Segments = None) -> Tensor:
        """``out`` ← N(0, I): from the device's generator (one draw, also for a bucket), or (chunked) from
        (seed, draw, position), a bucket's parameters each keyed by its own position and by where its part
        lies in the whole parameter (a shard's part: :mod:`.sharded`)."""
        if self.mode != "chunked" or not out.is_contiguous():
            return out.normal_(generator=self.generator(out.device))
        self.generator(out.device)  # exists, as after any draw: the state (and its checks) expect it
        seed = self._reseed_to if self._reseed_to is not None else self.seed
        flat = out.view(-1)
        for start, length, total, offset in segments or [(0, out.numel(), out.numel(), 0)]:
            self._index += 1
            part = flat.narrow(0, start, length)
            chunked_normal_part_(part, total, offset, seed, self.num_draws, self._index - 1)
        return out

    def redraw_pair(self) -> None:
        """After a load, an unpickling or a failed draw mid antithetic pair: the pair's ε is redrawn from its
        saved RNG state at the next draw (so that sample is −ε, as without the interruption)."""
        self._buffers.clear()
        self._negated = False
        self._replay = self.pair_start is not None

    @torch.no_grad()
    def _replay_pair(self, params: list[Tensor]) -> None:
        """The pair's first ε again, from its saved RNG state, then back to the current RNG state."""
        self._replay = False
        now = self.rng_state()
        self.set_rng_state(self.pair_start)
        for p in params:
            self.fresh(p)
        self.set_rng_state(now)

    # -- persistence ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "seed": self.seed,
            "rng": self.rng_state(),
            "num_draws": self.num_draws,
            # the stream's kind, checked at load (state_checks): another one would resume another run
            "noise": self.mode,
            "noise_dtype": dtype_name(self.dtype),
        }
        if self.pair_start is not None:  # mid antithetic pair: ε is redrawn from here on load
            out["pair_start"] = self.pair_start
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = int(state["seed"])
        self.num_draws = int(state.get("num_draws", 0))
        self._generators.clear()
        self.set_rng_state(state["rng"])
        self.pair_start = state.get("pair_start") if self.mode == "antithetic" else None
        self.redraw_pair()

    def __getstate__(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("_generators", "_buffers", "_negated")}
        out["_rng"] = self.rng_state()
        return out

    def __setstate__(self, state: dict[str, Any]) -> None:
        rng = state.pop("_rng")
        self.__dict__.update(state)
        self._init_transient()
        self.set_rng_state(rng)
