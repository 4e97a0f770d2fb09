"""Before/after step times of the engine, in one run: this checkout's ngvi against an older commit's.

    mkdir -p ../ngvi-before && git archive 7ab7f82 src | tar -x -C ../ngvi-before  # stop 28
    PYTHONPATH=src python -m ngvi.experiments.bench.before_after --before ../ngvi-before/src --threads 1

The older package is imported under the name ``ngvi_before`` (its modules import each other relatively).
The seven diagonal rules of both versions (``--rules``: any of the registry's, VOGN too) are built as
``ngvi bench`` builds them, each version's own class with its defaults (VON at the bench's lr=0.01), and
each trains its own copy of the bench's problem (``--model``: the MLP 784-1000-1000-10 at batch 256 by
default, the CNN, or the chain of 128 small tensors), timed in interleaved rounds beside
torch.optim.Adam and the floor (Adam plus one normal draw per weight). Prints a Markdown table of ratios
to Adam and to the floor.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

import torch

import ngvi
from ngvi.experiments.bench import measure, methods
from ngvi.experiments.core.methods import METHODS as REGISTRY

RULES = ("vadam", "vprop", "von", "ivon", "noisy_adam", "vadagrad", "badam")


def import_as(name: str, src: Path):
    spec = importlib.util.spec_from_file_location(name, src / "ngvi" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def build(package: Any, rule: str, model: torch.nn.Module) -> Any:
    """``package``'s own class of the registry's ``rule``, built as a user builds it: ``cls(params, N)`` (no N
    for VadaGrad) with its defaults and the bench's options, seeded. Not through the older package's
    registry, which imports ``ngvi`` by name and so would build this checkout's classes."""
    cls = getattr(package, REGISTRY[rule].cls)
    sized = "data_size" in inspect.signature(cls).parameters
    params = model if cls.takes_model else model.parameters()  # VOGN hooks the model's layers
    args = (params, methods.DATA_SIZE) if sized else (params,)
    opt = cls(*args, seed=0, **methods.OPTIONS.get(rule, {}))
    if not type(opt).__module__.startswith(package.__name__ + "."):
        raise RuntimeError(f"{rule} was built from {type(opt).__module__}, not from {package.__name__}")
    return opt


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--before", required=True, type=Path, help="src/ folder of the older checkout")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--warmup", type=int, default=5, help="untimed steps first (the gradients shrink as training goes on)"
    )
    parser.add_argument("--quick", action="store_true", help="the bench's tiny models: a smoke run")
    parser.add_argument("--model", default="mlp", choices=measure.DEFAULT_MODELS, help="the bench's problem")
    parser.add_argument("--rules", default=",".join(RULES), help="comma-separated registry names (vogn too)")
    args = parser.parse_args()
    rules = args.rules.split(",")
    if args.threads:
        torch.set_num_threads(args.threads)
    packages = {"before": import_as("ngvi_before", args.before), "after": ngvi}
    references = methods.methods()
    timed = {"adam": references["adam"], "floor": references["floor"]}
    for rule in rules:
        for tag, package in packages.items():
            timed[f"{rule}-{tag}"] = methods.Method(
                f"{rule} ({tag})", methods.trainer_step(lambda m, p=package, r=rule: build(p, r, m))
            )
    problem = measure.problems(quick=args.quick)[args.model]
    res = measure.run_problem(
        problem, timed, torch.device("cpu"), args.warmup, args.rounds, args.steps, False, None
    )
    adam, floor = (res["methods"][k]["seconds"] for k in ("adam", "floor"))
    threads = torch.get_num_threads()
    print(
        f"{problem.name}; torch {torch.__version__}, {threads} threads, {args.warmup} untimed steps first; "
        f"Adam "
        f"{1e3 * adam:.1f} ms per step, the floor {1e3 * floor:.1f} ms ({floor / adam:.2f}× Adam)\n"
    )
    print(
        "| rule | before [ms] | × Adam | × floor | after [ms] | × Adam | × floor | speed-up | of the fastest "
        "rounds |\n|---|---|---|---|---|---|---|---|---|"
    )
    for rule in rules:
        before, after = res["methods"][f"{rule}-before"], res["methods"][f"{rule}-after"]
        b, a = before["seconds"], after["seconds"]
        cells = [
            *(f"{1e3 * b:.1f}", f"{b / adam:.2f}×", f"{b / floor:.2f}×"),
            *(f"{1e3 * a:.1f}", f"{a / adam:.2f}×", f"{a / floor:.2f}×"),
            f"{b / a:.2f}×",
            f"{before['fastest'] / after['fastest']:.2f}×",  # the least disturbed rounds: a shared machine
        ]
        print(f"| {rule} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
