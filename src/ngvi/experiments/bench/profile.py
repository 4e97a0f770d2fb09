"""Where a step spends its time: ``python -m ngvi.experiments.bench.profile --out FILE``.

The timings come from the bench's own code (:mod:`.methods` builds each step as ``ngvi bench`` does,
:func:`.measure.time_steps` interleaves them in rounds of whole cycles and :func:`.measure.summarise` takes
the median round with its spread), so a profile and a bench of the same configuration measure the same
thing; the file says how far apart they came out when given the bench's ``results.json``. Then one cycle
of each profiled method runs under ``torch.profiler`` and the operators that take the time are listed (self
CPU, grouped by input shapes), to be matched with the FLOP floor's terms (:mod:`.flops`) for the K-FAC
family: the two GEMMs per layer of the preconditioning S⁻¹VA⁻¹, the factor products āᵀā and δᵀδ
(``baddbmm_``), the forward and backward ``addmm``/``mm``, the local sample and the inversions.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from .flops import kfac_flops, matmul_rate
from .measure import problems, summarise, time_steps
from .methods import methods
from .report import ratio_text, spread_text

#: what is timed by default (the K-FAC family beside Adam) and which of it is profiled
TIMED = ("adam", "noisy_kfac", "noisy_kfac-weights", "kfac")
PROFILED = ("noisy_kfac",)


def profile(
    problem_key: str,
    timed: tuple[str, ...] = TIMED,
    profiled: tuple[str, ...] = PROFILED,
    rounds: int = 5,
    steps: int = 10,
    bench: dict[str, Any] | None = None,
    quick: bool = False,
) -> str:
    """Markdown: the timings of ``timed`` on the problem (the bench's way), their agreement with ``bench``
    (a bench ``results.json``) where it has them, and the operators of one cycle of each of ``profiled``."""
    problem = problems(quick)[problem_key]
    device = torch.device("cpu")
    x, y = problem.data(device)
    chosen = {name: methods()[name] for name in timed}
    steppers = {name: m.build(problem.model(device), x, y) for name, m in chosen.items()}
    per_round = {name: -(-steps // m.cycle) * m.cycle for name, m in chosen.items()}
    times = time_steps(steppers, device, warmup=3, rounds=rounds, steps=per_round)
    summary = {name: summarise(times[name], per_round[name]) for name in chosen}
    adam = summary.get("adam", {}).get("seconds")
    benched = _bench_entries(bench, problem.name)
    lines = [
        f"## {problem.name}\n",
        f"Torch threads: {torch.get_num_threads()}. {rounds} interleaved rounds of whole cycles (≥ {steps} "
        "steps): the median round and its spread (fastest and slowest round against it). Where a bench "
        "results.json was given: its × Adam for the same method, and this run's × Adam over it (1.00: the "
        "two agree; ratios, because absolute times move with the machine's load between runs).\n",
        "| method | step [ms] | spread | × Adam | bench × Adam | this ÷ bench |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in chosen.items():
        seconds = summary[name]["seconds"]
        ratio = seconds / adam if adam else None
        other = benched[name] / benched["adam"] if name in benched and "adam" in benched else None
        cells = [m.label, f"{1e3 * seconds:.1f}", spread_text(summary[name]), ratio_text(seconds, adam)]
        cells += [ratio_text(other, 1.0), f"{ratio / other:.2f}" if ratio and other else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    cycles = [m.cycle for m in chosen.values() if m.cycle > 1]
    if cycles:  # the K-FAC family: its FLOP floor
        flops = kfac_flops(problem.model(device), x, inv_every=max(cycles))
        rate = matmul_rate()
        floor = 2 * flops.floor() / rate
        lines += [
            "",
            f"K-FAC's FLOP floor at {rate / 1e9:.1f} GFLOP/s: {1e3 * floor:.1f} ms per step. FLOPs per step: "
            + ", ".join(f"{k} {2e-9 * v:.2f} G" for k, v in flops.terms().items())
            + ".",
        ]
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for name in profiled:
        with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(per_round[name]):
                steppers[name]()
        table = prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=28, max_shapes_column_width=64
        )
        lines += [
            "",
            f"Operators of {per_round[name]} steps of {chosen[name].label} (torch.profiler, self CPU, by "
            "input shapes; the profiler's own overhead is in these times, not in the table above):\n",
            "```\n" + table + "\n```\n",
        ]
    return "\n".join(lines)


def _bench_entries(bench: dict[str, Any] | None, problem_name: str) -> dict[str, float]:
    """Seconds per step of each method in a bench ``results.json`` for this problem."""
    for entry in (bench or {}).get("runs", {}).values():
        if entry.get("problem") == problem_name:
            return {k: v["seconds"] for k, v in entry["methods"].items() if "seconds" in v}
    return {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="Markdown file to write")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--methods", default=",".join(TIMED), help="bench methods to time")
    parser.add_argument("--profile", default=",".join(PROFILED), help="of those, the ones to profile")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per method per round")
    parser.add_argument("--bench", help="a bench results.json to compare with (same threads and problem)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bench = json.loads(Path(args.bench).read_text()) if args.bench else None
    timed = tuple(args.methods.split(","))
    profiled = tuple(p for p in args.profile.split(",") if p)
    sections = [profile(k, timed, profiled, args.rounds, args.steps, bench) for k in args.models.split(",")]
    text = "# Steps, timed the bench's way and profiled\n\n" + "\n".join(sections)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
