"""Issue 44, item 5: the linearised (GLM) predictive against the sampled one, for every posterior family.

``python benchmarks/glm_vs_sampled.py --out benchmarks/glm_vs_sampled.json``: the calibration study's
problems, networks, batches, loss and seeds (``ngvi.experiments.calibration``: 2,000 steps of batch 50),
every rule with ``data_size`` and nothing else (the library's defaults, ``forget_start`` and the trust region
included, which the study's recorded builds pin off), and for each trained posterior both predictives from
the same posterior, 64 draws each: ``ngvi.predict(..., linearized=False)`` (the network at sampled weights)
and ``linearized=True`` (f(μ) + J(μ)(θ − μ), the GLM predictive laplace-torch uses). Per cell the test NLL
(regression: Gaussian with the known noise, as the study; classification: categorical), the 95% coverage
(regression) or the ECE (classification), and the seconds each predictive took. The deep ensemble's NLL
from the committed study (``docs/results/calibration/results.json``) is the reference for "NLL − ensemble".
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
from pathlib import Path

import torch

import ngvi
from ngvi.experiments.calibration import experiment, measure
from ngvi.experiments.calibration.problems import PROBLEMS
from ngvi.experiments.core import training
from ngvi.experiments.core.methods import RECORDED_WITHOUT_FORGETTING, RECORDED_WITHOUT_REGION

RULES = (
    "vadam", "vprop", "von", "ivon", "noisy_adam", "noisy_adam_pe", "vogn", "badam", "bbvi",
    "noisy_kfac", "nng_blktri", "nng_full",
)  # fmt: skip
SAMPLES = 64


def ensemble_nll(problem: str) -> dict[int, float]:
    path = Path(__file__).parents[1] / "docs/results/calibration/results.json"
    runs = json.loads(path.read_text())["runs"]
    prefix = f"{problem}/deep_ensemble/"
    return {int(k.rsplit("seed", 1)[1]): v["nll"] for k, v in runs.items() if k.startswith(prefix)}


def build(method: str, model, problem, seed: int):
    """The study's build with the library's own defaults (``forget_start`` as each class defaults it)."""
    options = experiment.required_options(method, problem) | {"seed": seed}
    cls = experiment.METHODS[method].trainer_class()
    if cls.__name__ in RECORDED_WITHOUT_REGION:
        options["kl_clip"] = "auto"
    if cls.__name__ in RECORDED_WITHOUT_FORGETTING:
        options["forget_start"] = inspect.signature(cls.__init__).parameters["forget_start"].default
    return experiment.METHODS[method].build(model, problem.n_train, **options)


def metrics(problem, samples, y) -> dict[str, float]:
    if problem.task == "classification":
        return measure.classifier_metrics(samples, y)
    return measure.regression_metrics(samples, y, problem.noise_std)


def run(name: str, method: str, seed: int, steps: int) -> dict:
    problem = PROBLEMS[name]
    draw = problem.data(seed)
    torch.manual_seed(seed)
    model = problem.net()
    trainer = build(method, model, problem, seed)
    training.train_steps(
        model,
        trainer,
        draw.x_train,
        draw.y_train,
        experiment.loss_function(problem),
        steps=steps,
        batch_size=experiment.BATCH_SIZE,
        generator=torch.Generator().manual_seed(seed),
    )
    out = {}
    for linearized in (False, True):
        torch.manual_seed(1000 + seed)
        start = time.perf_counter()
        samples = ngvi.predict(model, trainer, draw.x_test, samples=SAMPLES, linearized=linearized)
        seconds = time.perf_counter() - start
        part = "glm" if linearized else "sampled"
        out[part] = {**metrics(problem, samples, draw.y_test), "seconds": seconds}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default=",".join(PROBLEMS))
    parser.add_argument("--rules", default=",".join(RULES))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("glm_vs_sampled.json"))
    args = parser.parse_args()
    results = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}  # resumes
    for name in args.problems.split(","):
        ensemble = ensemble_nll(name)
        for method in args.rules.split(","):
            if not experiment.applies(method, PROBLEMS[name]):
                continue
            for seed in range(args.seeds):
                key = f"{name}/{method}/seed{seed}"
                if key in results["runs"]:
                    continue
                try:
                    cell = run(name, method, seed, args.steps)
                except ngvi.NonFiniteGradientError as err:
                    cell = {"error": str(err).splitlines()[0]}
                else:
                    for part in ("sampled", "glm"):
                        cell[part]["nll_minus_ensemble"] = cell[part]["nll"] - ensemble[seed]
                results["runs"][key] = cell
                args.out.write_text(json.dumps(results, indent=1))
                if "error" in cell:
                    print(f"{key}: {cell['error']}", flush=True)
                    continue
                s, g = cell["sampled"], cell["glm"]
                print(
                    f"{key}: sampled {s['nll_minus_ensemble']:+.3f} ({s['seconds']:.2f}s), "
                    f"GLM {g['nll_minus_ensemble']:+.3f} ({g['seconds']:.2f}s)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
