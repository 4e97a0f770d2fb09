r"""Parameters sharded by FSDP2 (``fully_shard``): DTensors whose rows are split over the ranks.

FSDP2 gathers each parameter for the forward pass from its own storage of the local shard, so a sample
cannot be bound to the parameter as elsewhere (``p.data = θ`` would not reach the gathered weights): the
engine writes θ into the local shard in place and writes μ back after the backward pass (the shard's values
are μ between samples). Everything else is per rank and local: the bucket of a group's shards
(:mod:`.flat`) keeps the rank's part of μ, of the state and of the sums, so the state is sharded like the
parameters, and the update is the single-process update on the rank's weights.

The noise must not depend on the number of ranks: with ``noise="chunked"`` the ε of a weight is a function
of (seed, draw, parameter, the weight's position in the whole parameter), drawn chunk by chunk
(:mod:`.chunked`), so a rank draws the chunks its rows overlap and keeps its part. A run on R ranks then
takes the steps of one process with R times the batch (FSDP2 averages the gradients over the ranks).
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from ... import _validation as check


def is_sharded(p: Tensor) -> bool:
    dtensor = check._dtensor_class()
    return dtensor is not None and isinstance(p, dtensor)


def local(t: Tensor) -> Tensor:
    """The rank's shard of a DTensor (no copy), or ``t`` itself."""
    return t._local_tensor if is_sharded(t) else t


def global_offset(p: Tensor) -> int:
    """The position of the rank's shard in the flattened whole parameter: rows are split (``Shard(0)``, what
    FSDP2 does), so the shard is one run of the flat parameter."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if p.device_mesh.ndim != 1 or not all(isinstance(pl, Shard) and pl.dim == 0 for pl in p.placements):
        raise ValueError(
            f"ngvi supports DTensor parameters sharded by rows on a 1-D mesh (FSDP2's fully_shard), got "
            f"placements {p.placements} on a {p.device_mesh.ndim}-D mesh; use fully_shard, or DDP"
        )
    _, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return offset[0] * math.prod(p.shape[1:])


def choose_noise(opt: Any, params: list[Tensor]) -> None:
    """Sharded parameters draw ``noise="chunked"``, the noise that does not depend on the number of ranks:
    chosen here where the caller left ``noise`` unset (before any draw), else a ValueError for other noise
    (the rules off the flat path refuse DTensors before: ``_validation.no_dtensor``)."""
    shards = [p for p in params if is_sharded(p)]
    if not shards:
        return
    for p in shards:  # rows split on a 1-D mesh, or a clear error now rather than at the first draw
        global_offset(p)
    name = type(opt).__name__
    source = opt.noise_source
    if not getattr(opt, "_noise_chosen", True) and source.num_draws == 0 and source.rank_noise == "shared":
        source.mode, source.keep = "chunked", opt.needs_noise
    if source.mode != "chunked" or source.rank_noise != "shared":
        raise ValueError(
            f"{name}: FSDP2-sharded parameters need noise='chunked' (and rank_noise='shared'): each "
            "weight's ε is then keyed by its place in the whole parameter, the same at any number of "
            f"ranks; pass {name}(..., noise='chunked')"
        )


def whole(p: Tensor, part: Tensor) -> Tensor:
    """The whole tensor of which ``part`` is this rank's shard, laid out as ``p`` (a collective: every rank
    calls it)."""
    from torch.distributed.tensor import DTensor

    part = local(part)
    return DTensor.from_local(
        part, p.device_mesh, p.placements, shape=p.shape, stride=p.stride()
    ).full_tensor()


def as_dtensors(p: Tensor, entry: dict[str, Any]) -> dict[str, Any]:
    """A shard's state entry with its tensors as DTensors laid out like ``p`` (no copy), so that a state dict
    describes the whole parameter: ``torch.distributed.checkpoint`` saves and reshards it across world
    sizes, and a load checks its shapes against the whole parameter."""
    from torch.distributed.tensor import DTensor

    shard = local(p).shape
    return {
        k: DTensor.from_local(
            v, p.device_mesh, p.placements, shape=p.shape, stride=p.stride(), run_check=False
        )
        if isinstance(v, Tensor) and not is_sharded(v) and v.shape == shard
        else v
        for k, v in entry.items()
    }


def localise(state: dict[str, Any]) -> None:
    """A loaded state entry's DTensors as the rank's contiguous parts (the engine keeps plain tensors)."""
    for k, v in list(state.items()):
        if isinstance(v, Tensor) and is_sharded(v):
            state[k] = local(v).contiguous()
