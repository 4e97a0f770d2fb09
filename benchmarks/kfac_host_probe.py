"""The K-FAC family's host work per step, on the CPU: the GPU bench's layer structure at negligible compute.

On an H200 the 91M-weight language model's K-FAC step was host-bound (issue 30, item 4: 131 ms per step,
125 of them inside ``step()``, against fused AdamW's 18.7), so what to cut is the Python and the per-layer
small ops, which this probe measures with tiny tensors: ``LanguageModel`` with the full model's 12 blocks
(49 Linear layers and 25 LayerNorms) at width 16, one thread.

``python benchmarks/kfac_host_probe.py [--before DIR] [--rounds 5] [--profile kfac|noisy]``

Per method, with the family's defaults (``inv_every=20``): the median wall ms of a step between inversions
and of an inversion step (one whole 20-step cycle per method per round, the methods interleaved; AdamW
(foreach) and the forward and backward pass alone beside them), the ATen ops dispatched and the host reads
(:class:`~ngvi.experiments.bench.counting.OpCounter`) of each kind of step. ``--before DIR``: DIR holds an
older package as ``ngvi_old`` (``git archive REV src/ngvi | tar -x -C DIR && mv DIR/src/ngvi DIR/ngvi_old``),
measured in the same run. ``--profile``: cProfile of one cycle of that method (ours), top 30 by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import pstats
import statistics
import sys
import time

import torch

import ngvi
from ngvi.experiments.bench.counting import OpCounter
from ngvi.experiments.bench.lm import LanguageModel, LMConfig, lm_batch, lm_loss

CONFIG = LMConfig(blocks=12, width=16, heads=2, vocab=32, context=8, batch=2)
CYCLE = 20  # the family's default inv_every


def stepper(package, kind: str):
    """(step, optimizer or None) for one method on a fresh copy of the model (the same seed for all)."""
    torch.manual_seed(0)
    model = LanguageModel(CONFIG)
    x, y = lm_batch(CONFIG, "cpu")
    params = [p for p in model.parameters() if p.requires_grad]

    def forward_backward():
        for p in params:
            p.grad = None
        logits = model(x)
        return lm_loss(logits, y), logits

    if kind == "fwd+bwd":
        return (lambda: forward_backward()[0].backward()), None
    if kind == "adamw":
        opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)

        def step():
            forward_backward()[0].backward()
            opt.step()

        return step, None
    opt = (
        package.baselines.KFAC(model, data_size=100_000)
        if kind == "kfac"
        else package.NoisyKFAC(model, 100_000)
    )

    def closure():
        loss, logits = forward_backward()
        opt.backward(loss, logits)
        return loss

    return (lambda: opt.step(closure)), opt


def inverting(opt) -> bool:
    """Whether the optimizer's next step inverts its factors (the first, then every ``inv_every``)."""
    return opt is not None and opt.num_steps % CYCLE == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", default="", choices=("", "kfac", "noisy"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    packages = [("", ngvi)]
    if args.before:
        sys.path.insert(0, args.before)
        packages.insert(0, (" before", importlib.import_module("ngvi_old")))
    methods = {"fwd+bwd": stepper(None, "fwd+bwd"), "adamw": stepper(None, "adamw")}
    for tag, package in packages:
        methods[f"kfac{tag}"] = stepper(package, "kfac")
        methods[f"noisy{tag}"] = stepper(package, "noisy")
    for step, _ in methods.values():  # warm-up: the first steps build the state
        for _ in range(3):
            step()
    times = {k: ([], []) for k in methods}  # (between inversions, inversion steps), ms
    for _ in range(args.rounds):
        for k, (step, opt) in methods.items():
            for _ in range(CYCLE):
                inv = inverting(opt)
                t0 = time.perf_counter()
                step()
                times[k][inv].append(1e3 * (time.perf_counter() - t0))
    counts = {}
    for k, (step, opt) in methods.items():  # (ops, host reads) of each kind of step, over one cycle
        seen: tuple[list, list] = ([], [])
        for _ in range(CYCLE):
            inv = inverting(opt)
            with OpCounter() as counter:
                step()
            seen[inv].append((counter.total, counter.sync_count))
        counts[k] = seen
    adamw = statistics.median(times["adamw"][0])
    print(f"LanguageModel({CONFIG}), 1 thread, {args.rounds} rounds of {CYCLE} steps per method")
    print(
        f"{'method':<14} {'ms/step':>8} {'×AdamW':>7} {'ops':>6} {'reads':>5} | "
        f"{'inv ms':>7} {'ops':>6} {'reads':>5}"
    )
    for k in methods:
        between, inv = times[k]
        ms = statistics.median(between)
        ops, reads = counts[k][0][0] if counts[k][0] else (0, 0)
        line = f"{k:<14} {ms:8.2f} {ms / adamw:7.2f} {ops:6d} {reads:5d}"
        if inv:
            inv_ops, inv_reads = counts[k][1][0]
            line += f" | {statistics.median(inv):7.2f} {inv_ops:6d} {inv_reads:5d}"
        print(line)
    if args.profile:
        step, _ = methods[args.profile]
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(CYCLE):
            step()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
