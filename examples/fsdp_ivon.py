"""IVON on a model sharded by FSDP2 (``fully_shard``) under torchrun: CPU/gloo or GPU/NCCL, no code change.

    torchrun --nproc_per_node=2 examples/fsdp_ivon.py     # each rank keeps half of μ, h and the momentum

Each Linear layer and the whole model are wrapped with ``fully_shard``: every parameter is a DTensor whose
rows are split over the ranks, and the optimizer keeps only the rank's part of its state. ``noise="chunked"``
keys each weight's ε by its place in the whole parameter, so R ranks × batch B take the steps of one process
with batch R·B and ``noise="chunked"`` (tests/test_fsdp2.py checks it for every element-wise rule). The
rules that sample or estimate curvature across whole layers (VOGN, the K-FAC family, noisy Adam's
per-example curvature) refuse sharded parameters: use DDP for them (examples/ddp_train.py). ``posterior()``
gathers whole tensors on every rank. Run with plain ``python`` it trains as a world of one.

    python examples/fsdp_ivon.py --width 4096 --compare-adamw   # ms/step beside AdamW, same wrapping
"""

from __future__ import annotations

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import ngvi


def build(width: int, device: torch.device) -> nn.Module:
    """The regression MLP 1-width-width-1, each Linear and the whole model wrapped with ``fully_shard``."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(1, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 1)
    )
    model.to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def train(model: nn.Module, opt: torch.optim.Optimizer, x, y, steps: int, batch: int, verbose: bool) -> float:
    """``steps`` steps of ``opt.step(closure)``; ms per step over the steps after the first 10."""
    rank, world = dist.get_rank(), dist.get_world_size()
    sync = torch.accelerator.synchronize if x.device.type != "cpu" else (lambda: None)
    for step in range(steps):
        if step == min(10, steps - 1):
            sync()
            start, timed = time.perf_counter(), steps - step
        lo = (step * batch * world) % (len(x) - batch * world) + rank * batch
        xb, yb = x[lo : lo + batch], y[lo : lo + batch]

        def closure(xb=xb, yb=yb) -> torch.Tensor:
            opt.zero_grad()
            loss = 0.5 * ((model(xb) - yb) ** 2).mean() / 0.01  # mean Gaussian NLL, noise std 0.1
            loss.backward()
            return loss

        loss = opt.step(closure)
        if verbose and rank == 0 and (step % 50 == 0 or step == steps - 1):
            print(f"step {step:4d}  rank 0's loss {loss.item():8.3f}")  # a host read: outside the timing
    sync()
    return (time.perf_counter() - start) / timed * 1e3


def main(steps: int = 200, batch: int = 32, width: int = 256, compare_adamw: bool = False) -> None:
    if "RANK" not in os.environ:  # plain `python`: a world of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    dist.init_process_group(dist.get_default_backend_for_device(accelerator) if accelerator else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = (
        torch.device(accelerator.type, int(os.environ["LOCAL_RANK"])) if accelerator else torch.device("cpu")
    )
    if device.type != "cpu":
        torch.accelerator.set_device_index(device.index)

    gen = torch.Generator().manual_seed(0)  # the same data on every rank; each reads its own rows
    x = torch.rand(4096, 1, generator=gen) * 4 - 2
    y = torch.sin(3 * x) + 0.1 * torch.randn(x.shape, generator=gen)
    x, y = x.to(device), y.to(device)
    model = build(width, device)
    opt = ngvi.IVON(model.parameters(), data_size=len(x), lr=0.02, hess_init=10.0)  # chunked noise
    ms = train(model, opt, x, y, steps, batch, verbose=not compare_adamw)
    state = sum(v.numel() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))
    whole = sum(p.numel() for p in model.parameters())
    std = torch.cat([v.sqrt().flatten() for v in opt.posterior().variance])  # gathered on every rank
    if rank == 0:
        print(
            f"IVON: {ms:.2f} ms/step; rank 0 keeps {state / whole:.2f} state tensors per weight of the whole "
            f"model ({whole:,} weights, {world} rank(s), {device.type}); posterior std: median "
            f"{std.median().item():.4f}"
        )
    if compare_adamw:  # the same wrapping, data and loop with torch's AdamW
        model = build(width, device)
        adamw = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device.type != "cpu" or None)
        adamw_ms = train(model, adamw, x, y, steps, batch, verbose=False)
        if rank == 0:
            print(
                f"AdamW{' (fused)' if device.type != 'cpu' else ''}: {adamw_ms:.2f} ms/step; IVON "
                f"{ms / adamw_ms:.2f}× AdamW"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=256, help="hidden width (4096: ~17M weights)")
    ap.add_argument(
        "--compare-adamw", action="store_true", help="also time AdamW under the same FSDP2 wrapping"
    )
    args = ap.parse_args()
    main(args.steps, args.batch, args.width, args.compare_adamw)
