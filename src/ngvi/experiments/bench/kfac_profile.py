"""Where a noisy K-FAC step spends its time: ``python -m ngvi.experiments.bench.kfac_profile --out FILE``.

For the bench's MLP and CNN, it times whole inversion cycles of ``NoisyKFAC`` (the default sampling and
Alg. 2's weight draw) and ``baselines.KFAC`` beside ``torch.optim.Adam``, then profiles one cycle of the
default with ``torch.profiler`` and writes the operators that take the time (self CPU, grouped by input
shapes), so that each can be matched to a term of the FLOP floor (:mod:`.flops`): the two GEMMs per layer of
the preconditioning S⁻¹VA⁻¹, the factor products āᵀā and δᵀδ (``baddbmm_``), the forward and backward
``addmm``/``mm``, the local sample's ā B_A and E B_Sᵀ, and the Cholesky-based inversions.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from ..core import training
from ..core.methods import METHODS
from .flops import kfac_flops, matmul_rate
from .measure import problems

CYCLE = 20


def _stepper(problem, kind: str):
    model = problem.model(torch.device("cpu"))
    if kind == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    else:
        options = {"inv_every": CYCLE, "seed": 0, **({"sampling": "weights"} if kind == "weights" else {})}
        opt = METHODS["kfac" if kind == "kfac" else "noisy_kfac"].build(model, 60_000, **options)
    x, y = problem.data(torch.device("cpu"))
    closure = training.closure(model, opt, F.cross_entropy, x, y)
    return lambda: opt.step(closure)


def profile(problem_key: str, rounds: int = 3) -> str:
    problem = problems(False)[problem_key]
    kinds = ("adam", "auto", "weights", "kfac")
    steps = {k: _stepper(problem, k) for k in kinds}
    for step in steps.values():
        for _ in range(3):
            step()
    times = {k: [] for k in kinds}
    for _ in range(rounds):
        for k, step in steps.items():
            start = time.perf_counter()
            for _ in range(CYCLE):
                step()
            times[k].append((time.perf_counter() - start) / CYCLE)
    best = {k: min(v) for k, v in times.items()}
    x, _ = problem.data(torch.device("cpu"))
    flops = kfac_flops(problem.model(torch.device("cpu")), x, inv_every=CYCLE)
    rate = matmul_rate()
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(CYCLE):
            steps["auto"]()
    table = prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=28, max_shapes_column_width=64
    )
    lines = [
        f"## {problem.name}\n",
        f"Best of {rounds} cycles of {CYCLE} steps, one thread: Adam {1e3 * best['adam']:.1f} ms; "
        f"noisy K-FAC (sampling='auto') {1e3 * best['auto']:.1f} ms = "
        f"{best['auto'] / best['adam']:.2f}× Adam; "
        f"sampling='weights' {1e3 * best['weights']:.1f} ms = {best['weights'] / best['adam']:.2f}×; "
        f"K-FAC {1e3 * best['kfac']:.1f} ms = {best['kfac'] / best['adam']:.2f}×. FLOP floor at "
        f"{rate / 1e9:.1f} GFLOP/s: {2e3 * flops.floor() / rate:.1f} ms "
        f"({best['auto'] / (2 * flops.floor() / rate):.2f}× for the default).\n",
        "FLOPs per step: " + ", ".join(f"{k} {2e-9 * v:.2f} G" for k, v in flops.terms().items()) + ".\n",
        f"Operators of {CYCLE} steps of the default (torch.profiler, self CPU, by input shapes):\n",
        "```\n" + table + "\n```\n",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="Markdown file to write")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", default="mlp,cnn")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    text = "# Noisy K-FAC's step, profiled\n\n" + "\n".join(profile(k) for k in args.models.split(","))
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
