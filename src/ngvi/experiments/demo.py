"""``ngvi demo``: every optimizer on BADAM's toy regression, one panel each.

A 1-hidden-layer MLP with 50 ReLU units is trained on 200 points from (0, 0.5) and tested on (−0.5, 1.2)
(see :mod:`ngvi.experiments.data.toy`), full batch. The Gaussian likelihood uses the noise precision
τ = 1/TOY_NOISE_STD². Writes ``demo.png`` (data, predictive mean, ±2 std bands over the whole test range),
``table.md`` (test RMSE and log-likelihood) and ``results.json``; one job per method, so a killed run
resumes with the methods it had not finished.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import ngvi
from ngvi import metrics

from .core import args as types
from .core import models, training
from .core.methods import METHODS
from .core.report import figure, markdown_table, save_figure
from .core.runner import Experiment, Job, Run
from .data.toy import TOY_NOISE_STD, ToyRegression, toy_regression

DATA_SIZE = 200
NOISE_PREC = 1.0 / TOY_NOISE_STD**2
PRIOR_PREC = 1.0
TRAIN_RANGE = (0.0, 0.5)
#: each method's settings here, beside prior_prec = PRIOR_PREC (the shared vocabulary: core.methods); the
#: papers' rules (the options whose ngvi defaults differ are pinned, as in uci/methods.PAPER_RULES)
OPTIONS: dict[str, dict[str, Any]] = {
    "vadam": {"lr": 1e-2, "init_prec": 100.0, "step_moment": "paper"},
    "vprop": {"lr": 1e-2, "init_prec": 100.0, "step_moment": "paper", "noise": "normal"},
    "von": {"lr": 1e-2, "beta": 1e-2, "init_prec": 100.0, "momentum": 0.0},
    "ivon": {"lr": 0.2, "betas": (0.9, 0.999), "hess_init": 100.0},
    "noisy_adam": {"lr": 1e-2, "betas": (0.9, 0.99), "init_prec": None},
    "badam": {"lr": 1e-2},
    "vogn": {"lr": 0.05, "beta": 1e-2, "init_prec": 100.0, "momentum": 0.0},
    "noisy_kfac": {"lr": 0.05, "beta": 1e-2, "damping": 1e-3, "init_prec": None, "momentum": 0.0},
    "vadagrad": {"lr": 0.2, "beta": 0.01, "prior_prec": 0.0},  # variational optimisation: no prior
}
NOTES = {
    "badam": "linearised predictive: its band has steps where a ReLU unit switches on",
    "vadagrad": "variational optimisation: its search distribution shrinks by design",
}


class Demo(Experiment):
    name = "demo"
    help = "train every optimizer on a 1-D toy regression and plot the predictive bands (~30 s)"
    default_out = "runs/demo"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--methods",
            type=types.names(OPTIONS),
            default=list(OPTIONS),
            help=f"comma-separated subset of: {', '.join(OPTIONS)} (default: all)",
        )
        parser.add_argument(
            "--steps",
            type=types.positive_int,
            default=6000,
            help="full-batch steps per method (default 6000)",
        )
        parser.add_argument("--quick", action="store_true", help="300 steps per method: a smoke run")
        parser.add_argument("--seed", type=types.non_negative_int, default=0)

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        return {"steps": 300 if args.quick else args.steps, "seed": args.seed}

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        return [Job(name, {"method": name, **self.config(args)}) for name in args.methods]

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Train one method and predict over the test range (100 posterior samples)."""
        name, steps, seed = spec["method"], spec["steps"], spec["seed"]
        method = METHODS[name]
        data = toy_regression(seed=seed)
        torch.manual_seed(seed)
        model = models.mlp(1, 50, 1)
        trainer = method.build(model, DATA_SIZE, **{"prior_prec": PRIOR_PREC, **OPTIONS[name]})
        start = time.perf_counter()
        training.train(
            model,
            trainer,
            data.x_train,
            data.y_train,
            lambda output, y: 0.5 * NOISE_PREC * ((output - y) ** 2).mean(),  # mean Gaussian NLL + const
            epochs=steps,
        )
        seconds = time.perf_counter() - start
        samples = ngvi.predict(model, trainer, data.x_test, samples=100, linearized=method.linearized)
        mean = samples.mean(0)[:, 0]
        inside = (data.x_test[:, 0] > TRAIN_RANGE[0]) & (data.x_test[:, 0] < TRAIN_RANGE[1])
        return {
            "seconds": seconds,
            "test_rmse": metrics.rmse(mean, data.y_test),
            "test_loglik": metrics.gaussian_log_likelihood(samples, data.y_test, NOISE_PREC),
            "train_range_rmse": metrics.rmse(mean[inside], data.y_test[inside]),
            "pred_mean": mean.tolist(),
            "pred_std": samples.std(0)[:, 0].tolist(),
        }

    def report(self, args: argparse.Namespace, run: Run) -> None:
        done = {name: run.results["runs"][name] for name in args.methods}
        steps = self.config(args)["steps"]
        (run.out / "table.md").write_text(_table(done, steps))
        plot(done, toy_regression(seed=args.seed), run.out / "demo.png")
        print((run.out / "table.md").read_text())
        print(f"wrote {run.out / 'demo.png'}, {run.out / 'table.md'} and {run.out / 'results.json'}")


def _label(name: str) -> str:
    return METHODS[name].label + (" (linearised)" if METHODS[name].linearized else "")


def _table(done: dict[str, dict[str, Any]], steps: int) -> str:
    rows = [
        [
            _label(name),
            f"{r['test_rmse']:.3f}",
            f"{r['test_loglik']:.2f}",
            f"{r['train_range_rmse']:.3f}",
            f"{r['seconds']:.1f}",
            NOTES.get(name, ""),
        ]
        for name, r in done.items()
    ]
    head = (
        f"# ngvi demo: toy regression (BADAM App. D.1), {steps} full-batch steps, 100 predictive samples\n\n"
        f"Test points cover (−0.5, 1.2) and training inputs only {TRAIN_RANGE}: most of the test set is "
        f"extrapolation. Log-likelihood uses noise precision τ = {NOISE_PREC:.0f}.\n\n"
    )
    header = ["method", "test RMSE", "test log-lik", f"RMSE on {TRAIN_RANGE}", "train time [s]", "note"]
    return head + markdown_table(header, rows)


def band_limits(
    done: dict[str, dict[str, Any]], truth: np.ndarray, data: ToyRegression
) -> tuple[float, float]:
    """y-limits that show every method's mean ± 2 std (with noise), the curve and the data, whole."""
    noise = 1.0 / NOISE_PREC
    lows, highs = [truth.min(), float(data.y_train.min())], [truth.max(), float(data.y_train.max())]
    for r in done.values():
        mean, std_y = np.array(r["pred_mean"]), np.sqrt(np.array(r["pred_std"]) ** 2 + noise)
        lows.append((mean - 2 * std_y).min())
        highs.append((mean + 2 * std_y).max())
    low, high = float(min(lows)), float(max(highs))
    margin = 0.04 * (high - low)
    return low - margin, high + margin


def plot(done: dict[str, dict[str, Any]], data: ToyRegression, path: Path) -> None:
    """One panel per method on shared axes that hold every band whole; the training range is shaded."""
    x = data.x_test[:, 0].numpy()
    truth = ToyRegression.curve(data.x_test)[:, 0].numpy()
    noise = 1.0 / NOISE_PREC
    fig, axes = figure(len(done), cols=3, size=(4.2, 3.3))
    limits = band_limits(done, truth, data)
    for ax, (name, r) in zip(axes, done.items(), strict=True):
        mean, std_f = np.array(r["pred_mean"]), np.array(r["pred_std"])
        std_y = np.sqrt(std_f**2 + noise)
        ax.axvspan(*TRAIN_RANGE, color="0.92", zorder=0, label="training inputs")
        ax.fill_between(
            x,
            mean - 2 * std_y,
            mean + 2 * std_y,
            color="tab:blue",
            alpha=0.15,
            lw=0,
            label="±2 std (with noise)",
        )
        ax.fill_between(x, mean - 2 * std_f, mean + 2 * std_f, color="tab:blue", alpha=0.35, lw=0,
                        label="±2 std (weights)")  # fmt: skip
        ax.plot(x, truth, "k--", lw=1, label="noise-free curve")
        ax.plot(x, mean, color="tab:blue", lw=1.5, label="predictive mean")
        ax.scatter(
            data.x_train[:, 0], data.y_train[:, 0], s=4, color="tab:orange", zorder=3, label="training data"
        )
        ax.set_title(
            f"{_label(name)}\ntest RMSE {r['test_rmse']:.2f}, log-lik {r['test_loglik']:.1f}", fontsize=9
        )
        ax.set_xlim(x.min(), x.max())
        ax.set_ylim(*limits)
        ax.set_xlabel("x", fontsize=8)
        ax.set_ylabel("y", fontsize=8)
        ax.tick_params(labelsize=7)
    save_figure(fig, path, legend_from=axes[0], dpi=120)


EXPERIMENT = Demo()
