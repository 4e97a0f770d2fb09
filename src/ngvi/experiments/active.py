"""``ngvi active``: NNG §5.3, Table 3: active learning by largest predictive variance against random choice.

Protocol (Zhang et al. 2018, §5.3, "following the protocol of Hernández-Lobato & Adams (2015)", PBP §5):
each trial splits a UCI set at random into 20 labelled training points, 100 test points and a pool of the
rest. Each round fits the model to the labelled points, and then one pool point is labelled and added:
the one of largest predictive variance (A, the information-gain criterion for Gaussian noise, MacKay 1992)
or one at random (R, the control). After the last round the test RMSE (original units) is recorded; the
table reports its mean ± s.e. over trials. Every method, HMC included (pyro's NUTS), targets the posterior of
:mod:`ngvi.experiments.hmc.protocol`.

Deviations for budget (stated in the results README): inputs and targets keep the standardisation of the
first 20 points throughout a trial; after the first fit every round continues from the previous round's
posterior (``refit_steps`` more steps for the variational methods; NUTS chains start at the previous
round's last draws and warm up again, for ``warmup`` iterations; the first round, from prior draws, warms up
for twice that), instead of refitting from scratch.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import torch

from ngvi import metrics

from .core import args as arg_types
from .core.methods import METHODS as REGISTRY
from .core.report import figure, fmt_mean_se, markdown_table, mean_se, save_figure
from .core.runner import Experiment, Job, Run
from .hmc import protocol
from .hmc.experiment import MIXING_FIELDS, add_budget_arguments, budget_of, method_argument
from .hmc.protocol import ACTIVE_BUDGET, Budget, Standardised
from .hmc.published import PAPER_COLUMN, TABLE3
from .hmc.report import SHORT, label

STRATEGIES = ("R", "A")
QUICK_ROUNDS = 2


def _label(name: str) -> str:
    return "HMC (NUTS)" if name == "hmc" else label(name)


class Active(Experiment):
    name = "active"
    requires = ("tqdm", "matplotlib", "scipy", "pyro")
    help = "NNG Table 3: active learning (max predictive variance vs random) on UCI, test RMSE, with HMC"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        method_argument(parser)
        parser.add_argument(
            "--hmc", choices=["yes", "no"], default="yes", help="also run HMC (pyro NUTS) as a method (yes)"
        )
        arg_types.add_count(parser, "--trials", 10, "trials per set (10)")
        arg_types.add_count(
            parser,
            "--rounds",
            None,
            f"points labelled after the first fit (default 10; --quick: {QUICK_ROUNDS})",
        )
        arg_types.add_count(
            parser,
            "--refit-steps",
            None,
            f"steps after each added point, from the last fit (default {ACTIVE_BUDGET.refit_steps}; "
            f"--quick: {Budget.quick().refit_steps})",
        )
        add_budget_arguments(parser, ACTIVE_BUDGET, mixing=False)

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        budget = asdict(budget_of(args, extra=("refit_steps",)))
        return {
            "budget": {k: v for k, v in budget.items() if k not in MIXING_FIELDS},  # the default targets
            **arg_types.with_quick(args, {"rounds": 10}, {"rounds": QUICK_ROUNDS}),  # an explicit option wins
            "initial": 20,
            "test": 100,
            "seed": args.seed,
            "model": dict(protocol.MODEL),
        }

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        config = self.config(args)
        methods = (["hmc"] if args.hmc == "yes" else []) + list(args.methods)
        return [
            Job(
                f"{method}/{dataset}/{trial}/{strategy}",
                {
                    "method": method,
                    "dataset": dataset,
                    "trial": trial,
                    "strategy": strategy,
                    "data_dir": args.data_dir,
                    **config,
                },
            )
            for trial in range(args.trials)  # trial-major: a run stopped early has every set's first trials
            for dataset in args.datasets
            for method in methods
            for strategy in STRATEGIES
        ]

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        budget = Budget(**spec["budget"])
        x, y = protocol.load(spec["dataset"], spec["data_dir"])
        seed = spec["seed"] * 1000 + spec["trial"]
        labelled, test, pool = protocol.subset_indices(len(x), (spec["initial"], spec["test"], -1), seed)
        labelled, pool = list(labelled), list(pool)
        scaler = Standardised.of(x[labelled], y[labelled]).scaler  # fixed for the whole trial
        x_all = torch.as_tensor(scaler.transform_x(x), dtype=torch.float32)
        y_all = torch.as_tensor(scaler.transform_y(y), dtype=torch.float32).unsqueeze(1)
        y_test = torch.as_tensor(y[test], dtype=torch.float64)
        pick = np.random.default_rng([seed, 7])
        learner = _Learner(spec["method"], x.shape[1], budget, seed)
        rmse, chosen, seconds = [], [], 0.0
        for round_ in range(spec["rounds"] + 1):
            data = Standardised(x_all[labelled], y_all[labelled], scaler)
            start = time.perf_counter()
            learner.fit(data, first=round_ == 0)
            seconds += time.perf_counter() - start
            f_test = learner.predict(x_all[test])
            learner.record_mixing(x_all[test])
            rmse.append(metrics.rmse(scaler.inverse_y(f_test.mean(0).double()), y_test))
            if round_ == spec["rounds"]:
                break
            if spec["strategy"] == "A":
                index = int(learner.predict(x_all[pool]).var(0).argmax())
            else:
                index = int(pick.integers(len(pool)))
            chosen.append(int(pool[index]))
            labelled.append(pool.pop(index))
        return {"rmse": rmse[-1], "rmse_curve": rmse, "chosen": chosen, "seconds": seconds, **learner.info}

    def report(self, args: argparse.Namespace, run: Run) -> None:
        write_report(args, run, (["hmc"] if args.hmc == "yes" else []) + list(args.methods))


class _Learner:
    """One method through the rounds: a variational trainer continued, or NUTS restarted from its draws."""

    def __init__(self, name: str, n_inputs: int, budget: Budget, seed: int):
        self.name, self.budget, self.seed, self.n_inputs = name, budget, seed, n_inputs
        self.model: Any = None
        self.trainer: Any = None
        self.posterior: Any = None
        self.info: dict[str, Any] = {}

    def fit(self, data: Standardised, first: bool) -> None:
        n = data.x.shape[0]
        if self.name == "hmc":
            # the first round starts at prior draws and warms up twice as long; later rounds continue from
            # the previous round's last draws (one point more: the posterior moved little)
            init = None if first else self.posterior.draws[:, -1]
            budget = replace(self.budget, warmup=2 * self.budget.warmup) if first else self.budget
            self.posterior = protocol.nuts(data, budget, self.seed + 7919 * n, init_from=init)
            stats = self.posterior.summary()
            self.info["max_weight_r_hat"] = max(self.info.get("max_weight_r_hat", 0.0), stats["max_r_hat"])
            self.info["divergences"] = self.info.get("divergences", 0) + sum(stats["divergences"])
            return
        if first:
            self.model, self.trainer = protocol.build(self.name, self.n_inputs, n, self.seed)
        for group in self.trainer.param_groups:
            if "data_size" in group:
                group["data_size"] = n  # the posterior of the grown data set (N scales the likelihood)
        protocol.train_vi(
            self.model, self.trainer, data, self.budget.steps if first else self.budget.refit_steps
        )

    def record_mixing(self, x: torch.Tensor) -> None:
        """For NUTS: the worst split R-hat and lowest ESS of the predictions at x over all rounds so far, and
        whether every round met the budget's targets (``mixed``)."""
        if self.name != "hmc":
            return
        stats = self.posterior.output_diagnostics(x)
        self.info["output_max_r_hat"] = max(
            self.info.get("output_max_r_hat", 0.0), float(stats["r_hat"].max())
        )
        self.info["output_min_ess"] = min(
            self.info.get("output_min_ess", float("inf")), float(stats["ess"].min())
        )
        self.info["mixed"] = protocol.mixed(self.info, self.budget)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        if self.name == "hmc":
            return self.posterior.predict(x)[..., 0]
        return protocol.vi_predictions(self.model, self.trainer, self.name, x, protocol.PREDICT_SAMPLES)


def _rmse(runs: dict[str, Any], method: str, dataset: str, strategy: str, trials: int) -> dict[int, float]:
    return {t: runs[k]["rmse"] for t in range(trials) if (k := f"{method}/{dataset}/{t}/{strategy}") in runs}


def _hmc_mixed(runs: dict[str, Any], dataset: str, strategy: str, trials: int) -> bool:
    """Whether NUTS mixed in every round of every trial run for this set and strategy."""
    done = [runs[k] for t in range(trials) if (k := f"hmc/{dataset}/{t}/{strategy}") in runs]
    return all(r.get("mixed", False) for r in done)


def write_report(args: argparse.Namespace, run: Run, methods: list[str]) -> None:
    runs, config = run.results["runs"], run.results["config"]
    text = [
        "# NNG Table 3: test RMSE after active learning (R: random choice, A: largest predictive variance)\n",
        f"{config['initial']} initial labelled points, {config['test']} test points, the rest a pool; "
        f"{config['rounds']} points added one at a time; {args.trials} trial(s) per set, mean ± s.e. of the "
        f"final test RMSE (original units). Budget: {config['budget']}. Paper: Zhang et al. 2018, Table 3.\n",
    ]
    header = ["data set"]
    for m in methods:  # the paper's columns: NNG-FFG = noisy Adam, NNG-MVG = noisy K-FAC
        header += [f"{_label(m)} R", f"{_label(m)} A"]
    rows, better = [], {m: [0, 0] for m in methods}
    for d in args.datasets:
        row = [SHORT[d]]
        for m in methods:
            values = {s: _rmse(runs, m, d, s, args.trials) for s in STRATEGIES}
            if m == "hmc" and not all(_hmc_mixed(runs, d, s, args.trials) for s in STRATEGIES):
                row += ["not mixed"] * len(STRATEGIES)
                continue
            row += [fmt_mean_se(*mean_se(values[s].values())[:2]) if values[s] else "–" for s in STRATEGIES]
            if values["R"] and values["A"]:
                better[m][1] += 1
                better[m][0] += mean_se(values["A"].values())[0] < mean_se(values["R"].values())[0]
        rows.append(row)
    text.append(markdown_table(header, rows))
    if "hmc" in methods:
        text.append(
            "\nHMC's cells read \"not mixed\" where, in some trial and round, NUTS's test predictions missed "
            f"split R-hat ≤ {config['budget'].get('target_r_hat', 1.05):g} or ESS ≥ "
            f"{config['budget'].get('target_ess', 100):g} (runs recorded before this check count as not "
            "mixed).\n"
        )
    text.append(
        "\nA below R (active learning helped) on: "
        + ", ".join(f"{_label(m)} {a}/{n}" for m, (a, n) in better.items() if n)
        + " sets.\n"
    )
    paper_header = ["data set", *TABLE3]
    paper_rows = [
        [SHORT[d], *[f"{TABLE3[c][d][0]:.3f} ± {TABLE3[c][d][1]:.3f}" for c in TABLE3]] for d in args.datasets
    ]
    text.append("\nThe paper's Table 3 (its model, HMC and budgets; PBP is Hernández-Lobato & Adams 2015):\n")
    text.append(markdown_table(paper_header, paper_rows))
    secs = [
        [_label(m), f"{np.mean(v):.0f}", str(len(v))]
        for m in methods
        if (v := [r["seconds"] for k, r in runs.items() if k.startswith(f"{m}/")])
    ]
    text.append("\nSeconds per job (all rounds of one method, set, trial and strategy)\n")
    text.append(markdown_table(["method", "seconds", "jobs"], secs))
    (run.out / "table.md").write_text("\n".join(text))
    print((run.out / "table.md").read_text())
    _curves(runs, methods, args.datasets, args.trials, run.out / "curves.png")
    plot_differences(runs, methods, args.datasets, range(args.trials), run.out / "differences.png")
    print(f"wrote {run.out / 'table.md'}, curves.png, differences.png and results.json")


def _curves(runs: dict[str, Any], methods: list[str], datasets: list[str], trials: int, path: Any) -> None:
    """Test RMSE after each round, mean over trials with ± 1 s.e. shaded, per set: solid A, dashed R
    (NNG-FFG = noisy Adam, NNG-MVG = noisy K-FAC). The bands are each arm's own spread; the A − R difference
    the README reads is paired by trial, drawn with its interval by :func:`plot_differences`."""
    cols = min(4, len(datasets))
    fig, axes = figure(len(datasets), cols=4, size=(max(3.4, 10.0 / cols), 2.8))  # room for the legend
    colours = {m: f"C{i}" for i, m in enumerate(methods)}
    for ax, d in zip(axes, datasets, strict=True):
        for m in methods:
            for s, style in (("A", "-"), ("R", "--")):
                curves = [runs[k]["rmse_curve"] for t in range(trials) if (k := f"{m}/{d}/{t}/{s}") in runs]
                if curves:
                    short = PAPER_COLUMN.get(m) or REGISTRY[m].label  # compact legend entries
                    if m == "hmc" and not _hmc_mixed(runs, d, s, trials):
                        short += " (not mixed)"
                    mean = np.mean(curves, 0)
                    ax.plot(mean, style, color=colours[m], lw=1.2, label=f"{short} {s}")
                    if len(curves) > 1:
                        se = np.std(curves, 0, ddof=1) / np.sqrt(len(curves))
                        ax.fill_between(np.arange(len(mean)), mean - se, mean + se, color=colours[m],
                                        alpha=0.12 if s == "A" else 0.06, lw=0)  # fmt: skip
        ax.set_title(SHORT[d], fontsize=9)
        ax.set_xlabel("points added", fontsize=8)
        ax.set_ylabel("test RMSE (target units)", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle("mean over trials, ± 1 s.e. shaded (each arm's own spread)", fontsize=9)
    save_figure(fig, path, legend_from=axes[0])


def plot_differences(
    runs: dict[str, Any], methods: list[str], datasets: list[str], trials: range, path: Any, title: str = ""
) -> None:
    """A − R, paired by trial, after each round: the mean over ``trials`` with its 95% t-interval shaded,
    one line per method, per set; below 0, the active choice helped."""
    from scipy import stats

    cols = min(4, len(datasets))
    fig, axes = figure(len(datasets), cols=4, size=(max(3.4, 10.0 / cols), 2.8))
    colours = {m: f"C{i}" for i, m in enumerate(methods)}
    for ax, d in zip(axes, datasets, strict=True):
        for m in methods:
            pairs = [(f"{m}/{d}/{t}/A", f"{m}/{d}/{t}/R") for t in trials]
            diff = np.array(
                [
                    np.subtract(runs[a]["rmse_curve"], runs[r]["rmse_curve"])
                    for a, r in pairs
                    if a in runs and r in runs
                ]
            )
            if len(diff) < 2:
                continue
            mean = diff.mean(0)
            half = stats.t.ppf(0.975, len(diff) - 1) * diff.std(0, ddof=1) / np.sqrt(len(diff))
            short = PAPER_COLUMN.get(m) or REGISTRY[m].label
            ax.plot(mean, color=colours[m], lw=1.2, label=f"{short} A − R")
            ax.fill_between(
                np.arange(len(mean)), mean - half, mean + half, color=colours[m], alpha=0.18, lw=0
            )
        ax.axhline(0.0, color="0.5", lw=0.7)
        ax.set_title(SHORT[d], fontsize=9)
        ax.set_xlabel("points added", fontsize=8)
        ax.set_ylabel("A − R test RMSE", fontsize=8)
        ax.tick_params(labelsize=7)
    n = len(trials)
    fig.suptitle(title or f"A − R paired by trial: mean over {n} trials, 95% interval shaded", fontsize=9)
    save_figure(fig, path, legend_from=axes[0])


EXPERIMENT = Active()
