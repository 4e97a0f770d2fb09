r"""Multi-process training with ``torch.distributed``: what the optimizers exchange, and how.

ngvi runs under ``torchrun`` unchanged. Each rank builds the same model and optimizer; the engine
(:class:`ngvi.VariationalOptimizer`) looks at ``torch.distributed`` at construction and at every step, and
does nothing extra in a single process. Two noise semantics, set with ``rank_noise=``:

``"shared"`` (default)
    Every rank draws the **same** ε (rank 0's seed is broadcast at construction), so all ranks evaluate the
    same θ = μ + σ⊙ε. Wrap the model in ``DistributedDataParallel`` as usual: DDP averages ``p.grad``, so
    ĝ is the gradient of the mean loss over all R·B examples, and R ranks × batch B take exactly the step of
    one process with batch R·B. Per-sample curvature computed from ĝ (ĝ², the Price term ĝ⊙ε/σ) is then
    identical on every rank. Curvature a rule computes from **local** data (VOGN's per-example squared
    gradients, noisy K-FAC's factors) is averaged over ranks before the update; rules declare this with
    ``local_statistics = ("curv",)``.

``"independent"``
    Each rank draws its own ε (a stream derived from the shared seed, the rank and a draw counter), so each
    rank contributes one more MC sample: R ranks × batch B act like ``mc_samples=R`` with one shard per
    sample. Do **not** wrap the model in DDP (or run the backward under ``model.no_sync()``): the optimizer
    needs each rank's own ĝ to form its curvature, and averages ĝ and ĥ over ranks itself before the update.

In both modes every rank ends each step with identical μ and optimizer state, the finiteness check is
agreed by all ranks (one rank's NaN skips or raises everywhere), and a checkpoint written by rank 0 resumes
on any number of ranks. Averaging assumes equal per-rank batch sizes, as DDP's gradient averaging does.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "RANK_NOISE",
    "all_agree",
    "all_reduce_mean_",
    "broadcast_seed",
    "is_distributed",
    "rank",
    "rank_seed",
]

#: the values of the optimizers' ``rank_noise``: every rank draws the same θ, or each its own
RANK_NOISE = ("shared", "independent")


def is_distributed() -> bool:
    """True inside an initialised process group with more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank in the default ``torch.distributed`` group (0 when none is initialised)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _device_for_collectives() -> torch.device:
    # gloo reduces CPU tensors; NCCL needs tensors on the rank's current accelerator.
    if dist.get_backend() == "nccl":
        accelerator = torch.accelerator.current_accelerator()
        assert accelerator is not None, "the nccl backend runs only where an accelerator is present"
        return torch.device(accelerator.type, torch.accelerator.current_device_index())
    return torch.device("cpu")


def broadcast_seed(seed: int) -> int:
    """Rank 0's seed on every rank (unchanged in a single process)."""
    if not is_distributed():
        return seed
    buf = torch.tensor([seed], dtype=torch.int64, device=_device_for_collectives())
    dist.broadcast(buf, src=0)
    return int(buf.item())


def rank_seed(seed: int, rank: int, draw: int) -> int:
    """Seed of one rank's ε for its ``draw``-th sample under ``rank_noise="independent"``.

    A hash, so that streams of neighbouring seeds, ranks and draws do not overlap, and so that a rank's
    noise depends only on (seed, rank, draw): a checkpoint resumes on any number of ranks without per-rank
    RNG state.
    """
    digest = hashlib.blake2b(f"ngvi:{seed}:{rank}:{draw}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # < 2**63, a valid manual_seed


def all_reduce_mean_(tensors: list[Tensor]) -> None:
    """Average ``tensors`` over ranks in place, with one collective per dtype (a flat buffer)."""
    if not tensors or not is_distributed():
        return
    world = dist.get_world_size()
    by_dtype: dict[torch.dtype, list[Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    device = _device_for_collectives()
    for same in by_dtype.values():
        flat = torch.cat([t.reshape(-1).to(device) for t in same])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.mul_(1.0 / world)
        offset = 0
        for t in same:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n


def all_agree(flag: bool) -> bool:
    """True only if ``flag`` is True on every rank (so all ranks skip or raise together)."""
    if not is_distributed():
        return flag
    buf = torch.tensor([1 if flag else 0], dtype=torch.int32, device=_device_for_collectives())
    dist.all_reduce(buf, op=dist.ReduceOp.MIN)
    return bool(buf.item())
