"""Per-rank optimizer state under FSDP2 (issue 34, item 4): bytes each rank keeps, at 1, 2 and 4 ranks.

Every element-wise rule steps an MLP (784-512-512-10, float32, 669,706 weights) whose Linear layers and whole
model are wrapped by ``fully_shard``, on R CPU processes (gloo), two steps with the rule's defaults and
``noise="chunked"``. Counted on each rank: the bytes of its optimizer state tensors (``opt.state``: the
rule's moments and precisions of its shards; the flat buffers' θ is not state) and of its parameter shards.

    PYTHONPATH=src python benchmarks/fsdp_state_memory.py        # about a minute on 2 cores; prints the table
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import ngvi

RULES = ("Vadam", "Vprop", "VON", "VadaGrad", "IVON", "NoisyAdam", "BAdam")
OPTIONS = {"VON": {"curvature": "price", "lr": 0.01}}


def _state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(
        v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v)
    )


def _worker(rank: int, world: int, port: int, queue: mp.Queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.fsdp import fully_shard

    try:
        gen = torch.Generator().manual_seed(0)
        x, y = torch.randn(8, 784, generator=gen), torch.randint(0, 10, (8,), generator=gen)
        for name in RULES:
            torch.manual_seed(0)
            net = nn.Sequential(
                nn.Linear(784, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 10)
            )
            for layer in net:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer)
            fully_shard(net)
            sized = {} if name == "VadaGrad" else {"data_size": 60_000}
            opt = getattr(ngvi, name)(net.parameters(), **sized, **OPTIONS.get(name, {}))  # chunked noise

            def closure(net=net, opt=opt) -> torch.Tensor:
                opt.zero_grad()
                loss = nn.functional.cross_entropy(net(x), y)
                loss.backward()
                return loss

            for _ in range(2):
                opt.step(closure)
            shard = sum(p.to_local().numel() * p.element_size() for p in net.parameters())
            queue.put((world, rank, name, _state_bytes(opt), shard))
    finally:
        dist.destroy_process_group()


def main() -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    rows: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for world in (1, 2, 4):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.start_processes(_worker, args=(world, port, queue), nprocs=world, start_method="spawn")
        for _ in range(world * len(RULES)):
            w, _, name, state, shard = queue.get()
            rows.setdefault((name, w), []).append((state, shard))
        print(f"world {world} done", file=sys.stderr, flush=True)
    lines = [
        "| rule | state per weight, 1 rank | largest rank, 2 ranks (× 1 rank) | 4 ranks (× 1 rank) |",
        "|---|---|---|---|",
    ]
    for name in RULES:
        one = max(s for s, _ in rows[name, 1])
        weights = rows[name, 1][0][1] / 4  # float32
        cells = [f"{one / weights:.2f} B ({one / 2**20:.2f} MiB)"]
        for world in (2, 4):
            most = max(s for s, _ in rows[name, world])
            cells.append(f"{most / 2**20:.2f} MiB ({most / one:.3f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
