"""Issue 32, item 2: why the diagonal rules miss the NLL at σ = 0.1 (`ngvi calibration`'s `regression_gap`).

``python benchmarks/region_diagnosis.py [--problem regression_gap] [--seeds 3] [--out FILE.json]``: the
calibration study's problem, network, batches, loss and builds (``ngvi.experiments.calibration``), for VON,
VadaGrad, IVON, noisy Adam (Alg. 1's update with ngvi's start), Vadam (no region) and VOGN (meets the
criteria), in four variants:

* ``defaults``: as the study ran them (2,000 steps);
* ``steps-20k``: the defaults, 10× as long: does the miss close with time?
* ``no-region``: ``kl_clip=None``, 2,000 steps: is it the region that holds them back?
* ``forget-start`` (issue 44): ``forget_start="auto"`` (:mod:`ngvi.optim.forgetting`), 2,000 steps: does
  forgetting the start close the gap? (VadaGrad has no such option.)
* ``sharp-start``: the curvature state starts at the likelihood's scale, 1/σ² units per example (VON and
  VOGN ``init_prec`` = N/σ² + λ, IVON ``hess_init`` = 1/σ², noisy Adam ``init_prec`` = N/σ², VadaGrad
  ``init_prec`` = s₀/σ²), 2,000 steps: does the curvature state's lag explain it? An explicit start turns
  ``kl_clip="auto"`` off for VON, VOGN and noisy Adam; IVON and VadaGrad keep their region.

Every 100 steps it records the trust region's ν (the mean over that window's passes, and the fraction of
passes where it bound, ν < 1), the train RMSE at the mean, and the median posterior s.d.
(``opt.diagnostics``); at the end the test NLL over 64 draws minus the ensemble's on the same seed (from the
committed ``docs/results/calibration/results.json``), the 95% coverage and the test RMSE.
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

import ngvi
from ngvi.experiments.calibration import experiment, measure, report
from ngvi.experiments.calibration.problems import PROBLEMS, Problem
from ngvi.experiments.core import training
from ngvi.optim.functional import updates

RULES = ("von", "vadagrad", "ivon", "noisy_adam", "vadam", "vogn")
EVERY = 100


def sharp_start(method: str, problem: Problem) -> dict:
    """The curvature state started at 1/σ² per example (the registry's λ = 1 where a rule has a prior)."""
    scale, n = problem.noise_std**-2, problem.n_train  # the likelihood's curvature per example
    return {
        "von": {"init_prec": n * scale + 1.0},
        "vogn": {"init_prec": n * scale + 1.0},
        "ivon": {"hess_init": scale},
        "noisy_adam": {"init_prec": n * scale},
        "vadagrad": {"init_prec": 1e4 * scale},
        "vadam": {},
    }[method]


VARIANTS = {
    "defaults": (2000, lambda method, problem: {}),
    "steps-20k": (20000, lambda method, problem: {}),
    "no-region": (2000, lambda method, problem: {"kl_clip": None}),
    "sharp-start": (2000, sharp_start),
    # issue 44: the early curvature weight that forgets ngvi's start (IVON's and noisy Adam's default since;
    # the study's builds pin forget_start=None)
    "forget-start": (2000, lambda method, problem: {} if method == "vadagrad" else FORGET),
}
FORGET = {"forget_start": "auto"}


@contextmanager
def recorded_nu(into: list[float]):
    """Every ν the region computes, read to the host (a diagnostic: the library itself never reads it)."""
    original = updates.trust_region

    def recording(*args, **kwargs):
        nu = original(*args, **kwargs)
        into.append(float(nu))
        return nu

    updates.trust_region = recording
    try:
        yield
    finally:
        updates.trust_region = original


def ensemble_nll(problem: str) -> dict[int, float]:
    """The deep ensemble's test NLL per seed, from the committed calibration study (the same draws)."""
    path = Path(__file__).parents[1] / "docs/results/calibration/results.json"
    runs = json.loads(path.read_text())["runs"]
    return {
        int(key.rsplit("seed", 1)[1]): runs[key]["nll"]
        for key in runs
        if key.startswith(f"{problem}/deep_ensemble/")
    }


def run(problem: Problem, method: str, variant: str, seed: int) -> dict:
    steps, extra = VARIANTS[variant]
    draw = problem.data(seed)
    torch.manual_seed(seed)
    model = problem.net()
    options = experiment.required_options(method, problem) | {"seed": seed, "kl_clip": "auto"}
    options |= extra(method, problem)
    if method == "vadam":
        options.pop("kl_clip")  # no region in the Adam-like rules
    trainer = experiment.METHODS[method].build(model, problem.n_train, **options)
    nus: list[float] = []
    trace: list[dict] = []

    def checkpoint(step: int) -> None:
        if step % EVERY != 1 or step == 1:
            return
        window, nus[:] = list(nus), []
        with torch.no_grad():
            rmse = float((model(draw.x_train) - draw.y_train).square().mean().sqrt())
        sigma = trainer.diagnostics().sigma_quantiles
        trace.append(
            {
                "step": step - 1,
                "nu_mean": sum(window) / len(window) if window else None,
                "bound": sum(nu < 1.0 for nu in window) / len(window) if window else None,
                "train_rmse": rmse,
                "sigma_median": None if sigma is None else sigma[0.5],
            }
        )

    start = time.process_time()
    with recorded_nu(nus):
        training.train_steps(
            model,
            trainer,
            draw.x_train,
            draw.y_train,
            experiment.loss_function(problem),
            steps=steps,
            batch_size=experiment.BATCH_SIZE,
            generator=torch.Generator().manual_seed(seed),
            before_step=checkpoint,
        )
    seconds = time.process_time() - start
    samples = ngvi.predict(model, trainer, draw.x_test, samples=64)
    metrics = measure.regression_metrics(samples, draw.y_test, problem.noise_std)
    return {"steps": steps, "options": options, "seconds": seconds, "trace": trace} | metrics


def plot(results: dict, problem: str, path: Path) -> None:
    """The train RMSE at the mean and the region's ν over 20,000 steps (means over seeds, their range
    shaded), with IVON started at 1/σ² beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    colours = dict(zip(RULES, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for variant, style in (("steps-20k", "-"), ("sharp-start", ":")):
        for method in RULES:
            traces = [
                r["trace"]
                for k, r in results["runs"].items()
                if k.startswith(f"{problem}/{variant}/{method}/")
            ]
            if not traces or (variant == "sharp-start" and method != "ivon"):
                continue
            steps = [point["step"] for point in traces[0]]
            label = report.label(method) + (" (start at 1/σ²)" if variant == "sharp-start" else "")
            # the mean over seeds, and their range shaded: the text reads differences between rules
            for ax, field in ((left, "train_rmse"), (right, "nu_mean")):
                if traces[0][0][field] is None:
                    continue
                values = np.array([[point[field] for point in t] for t in traces], dtype=float)
                ax.plot(steps, values.mean(0), style, color=colours[method], label=label)
                ax.fill_between(steps, values.min(0), values.max(0), color=colours[method], alpha=0.15, lw=0)
    noise = PROBLEMS[problem].noise_std
    left.axhline(noise, color="black", lw=0.8, ls="--", label=f"noise s.d. {noise}")
    left.set(xscale="log", yscale="log", xlabel="step", ylabel="train RMSE at the mean μ")
    right.set(xscale="log", yscale="log", xlabel="step", ylabel="the region's ν, mean of the last 100 steps")
    right.axhline(1.0, color="black", lw=0.8, ls="--", label="ν = 1: the region does not bind")
    handles, labels = left.get_legend_handles_labels()  # one legend below both panels: none hides a curve
    extra = right.get_legend_handles_labels()
    handles += extra[0][-1:]
    labels += extra[1][-1:]
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(
        f"{problem}: the defaults for 20,000 steps (solid) and IVON started at 1/σ² (dotted); "
        f"mean over {args_seeds(results, problem)} seeds, their range shaded"
    )
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    fig.savefig(path, dpi=120)


def args_seeds(results: dict, problem: str) -> int:
    """The seeds the plotted runs have (the most of any rule and variant)."""
    seeds: dict[str, int] = {}
    for key in results["runs"]:
        if key.startswith(f"{problem}/"):
            group = key.rsplit("/", 1)[0]
            seeds[group] = seeds.get(group, 0) + 1
    return max(seeds.values(), default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", default="regression_gap", choices=["regression_gap", "regression_8d"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rules", default=",".join(RULES))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default="region_diagnosis.json")
    parser.add_argument("--plot", action="store_true", help="only draw diagnosis.png beside --out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    problem, reference = PROBLEMS[args.problem], ensemble_nll(args.problem)
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {"runs": {}}  # resumes
    if args.plot:
        plot(results, args.problem, out.with_name("diagnosis.png"))
        return
    for variant in args.variants.split(","):
        for method in args.rules.split(","):
            for seed in range(args.seeds):
                key = f"{args.problem}/{variant}/{method}/seed{seed}"
                if key in results["runs"]:
                    continue
                row = run(problem, method, variant, seed)
                row["nll_minus_ensemble"] = row["nll"] - reference[seed]
                results["runs"][key] = row
                out.write_text(json.dumps(results, indent=1))
                last = row["trace"][-1]
                print(
                    f"{key}: NLL-ens {row['nll_minus_ensemble']:+.3f} "
                    f"cov {row['coverage95']:.3f} rmse {row['rmse']:.3f} | end: bound "
                    f"{last['bound']} nu {last['nu_mean']} train rmse {last['train_rmse']:.3f} "
                    f"sigma {last['sigma_median']:.3g} ({row['seconds']:.0f} s)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
