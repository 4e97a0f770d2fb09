"""Noisy K-FAC and K-FAC before/after a change, interleaved in one process, one thread.

``python benchmarks/kfac_before_after.py --before DIR --model mlp|cnn``: DIR holds the old package copied as
``ngvi_old`` (``git archive REV src/ngvi | tar -x -C DIR && mv DIR/src/ngvi DIR/ngvi_old``; the core package
imports itself relatively, so both copies load side by side). Adam, old and new noisy K-FAC and old and new
K-FAC take turns, one whole ``inv_every`` cycle each per round, on the bench's problems and settings; the
median step per method, its ratios, and the FLOP floor at the matmul rate measured in the same run.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time

import torch
from torch.nn import functional as F

import ngvi
from ngvi.experiments.bench.flops import kfac_flops, matmul_rate
from ngvi.experiments.bench.measure import problems

CYCLE = 20  # the bench's inv_every for the K-FAC family


def stepper(package, kind: str, problem):
    model = problem.model(torch.device("cpu"))
    x, y = problem.data(torch.device("cpu"))
    if kind == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)

        def step():
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()

        return step
    if kind == "noisy":  # the bench's options (ngvi.experiments.bench.methods.OPTIONS)
        opt = package.NoisyKFAC(model, 60_000, momentum=0.0, inv_every=CYCLE, seed=0)
    else:
        opt = package.baselines.KFAC(model, 60_000, inv_every=CYCLE)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    return lambda: opt.step(closure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, args.before)
    old = importlib.import_module("ngvi_old")
    problem = problems(False)[args.model]
    steps = {"adam": stepper(None, "adam", problem)}
    for tag, package in (("old", old), ("new", ngvi)):
        steps[f"noisy {tag}"] = stepper(package, "noisy", problem)
        steps[f"kfac {tag}"] = stepper(package, "kfac", problem)
    for step in steps.values():
        for _ in range(2):
            step()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(args.rounds):
        for k, step in steps.items():
            start = time.perf_counter()
            for _ in range(CYCLE):
                step()
            times[k].append((time.perf_counter() - start) / CYCLE)
    med = {k: statistics.median(v) for k, v in times.items()}
    x, _ = problem.data(torch.device("cpu"))
    rate = matmul_rate()
    floor = 2 * kfac_flops(problem.model(torch.device("cpu")), x, inv_every=CYCLE).floor() / rate
    print(f"{problem.name}, {args.rounds} rounds of one {CYCLE}-step cycle each, median step (ms):")
    print("  " + ", ".join(f"{k} {1e3 * v:.1f}" for k, v in med.items()) + f"; FLOP floor {1e3 * floor:.1f}")
    for tag in ("old", "new"):
        n, k = med[f"noisy {tag}"], med[f"kfac {tag}"]
        print(
            f"  {tag}: noisy × K-FAC {n / k:.2f}, noisy × Adam {n / med['adam']:.2f}, K-FAC × Adam "
            f"{k / med['adam']:.2f}, noisy × FLOP floor {n / floor:.2f}, K-FAC × FLOP floor {k / floor:.2f}"
        )


if __name__ == "__main__":
    main()
