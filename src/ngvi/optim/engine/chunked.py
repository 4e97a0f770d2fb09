"""``noise="chunked"``: ε drawn in fixed-size chunks, each from its own generator, on several threads.

torch's CPU ``normal_`` fills a tensor on one thread, so with several threads the draw is the serial part of
a step. Here each parameter's ε is cut into chunks of :data:`CHUNK` elements; chunk k of the parameter at
position i in the draw number t is filled by a ``torch.Generator`` seeded with a hash of (seed, t, i, k).
The chunks are independent of one another and of the order they are filled in, so a seed gives the same ε
at any thread count; a draw depends only on the draw counter, so rollback and resume need no generator
state. torch releases the GIL inside ``normal_``, so a thread pool fills chunks concurrently.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

__all__ = ["CHUNK", "chunk_seed", "chunked_normal_", "chunked_normal_part_"]

CHUNK = 1 << 16  # elements per chunk: large enough that seeding a generator (624 words) is negligible
_MASK = (1 << 64) - 1
_POOLS: dict[int, ThreadPoolExecutor] = {}


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def chunk_seed(*keys: int) -> int:
    """A 63-bit seed from integer keys (seed, draw, parameter, chunk): splitmix64 chained over the keys, so
    neighbouring keys give unrelated seeds."""
    h = 0
    for k in keys:
        h = _splitmix64(h ^ (int(k) & _MASK))
    return h >> 1


def _pool(workers: int) -> ThreadPoolExecutor:
    pool = _POOLS.get(workers)
    if pool is None:
        pool = _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="ngvi-noise")
    return pool


def chunked_normal_(out: Tensor, *keys: int, workers: int | None = None) -> Tensor:
    """Fill the contiguous ``out`` with N(0, 1), chunk k drawn with the seed ``chunk_seed(*keys, k)``,
    on ``workers`` threads (default: torch's thread count); the values do not depend on ``workers``."""
    if not out.is_contiguous():
        raise ValueError("chunked_normal_ needs a contiguous tensor; pass out.contiguous() and copy back")
    flat = out.view(-1)
    starts = range(0, flat.numel(), CHUNK)

    def fill(chunks: range) -> None:
        for k in chunks:
            gen = torch.Generator(device=out.device).manual_seed(chunk_seed(*keys, k))
            flat[starts[k] : starts[k] + CHUNK].normal_(generator=gen)

    workers = torch.get_num_threads() if workers is None else workers
    workers = min(workers, len(starts)) if out.device.type == "cpu" else 1
    if workers <= 1:
        fill(range(len(starts)))
        return out
    # one contiguous run of chunks per thread, this thread filling the first: a task per chunk would cost
    # a hand-off (and the GIL) per 2¹⁶ draws
    bounds = [len(starts) * w // workers for w in range(workers + 1)]
    runs = [range(bounds[w], bounds[w + 1]) for w in range(workers)]
    pending = [_pool(workers - 1).submit(fill, run) for run in runs[1:]]
    try:
        fill(runs[0])
    finally:
        for task in pending:
            task.result()
    return out


def chunked_normal_part_(out: Tensor, total: int, offset: int, *keys: int) -> Tensor:
    """Fill the contiguous ``out`` with elements ``offset … offset + out.numel()`` of what
    ``chunked_normal_`` draws for a tensor of ``total`` elements: a shard's part of its parameter's ε
    (:mod:`.sharded`), the same whatever the split. Each chunk the part overlaps is drawn whole and cut."""
    if offset == 0 and out.numel() == total:
        return chunked_normal_(out, *keys)
    flat = out.view(-1)
    end = offset + flat.numel()
    for k in range(offset // CHUNK, -(-end // CHUNK)):
        lo, hi = k * CHUNK, min((k + 1) * CHUNK, total)
        gen = torch.Generator(device=out.device).manual_seed(chunk_seed(*keys, k))
        chunk = torch.empty(hi - lo, dtype=out.dtype, device=out.device).normal_(generator=gen)
        a, b = max(lo, offset), min(hi, end)
        flat[a - offset : b - offset].copy_(chunk[a - lo : b - lo])
    return out
