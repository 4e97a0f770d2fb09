"""``ngvi demo``: every optimizer on BADAM's toy regression, one panel each.

A 1-hidden-layer MLP with 50 ReLU units is trained on 200 points from (0, 0.5) and tested on (−0.5, 1.2)
(see :mod:`ngvi.experiments.data.toy`). The Gaussian likelihood uses the noise precision
τ = 1/TOY_NOISE_STD². Writes
``demo.png`` (data, predictive mean, ±2 std bands), ``table.md`` (test RMSE and log-likelihood) and
``results.json``. Finished methods are kept in ``results.json``, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

import ngvi
from ngvi import metrics
from ngvi.experiments.data.toy import TOY_NOISE_STD, ToyRegression, toy_regression

from ._io import load_json, markdown_table, results_dir, save_json, show_progress

DATA_SIZE = 200
NOISE_PREC = 1.0 / TOY_NOISE_STD**2
PRIOR_PREC = 1.0


@dataclass(frozen=True)
class DemoMethod:
    label: str
    build: Callable[[nn.Module], Any]
    linearized: bool = False  # BADAM's predictive is the linearised (GLM) one
    note: str = ""


def _methods() -> dict[str, DemoMethod]:
    n, lam = DATA_SIZE, PRIOR_PREC
    return {
        "vadam": DemoMethod(
            "Vadam", lambda m: ngvi.Vadam(m.parameters(), n, lr=1e-2, prior_prec=lam, init_prec=100.0)
        ),
        "vprop": DemoMethod(
            "Vprop", lambda m: ngvi.Vprop(m.parameters(), n, lr=1e-2, prior_prec=lam, init_prec=100.0)
        ),
        "von": DemoMethod(
            "VON (Price)",
            lambda m: ngvi.VON(m.parameters(), n, lr=1e-2, beta=1e-2, prior_prec=lam, init_prec=100.0),
        ),
        "ivon": DemoMethod(
            "IVON",
            lambda m: ngvi.IVON(
                m.parameters(), n, lr=0.2, betas=(0.9, 0.999), weight_decay=lam / n, hess_init=100.0
            ),
        ),
        "noisy_adam": DemoMethod(
            "Noisy Adam",
            lambda m: ngvi.NoisyAdam(m.parameters(), n, lr=1e-2, betas=(0.9, 0.99), prior_var=1.0 / lam),
        ),
        "badam": DemoMethod(
            "BAdam (linearised)",
            lambda m: ngvi.BAdam(m.parameters(), n, lr=1e-2, prior_prec=lam),
            linearized=True,
        ),
        "vogn": DemoMethod(
            "VOGN", lambda m: ngvi.VOGN(m, n, lr=0.05, beta=1e-2, prior_prec=lam, init_prec=100.0)
        ),
        "noisy_kfac": DemoMethod(
            "Noisy K-FAC",
            lambda m: ngvi.NoisyKFAC(m, n, lr=0.05, beta=1e-2, prior_var=1.0 / lam, damping=1e-3),
        ),
        "vadagrad": DemoMethod(
            "VadaGrad",
            lambda m: ngvi.VadaGrad(m.parameters(), lr=0.2, beta=0.01),
            note="variational optimisation: its search distribution shrinks by design",
        ),
    }


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(1, 50), nn.ReLU(), nn.Linear(50, 1))


def train_one(
    method: DemoMethod, data: ToyRegression, steps: int, seed: int, bar: tqdm | None
) -> dict[str, Any]:
    model = make_model(seed)
    opt = method.build(model)
    x, y = data.x_train, data.y_train

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = 0.5 * NOISE_PREC * ((model(x) - y) ** 2).mean()  # mean Gaussian NLL up to a constant
        loss.backward()
        return loss

    start = time.perf_counter()
    for _ in range(steps):
        opt.step(closure)
        if bar is not None:
            bar.update()
    seconds = time.perf_counter() - start
    samples = ngvi.predict(model, opt, data.x_test, samples=100, linearized=method.linearized)
    mean = samples.mean(0)[:, 0]
    inside = (data.x_test[:, 0] > 0) & (data.x_test[:, 0] < 0.5)
    return {
        "label": method.label,
        "note": method.note,
        "steps": steps,
        "seconds": seconds,
        "test_rmse": metrics.rmse(mean, data.y_test),
        "test_loglik": metrics.gaussian_log_likelihood(samples, data.y_test, NOISE_PREC),
        "train_range_rmse": metrics.rmse(mean[inside], data.y_test[inside]),
        "pred_mean": mean.tolist(),
        "pred_std": samples.std(0)[:, 0].tolist(),
    }


def run(out: Path, steps: int = 6000, methods: list[str] | None = None, seed: int = 0) -> dict[str, Any]:
    available = _methods()
    names = methods or list(available)
    unknown = sorted(set(names) - set(available))
    if unknown:
        raise ValueError(f"unknown demo method(s) {unknown}; choose from {sorted(available)}")
    out = results_dir(out)
    data = toy_regression(seed=seed)
    results = load_json(out / "results.json")
    if results.get("config") != {"steps": steps, "seed": seed}:
        results = {"config": {"steps": steps, "seed": seed}, "methods": {}}
    todo = [n for n in names if n not in results["methods"]]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 50-unit MLP runs faster on one thread than split across cores
    with tqdm(total=steps * len(todo), desc="ngvi demo", unit="step", disable=not show_progress()) as bar:
        for name in todo:
            bar.set_postfix_str(available[name].label)
            results["methods"][name] = train_one(available[name], data, steps, seed, bar)
            save_json(out / "results.json", results)
    torch.set_num_threads(threads)
    done = {n: results["methods"][n] for n in names}
    (out / "table.md").write_text(_table(done, steps))
    _plot(done, data, out / "demo.png")
    return done


def _table(done: dict[str, dict[str, Any]], steps: int) -> str:
    rows = [
        [
            r["label"],
            f"{r['test_rmse']:.3f}",
            f"{r['test_loglik']:.2f}",
            f"{r['train_range_rmse']:.3f}",
            f"{r['seconds']:.1f}",
        ]
        for r in done.values()
    ]
    head = (
        f"# ngvi demo: toy regression (BADAM App. D.1), {steps} full-batch steps, 100 predictive samples\n\n"
        "Test points cover (−0.5, 1.2) and training inputs only (0, 0.5): most of the test set is "
        "extrapolation. "
        f"Log-likelihood uses noise precision τ = {NOISE_PREC:.0f}.\n\n"
    )
    return head + markdown_table(
        ["method", "test RMSE", "test log-lik", "RMSE on (0, 0.5)", "train time [s]"], rows
    )


def _plot(done: dict[str, dict[str, Any]], data: ToyRegression, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = math.ceil(len(done) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.2 * cols, 3.2 * rows), sharex=True, sharey=True, squeeze=False
    )
    x = data.x_test[:, 0].numpy()
    truth = ToyRegression.curve(data.x_test)[:, 0].numpy()
    noise = 1.0 / NOISE_PREC
    for ax, r in zip(axes.flat, done.values(), strict=False):
        mean = torch.tensor(r["pred_mean"])
        std_f = torch.tensor(r["pred_std"])
        std_y = (std_f**2 + noise).sqrt()
        ax.fill_between(
            x,
            mean - 2 * std_y,
            mean + 2 * std_y,
            color="tab:blue",
            alpha=0.15,
            lw=0,
            label="±2 std (with noise)",
        )
        ax.fill_between(
            x,
            mean - 2 * std_f,
            mean + 2 * std_f,
            color="tab:blue",
            alpha=0.35,
            lw=0,
            label="±2 std (weights)",
        )
        ax.plot(x, truth, "k--", lw=1, label="noise-free curve")
        ax.plot(x, mean, color="tab:blue", lw=1.5, label="predictive mean")
        ax.scatter(
            data.x_train[:, 0], data.y_train[:, 0], s=4, color="tab:orange", zorder=3, label="training data"
        )
        ax.set_title(f"{r['label']}\nRMSE {r['test_rmse']:.2f}, log-lik {r['test_loglik']:.1f}", fontsize=9)
        ax.set_ylim(-1.5, 2.5)
    for ax in list(axes.flat)[len(done) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/demo", help="results folder (default: runs/demo)")
    parser.add_argument("--steps", type=int, default=6000, help="full-batch steps per method (default: 6000)")
    parser.add_argument(
        "--quick", action="store_true", help="300 steps per method: a smoke run (CI uses this)"
    )
    parser.add_argument("--methods", default=None, help=f"comma-separated subset of: {', '.join(_methods())}")
    parser.add_argument("--seed", type=int, default=0)


def main(args: argparse.Namespace) -> None:
    steps = 300 if args.quick else args.steps
    methods = args.methods.split(",") if args.methods else None
    done = run(Path(args.out), steps=steps, methods=methods, seed=args.seed)
    print((Path(args.out) / "table.md").read_text())
    print(f"wrote {Path(args.out) / 'demo.png'} and table.md, results.json ({len(done)} methods)")


class _Command:  # interim: until demo is an Experiment of the harness
    name = "demo"
    help = {
        "demo": "train every optimizer on a 1-D toy regression and plot the predictive bands (~2 min)",
        "bench": "step time and peak memory of every optimizer against torch.optim.Adam (~15 min)",
    }["demo"]
    add_arguments = staticmethod(add_arguments)
    main = staticmethod(main)


COMMAND = _Command()
