"""Step time and peak memory of VOGN and noisy K-FAC relative to torch.optim.Adam, measured in one run.

    python -m ngvi.experiments.bench.curvature --threads 1,2     # CPU; writes docs/results/bench/curvature.md
    python -m ngvi.experiments.bench.curvature --device cuda --out -   # print only

Models: the MLP 784-1000-1000-10 (batch 256) and a small CNN (conv 32 → pool → conv 64 → pool → 128 → 10 on
1×28×28, batch 256), random data. Every optimizer trains its own copy of the same initial weights.

**Time.** After a warm-up, the optimizers take turns one step at a time (``rounds`` × 20 steps each), so
that changes in the load of the machine hit all of them alike. A step is what a training loop
does: ``opt.step(closure)`` with zero_grad, forward, loss, backward inside the closure (for Adam the closure
is called, then ``adam.step()``). Adam and VOGN are reported by the median step; noisy K-FAC by its mean
over whole inversion cycles (its amortised step: 19 cheap steps and one with the factor inversions).
Two more rows time a plain forward/backward and the same with the curvature hooks computing VOGN's
(1/M)Σᵢgᵢ² (no optimizer): the cost of the per-example statistics on their own. ``ngvi.Vadam`` is timed
too: it draws and restores weight samples exactly as VOGN does (the engine), without per-example statistics.

**Memory.** The peak of live tensor bytes during one training step, from the torch.profiler memory
timeline (``profile_memory=True``): parameters, gradients, optimizer state, activations and every
temporary, as the allocator sees them (on CUDA, ``torch.cuda.max_memory_allocated`` over the step).
Python-side and allocator-cache overheads are not counted. Ratios are against Adam's peak.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import ngvi
from ngvi.experiments.bench.measure import mlp
from ngvi.experiments.core import models

INV_EVERY = 20


def make_optimizers(model: nn.Module, n: int) -> dict[str, tuple[torch.optim.Optimizer, bool]]:
    """name -> (optimizer, whether its closure returns (loss, output) without backward)."""

    def copy_of():
        return copy.deepcopy(model)

    models = {}
    opts = {}
    models["adam"] = copy_of()
    opts["adam"] = (torch.optim.Adam(models["adam"].parameters(), lr=1e-3, foreach=True), False)
    # A tight initial posterior (σ₀ ≈ 0.01) keeps the random-data losses tame; it does not change the cost.
    # Vadam samples weights the same way but needs no per-example statistics: VOGN/Vadam isolates their cost.
    models["vadam"] = copy_of()
    opts["vadam"] = (ngvi.Vadam(models["vadam"].parameters(), n, lr=1e-3, init_prec=1e4, seed=0), False)
    models["vogn"] = copy_of()
    opts["vogn"] = (ngvi.VOGN(models["vogn"], n, lr=1e-3, beta=1e-3, init_prec=1e4, seed=0), False)
    models["vogn-fisher"] = copy_of()
    opts["vogn-fisher"] = (
        ngvi.VOGN(
            models["vogn-fisher"],
            n,
            lr=1e-3,
            init_prec=1e4,
            curvature="fisher",
            likelihood="categorical",
            seed=0,
        ),
        True,
    )
    models["noisy-kfac"] = copy_of()
    opts["noisy-kfac"] = (
        ngvi.NoisyKFAC(models["noisy-kfac"], n, lr=1e-3, prior_var=1e-4, inv_every=INV_EVERY, seed=0),
        False,
    )
    return {k: (models[k], *opts[k]) for k in opts}


def step_fn(model, opt, fisher: bool, x, y) -> Callable[[], None]:
    if isinstance(opt, ngvi.VariationalOptimizer):

        def closure():
            opt.zero_grad()
            out = model(x)
            loss = F.cross_entropy(out, y)
            if fisher:
                return loss, out
            loss.backward()
            return loss

        return lambda: opt.step(closure)

    def adam_step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return adam_step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_step_bytes(step: Callable[[], None], device: torch.device) -> float:
    """Peak live tensor bytes during one step (after the step before it, so the state exists)."""
    step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        step()
        sync(device)
        return float(torch.cuda.max_memory_allocated(device))
    from torch.profiler import _memory_profiler

    cpu = [torch.profiler.ProfilerActivity.CPU]
    options = dict(profile_memory=True, record_shapes=True, with_stack=True)
    with torch.profiler.profile(activities=cpu, **options) as prof:
        step()
    timeline = _memory_profiler.MemoryProfileTimeline(prof._memory_profile())
    _, sizes = timeline._coalesce_timeline(torch.device("cpu"))
    return float(np.asarray(sizes).sum(1).max())


def backward_steps(model: nn.Module, x, y) -> dict[str, Callable[[], None]]:
    """A plain forward/backward, and the same with the hooks and VOGN's (1/M)Σᵢgᵢ² (no optimizer)."""
    model = copy.deepcopy(model)
    hooks = ngvi.curvature.CurvatureHooks(model)

    def plain():
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()

    def hooked():
        with hooks.recording():
            plain()
            hooks.mean_sq_grads()

    return {"backward": plain, "backward+hooks": hooked}


def bench_model(name, factory, batch, n_rounds, warmup, device, seed=0) -> list[dict]:
    torch.manual_seed(seed)
    model = factory().to(device)
    x = torch.randn(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    entries = make_optimizers(model, n=60000)
    steps = {k: step_fn(m, o, fisher, x, y) for k, (m, o, fisher) in entries.items()}
    steps.update(backward_steps(model, x, y))
    for step in steps.values():
        for _ in range(warmup):
            step()
    times = {k: [] for k in steps}
    for _ in range(n_rounds * INV_EVERY):  # one step of each in turn: load changes hit all alike
        for k, step in steps.items():
            sync(device)
            t0 = time.perf_counter()
            step()
            sync(device)
            times[k].append(time.perf_counter() - t0)
    memory = {k: peak_step_bytes(step, device) for k, step in steps.items()}
    rows = []
    for k in steps:
        med, mean = statistics.median(times[k]), statistics.fmean(times[k])
        amortised = k == "noisy-kfac"
        reference = "backward" if k.startswith("backward") else "adam"
        ref = statistics.fmean(times[reference]) if amortised else statistics.median(times[reference])
        rows.append(
            dict(
                threads=torch.get_num_threads(),
                model=name,
                optimizer=k,
                median_ms=1e3 * med,
                mean_ms=1e3 * mean,
                time_ratio=(mean if amortised else med) / ref,
                ratio_of=("mean, amortised" if amortised else "median") + f", vs {reference}",
                peak_mb=memory[k] / 2**20,
                memory_ratio=memory[k] / memory[reference],
                steps=len(times[k]),
            )
        )
    return rows


def table(rows: list[dict]) -> str:
    head = "| threads | model | step | median ms | mean ms | time ratio | peak MB | memory ratio |"
    lines = [head, "|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['threads']} | {r['model']} | {r['optimizer']} | {r['median_ms']:.1f} | "
            f"{r['mean_ms']:.1f} | **{r['time_ratio']:.2f}** ({r['ratio_of']}) | {r['peak_mb']:.1f} | "
            f"{r['memory_ratio']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=4, help="timed steps per optimizer, in units of 20")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument(
        "--threads", default="0", help="intra-op thread counts, e.g. 1,2 (0: torch's default)"
    )
    parser.add_argument("--out", default="docs/results/bench/curvature.md", help="Markdown file or -")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    factories = {"mlp": mlp, "cnn": models.cnn}
    rows = []
    default_threads = torch.get_num_threads()
    for threads in [int(t) or default_threads for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for name in args.models.split(","):
            new = bench_model(name, factories[name], args.batch, args.rounds, args.warmup, device)
            print(table(new), flush=True)
            rows += new
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    )
    command = " ".join(argv if argv is not None else sys.argv[1:])
    report = "\n".join(
        [
            "# Curvature optimizers: step time and peak memory relative to Adam",
            "",
            f"`python -m ngvi.experiments.bench.curvature {command}`",
            "",
            f"torch {torch.__version__}, {device.type} ({where}), batch {args.batch}, "
            f"{args.rounds}×{INV_EVERY} timed steps per optimizer after {args.warmup} warm-up steps, "
            "the optimizers taking turns one step at a time.",
            "",
            table(rows),
            "",
            "Time ratio: median step against Adam's median for Adam, Vadam and VOGN; noisy K-FAC is the "
            "mean over whole cycles of inv_every=20 steps (amortised) against Adam's mean. The `backward` "
            "rows are a plain forward/backward and the same with the curvature hooks and VOGN's "
            "(1/M)Σᵢgᵢ², no optimizer: the cost of the per-example statistics alone. Memory: peak live "
            "tensor bytes during one step (torch.profiler memory timeline on CPU; "
            "torch.cuda.max_memory_allocated on CUDA).",
            "",
        ]
    )
    if args.out == "-":
        print(report)
    else:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
