"""Multi-process training with ngvi under torchrun (CPU/gloo or GPU/NCCL, no code change).

    torchrun --nproc_per_node=2 examples/ddp_train.py                  # shared noise (default) + DDP
    torchrun --nproc_per_node=2 examples/ddp_train.py --independent    # one MC sample per rank, no DDP
    torchrun --nproc_per_node=2 examples/ddp_train.py --resume ckpt.pt # continue from rank 0's checkpoint

Each rank trains on its own shard of a toy regression set. With the default ``rank_noise="shared"`` every
rank draws the same weights θ ~ q and DDP averages the gradients, so R ranks × batch B take exactly the steps
of one process with batch R·B. With ``--independent`` each rank draws its own θ (an extra MC sample per rank);
the model is then not wrapped in DDP and the optimizer averages gradients and curvature itself.
Rank 0 writes the checkpoint (default ``runs/ddp/ckpt.pt``); any number of ranks can resume from it. Run with
plain ``python`` it trains as a single process. See ``ngvi.distributed``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import ngvi


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--independent", action="store_true", help="rank_noise='independent' (no DDP)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--checkpoint", default="runs/ddp/ckpt.pt", help="written by rank 0 at the end")
    parser.add_argument("--resume", default=None, help="a checkpoint to continue from")
    args = parser.parse_args()
    if "RANK" not in os.environ:  # plain `python`: one process instead of torchrun's environment
        print(
            "not launched by torchrun: training as 1 process (torchrun --nproc_per_node=2 ... for 2)",
            file=sys.stderr,
        )
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )

    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    backend = dist.get_default_backend_for_device(accelerator) if accelerator is not None else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(accelerator.type, int(os.environ.get("LOCAL_RANK", 0))) if accelerator else None
    device = device or torch.device("cpu")
    if device.type != "cpu":
        torch.accelerator.set_device_index(device.index)

    # the same data and initial weights on every rank; each rank reads its own shard of every batch
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(4096, 1, generator=gen) * 4 - 2
    y = torch.sin(3 * x) + 0.1 * torch.randn(x.shape, generator=gen)
    x, y = x.to(device), y.to(device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)

    rank_noise = "independent" if args.independent else "shared"
    opt = ngvi.Vadam(model.parameters(), data_size=len(x), lr=1e-2, init_prec=100.0, rank_noise=rank_noise)
    start = 0
    if args.resume:
        ckpt = torch.load(args.resume, map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        start = ckpt["step"]
    # shared noise: DDP averages p.grad. Independent noise: the optimizer averages ĝ and ĥ itself.
    net = model if args.independent else nn.parallel.DistributedDataParallel(model)

    per_step = args.batch * world
    for step in range(start, start + args.steps):
        lo = (step * per_step) % (len(x) - per_step) + rank * args.batch
        xb, yb = x[lo : lo + args.batch], y[lo : lo + args.batch]

        def closure(xb=xb, yb=yb) -> torch.Tensor:
            opt.zero_grad()
            loss = 0.5 * ((net(xb) - yb) ** 2).mean() / 0.01  # mean Gaussian NLL, noise std 0.1
            loss.backward()
            return loss

        loss = opt.step(closure)
        if step % 50 == 0 or step == start + args.steps - 1:
            total = loss.detach().clone()
            dist.all_reduce(total)
            if rank == 0:
                print(f"step {step:4d}  mean loss over ranks {total.item() / world:8.3f}")

    # every rank holds the same posterior; rank 0 writes it
    std = torch.cat([v.sqrt().flatten() for v in opt.posterior().variance])
    if rank == 0:
        Path(args.checkpoint).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": start + args.steps},
                   args.checkpoint)  # fmt: skip
        print(f"posterior std: median {std.median().item():.4f}; wrote {args.checkpoint}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
