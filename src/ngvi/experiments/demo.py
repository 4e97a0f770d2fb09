"""``ngvi demo``: every optimizer on BADAM's toy regression, one panel each.

A 1-hidden-layer MLP with 50 ReLU units is trained on 200 points from (0, 0.5) and tested on (−0.5, 1.2)
(see :mod:`ngvi.experiments.data.toy`), full batch. The Gaussian likelihood uses the noise precision
τ = 1/TOY_NOISE_STD². Writes ``demo.png`` (data, predictive mean, ±2 std bands over the whole test range),
``table.md`` (test RMSE and log-likelihood, coverage of the 95% predictive band, and the correlation of each
method's predictive variance with NUTS's) and ``results.json``; one job per method, so a killed run resumes
with the methods it had not finished.

The ground-truth panel is pyro's NUTS (:func:`ngvi.baselines.nuts.nuts_posterior`) on the same model and
posterior. It is kept short so that the demo stays near two minutes on two cores: 4 chains, each started at
a MAP fit from its own seed (burn-in from a prior draw takes far longer at this noise level), 100 warm-up
iterations and 100 draws each, tree depth ≤ 7. The chains rarely leave the mode they start in, so their
union is closer to a multi-start ensemble than to a mixed posterior sample in the extrapolation range. The
R-hat and effective sample size of its predictions are in the table: read them before trusting the panel.
Its result is cached in ``results.json`` like every job.
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
#: NUTS's budget here (see the module docstring) and in --quick
NUTS_BUDGET = {"chains": 4, "warmup": 100, "samples": 100, "tree_depth": 7, "map_steps": 1500}
NUTS_QUICK = {"chains": 2, "warmup": 5, "samples": 5, "tree_depth": 2, "map_steps": 20}
Z95 = 1.959964
NOTES = {
    "badam": "linearised predictive: its band has steps where a ReLU unit switches on",
    "vadagrad": "variational optimisation: its search distribution shrinks by design",
}


class Demo(Experiment):
    name = "demo"
    requires = ("tqdm", "matplotlib", "pyro")
    help = "train every optimizer on a 1-D toy regression and plot the predictive bands (~30 s)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        types.add_subset(parser, "--methods", OPTIONS)
        types.add_count(parser, "--steps", None, "full-batch steps per method (default 6000; --quick: 300)")
        types.add_quick(
            parser, "300 steps per method and a tiny NUTS budget: a smoke run (--steps given explicitly wins)"
        )
        parser.add_argument("--seed", type=types.non_negative_int, default=0)
        parser.add_argument(
            "--nuts",
            choices=["yes", "no"],
            default="yes",
            help="the NUTS ground-truth panel (yes; ~1 CPU-minute, cached in --out)",
        )

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        return {
            **types.with_quick(args, {"steps": 6000}, {"steps": 300}),  # an explicit --steps wins
            "seed": args.seed,
            "nuts": NUTS_QUICK if args.quick else NUTS_BUDGET,
        }

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        names = (["nuts"] if args.nuts == "yes" else []) + list(args.methods)  # NUTS first: the longest job
        return [Job(name, {"method": name, **self.config(args)}) for name in names]

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Train one method and predict over the test range (100 posterior samples)."""
        if spec["method"] == "nuts":
            return _run_nuts(spec["nuts"], spec["seed"])
        name, steps, seed = spec["method"], spec["steps"], spec["seed"]
        method = METHODS[name]
        data = toy_regression(seed=seed)
        torch.manual_seed(seed)
        model = models.mlp(1, 50, 1)
        trainer = method.build(model, DATA_SIZE, **{"prior_prec": PRIOR_PREC, **OPTIONS[name]})
        start = time.perf_counter()
        training.train(model, trainer, data.x_train, data.y_train, _mean_nll, epochs=steps)
        seconds = time.perf_counter() - start
        samples = ngvi.predict(model, trainer, data.x_test, samples=100, linearized=method.linearized)
        return _summaries(samples, data, seconds)

    def report(self, args: argparse.Namespace, run: Run) -> None:
        names = (["nuts"] if args.nuts == "yes" else []) + list(args.methods)
        done = {name: run.results["runs"][name] for name in names}
        steps = self.config(args)["steps"]
        (run.out / "table.md").write_text(_table(done, steps))
        plot(done, toy_regression(seed=args.seed), run.out / "demo.png")
        print((run.out / "table.md").read_text())
        print(f"wrote {run.out / 'demo.png'}, {run.out / 'table.md'} and {run.out / 'results.json'}")


def _run_nuts(budget: dict[str, int], seed: int) -> dict[str, Any]:
    """NUTS on the demo's posterior, each chain started at a MAP fit from its own seed (module docstring)."""
    from ngvi.baselines.nuts import nuts_posterior

    data = toy_regression(seed=seed)
    starts = []
    for chain in range(budget["chains"]):
        torch.manual_seed(seed + 100 + chain)
        model = models.mlp(1, 50, 1)
        trainer = METHODS["map"].build(model, DATA_SIZE, lr=1e-2, prior_prec=PRIOR_PREC)
        training.train(model, trainer, data.x_train, data.y_train, _mean_nll, epochs=budget["map_steps"])
        starts.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    start = time.perf_counter()
    post = nuts_posterior(
        models.mlp(1, 50, 1),
        data.x_train,
        data.y_train,
        prior_prec=PRIOR_PREC,
        noise_prec=NOISE_PREC,
        num_samples=budget["samples"],
        warmup=budget["warmup"],
        chains=budget["chains"],
        seed=seed,
        max_tree_depth=budget["tree_depth"],
        init_params=torch.stack(starts),
    )
    seconds = time.perf_counter() - start
    samples = post.predict(data.x_test.to(torch.float32))
    stats = post.output_diagnostics(data.x_test.to(torch.float32))
    return {
        **_summaries(samples, data, seconds),
        "output_max_r_hat": float(stats["r_hat"].max()),
        "output_median_ess": float(stats["ess"].median()),
        "divergences": sum(post.divergences),
    }


def _mean_nll(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * NOISE_PREC * ((output - y) ** 2).mean()  # mean Gaussian NLL + const


def _summaries(samples: torch.Tensor, data: ToyRegression, seconds: float) -> dict[str, Any]:
    """The table's and the figure's numbers from predictive samples [S, n, 1]."""
    mean = samples.mean(0)[:, 0]
    std_f = samples.std(0)[:, 0]
    inside = (data.x_test[:, 0] > TRAIN_RANGE[0]) & (data.x_test[:, 0] < TRAIN_RANGE[1])
    half_width = Z95 * torch.sqrt(std_f.double() ** 2 + 1.0 / NOISE_PREC)
    covered = ((data.y_test[:, 0].double() - mean.double()).abs() <= half_width).double().mean()
    return {
        "seconds": seconds,
        "test_rmse": metrics.rmse(mean, data.y_test),
        "test_loglik": metrics.gaussian_log_likelihood(samples, data.y_test, NOISE_PREC),
        "train_range_rmse": metrics.rmse(mean[inside], data.y_test[inside]),
        "coverage95": float(covered),
        "pred_mean": mean.tolist(),
        "pred_std": std_f.tolist(),
    }


#: the targets a NUTS run's predictions must meet to count as converged (as ``ngvi hmc``'s reference)
TARGET_R_HAT, TARGET_ESS = 1.05, 100


def nuts_converged(r: dict[str, Any]) -> bool:
    """Whether the NUTS job's predictions mixed: worst split R-hat and median ESS within the targets."""
    return r["output_max_r_hat"] <= TARGET_R_HAT and r["output_median_ess"] >= TARGET_ESS


def _label(name: str, r: dict[str, Any] | None = None) -> str:
    if name == "nuts":
        if r is not None and not nuts_converged(r):
            return "NUTS: NOT CONVERGED (a multi-start ensemble)"
        return "NUTS (HMC reference)"
    return METHODS[name].label + (" (linearised)" if METHODS[name].linearized else "")


def _nuts_correlation(r: dict[str, Any], nuts: dict[str, Any] | None) -> str:
    if nuts is None:
        return "–"
    a, b = np.square(r["pred_std"]), np.square(nuts["pred_std"])
    if not np.isfinite(a).all() or min(a.std() / a.mean(), b.std() / b.mean()) < 1e-9:  # a flat band
        return "–"
    return f"{np.corrcoef(a, b)[0, 1]:.2f}"


def _table(done: dict[str, dict[str, Any]], steps: int) -> str:
    nuts = done.get("nuts")
    rows = [
        [
            _label(name, r),
            f"{r['test_rmse']:.3f}",
            f"{r['test_loglik']:.2f}",
            f"{r['train_range_rmse']:.3f}",
            f"{r['coverage95']:.2f}",
            "1 (itself)" if name == "nuts" else _nuts_correlation(r, nuts),
            f"{r['seconds']:.1f}",
            NOTES.get(name, "")
            or (
                f"R-hat of f(x) ≤ {r['output_max_r_hat']:.2f}, median ESS {r['output_median_ess']:.0f}, "
                f"{r['divergences']} divergences"
                + ("" if nuts_converged(r) else f" (targets ≤ {TARGET_R_HAT}, ≥ {TARGET_ESS}: not converged)")
                if name == "nuts"
                else ""
            ),
        ]
        for name, r in done.items()
    ]
    unmixed = nuts is not None and not nuts_converged(nuts)
    head = (
        f"# ngvi demo: toy regression (BADAM App. D.1), {steps} full-batch steps, 100 predictive samples\n\n"
        f"Test points cover (−0.5, 1.2) and training inputs only {TRAIN_RANGE}: most of the test set is "
        f"extrapolation. Log-likelihood uses noise precision τ = {NOISE_PREC:.0f}. Coverage: the fraction of "
        "test targets inside the 95% predictive band (mean ± 1.96 std, noise included). r with NUTS: the "
        "Pearson correlation of the method's predictive variance of f with NUTS's over the test inputs "
        "(NUTS is a short run: see its note).\n\n"
        + (
            "**NUTS did not converge** (its note): its chains stay near their MAP starts, so its row and the "
            "r column compare with a multi-start ensemble, not with the posterior.\n\n"
            if unmixed
            else ""
        )
    )
    header = [
        "method",
        "test RMSE",
        "test log-lik",
        f"RMSE on {TRAIN_RANGE}",
        "95% coverage",
        "r with NUTS variance",
        "train time [s]",
        "note",
    ]
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
    """One panel per method on shared axes that hold every band whole; the training range is shaded; NUTS's
    band (the ground truth, if it ran) is drawn in every other panel, dotted."""
    x = data.x_test[:, 0].numpy()
    truth = ToyRegression.curve(data.x_test)[:, 0].numpy()
    noise = 1.0 / NOISE_PREC
    fig, axes = figure(len(done), cols=3, size=(4.2, 3.3))
    limits = band_limits(done, truth, data)
    reference = done.get("nuts")
    reference_label = "NUTS ±2 std (weights)"
    if reference is not None and not nuts_converged(reference):
        reference_label += ", not converged"
    for ax, (name, r) in zip(axes, done.items(), strict=True):
        colour = "tab:red" if name == "nuts" else "tab:blue"  # the ground truth in the colour of its outline
        mean, std_f = np.array(r["pred_mean"]), np.array(r["pred_std"])
        std_y = np.sqrt(std_f**2 + noise)
        ax.axvspan(*TRAIN_RANGE, color="0.92", zorder=0, label="training inputs")
        ax.fill_between(
            x,
            mean - 2 * std_y,
            mean + 2 * std_y,
            color=colour,
            alpha=0.15,
            lw=0,
            label="±2 std (with noise)",
        )
        ax.fill_between(x, mean - 2 * std_f, mean + 2 * std_f, color=colour, alpha=0.35, lw=0,
                        label="±2 std (weights)")  # fmt: skip
        ax.plot(x, truth, "k--", lw=1, label="noise-free curve")
        if reference is not None and name != "nuts":  # the ground truth's band, for comparison
            ref_mean, ref_std = np.array(reference["pred_mean"]), np.array(reference["pred_std"])
            for sign in (-1, 1):
                ax.plot(x, ref_mean + sign * 2 * ref_std, ":", color="tab:red", lw=1.1,
                        label=reference_label if sign < 0 else None)  # fmt: skip
        ax.plot(x, mean, color=colour, lw=1.5, label="predictive mean")
        ax.scatter(
            data.x_train[:, 0], data.y_train[:, 0], s=4, color="tab:orange", zorder=3, label="training data"
        )
        ax.set_title(
            f"{_label(name, r)}\ntest RMSE {r['test_rmse']:.2f}, log-lik {r['test_loglik']:.1f}"
            + (f", R-hat {r['output_max_r_hat']:.2f}" if name == "nuts" else ""),
            fontsize=9,
            color="tab:red" if name == "nuts" and not nuts_converged(r) else "black",
        )
        ax.set_xlim(x.min(), x.max())
        ax.set_ylim(*limits)
        ax.set_xlabel("x", fontsize=8)
        ax.set_ylabel("y", fontsize=8)
        ax.tick_params(labelsize=7)
    # the legend from a method's panel: it has NUTS's outline too
    save_figure(fig, path, legend_from=axes[1 if reference is not None and len(axes) > 1 else 0], dpi=120)


EXPERIMENT = Demo()
