"""Before/after step times of the engine, in one run: this checkout's ngvi against an older commit's.

    mkdir -p /tmp/ngvi-before && git archive dc9aefd src | tar -x -C /tmp/ngvi-before   # before the fast path
    PYTHONPATH=src python -m ngvi.experiments.bench.before_after --before /tmp/ngvi-before/src --threads 1

The older package is imported under the name ``ngvi_before`` (its modules import each other relatively),
and every optimizer of both versions trains its own copy of the MLP 784-1000-1000-10 at batch 256, timed
in interleaved rounds with torch.optim.Adam as in ``ngvi bench``. Prints a Markdown table of ratios to Adam.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

import ngvi
from ngvi.experiments.bench import measure, methods

RULES = ("Vadam", "Vprop", "VON", "IVON", "NoisyAdam", "BAdam")


def import_as(name: str, src: Path):
    spec = importlib.util.spec_from_file_location(name, src / "ngvi" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--before", required=True, type=Path, help="src/ folder of the older checkout")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    before = import_as("ngvi_before", args.before)
    n = methods.DATA_SIZE
    timed = {"adam": methods.methods()["adam"]}
    for rule in RULES:
        kw = {"init_prec": 100.0} if rule in ("Vadam", "Vprop", "VON") else {}
        for tag, package in (("before", before), ("after", ngvi)):
            cls = getattr(package, rule)
            timed[f"{rule}-{tag}"] = methods.Method(
                f"{rule} ({tag})",
                methods.trainer_step(lambda m, cls=cls, kw=kw: cls(m.parameters(), n, seed=0, **kw)),
            )
    problem = measure.problems(quick=False)["mlp"]
    res = measure.run_problem(problem, timed, torch.device("cpu"), 5, args.rounds, args.steps, False, None)
    adam = res["methods"]["adam"]["seconds"]
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, {threads} threads; Adam {1e3 * adam:.1f} ms per step\n")
    print("| rule | before [ms] | × Adam | after [ms] | × Adam | speed-up |\n|---|---|---|---|---|---|")
    for rule in RULES:
        b, a = res["methods"][f"{rule}-before"]["seconds"], res["methods"][f"{rule}-after"]["seconds"]
        cells = [f"{1e3 * b:.1f}", f"{b / adam:.2f}×", f"{1e3 * a:.1f}", f"{a / adam:.2f}×", f"{b / a:.2f}×"]
        print(f"| {rule} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
