"""Table 4 beside the paper, NUTS's diagnostics, and two figures (bars per set; one trial's variances)."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from ..core.methods import METHODS as REGISTRY
from ..core.report import figure, fmt_mean_se, markdown_table, mean_se, save_figure
from ..core.runner import Job, Run
from . import protocol
from .published import PAPER_COLUMN, TABLE4

SHORT = {
    "bostonHousing": "Boston",
    "concrete": "Concrete",
    "energy": "Energy",
    "kin8nm": "Kin8nm",
    "naval-propulsion-plant": "Naval",
    "power-plant": "Pow. Plant",
    "wine-quality-red": "Wine",
    "yacht": "Yacht",
}


def label(name: str) -> str:
    ours, paper = REGISTRY[name].label, PAPER_COLUMN.get(name)
    return ours + (f" ({paper})" if paper and paper != ours else "")


def reference_mixed(hmc: dict[str, Any]) -> bool:
    """Whether a NUTS run's predictions mixed (runs recorded before the flag existed are judged by the
    default targets, split R-hat ≤ 1.05 and ESS ≥ 100)."""
    if "mixed" in hmc:
        return bool(hmc["mixed"])
    return protocol.mixed(hmc, protocol.Budget())


def correlations(runs: dict[str, Any], methods: list[str], datasets: list[str], trials: int) -> dict:
    """method -> data set -> {trial: Pearson r of its variances with NUTS's}, over the trials whose NUTS
    reference mixed (a reference that has not mixed cannot rank methods)."""
    out: dict[str, dict[str, dict[int, float]]] = {m: {d: {} for d in datasets} for m in methods}
    for d in datasets:
        for t in range(trials):
            hmc = runs.get(f"hmc/{d}/{t}")
            if hmc is None or not reference_mixed(hmc):
                continue
            for m in methods:
                r = runs.get(f"{m}/{d}/{t}")
                if r is not None and np.isfinite(r["variance"]).all():
                    out[m][d][t] = protocol.pearson(r["variance"], hmc["variance"])
    return out


def references(runs: dict[str, Any], dataset: str, trials: int) -> tuple[int, int]:
    """(trials whose NUTS reference mixed, trials with a NUTS run) for one set."""
    hmc = [runs[k] for t in range(trials) if (k := f"hmc/{dataset}/{t}") in runs]
    return sum(reference_mixed(h) for h in hmc), len(hmc)


def write_report(args: argparse.Namespace, run: Run, jobs: list[Job]) -> None:
    runs = run.results["runs"]
    methods, datasets, trials = args.methods, args.datasets, args.trials
    corr = correlations(runs, methods, datasets, trials)
    config = run.results["config"]
    text = [
        "# NNG Table 4: Pearson correlation of predictive variances with HMC's\n",
        f"{config['train']} labelled and {config['unlabelled']} unlabelled points per trial, "
        f"{trials} trial(s) per set; mean ± s.e. over trials. Model: 1 hidden layer of "
        f"{protocol.HIDDEN} ReLU units, λ = "
        f"{protocol.PRIOR_PREC:g}, τ = {protocol.NOISE_PREC:g} (standardised units). Budget: "
        f"{_budget(config['budget'])}. Paper: Zhang et al. 2018, Table 4 (their model and HMC, not ours).\n",
    ]
    header = ["data set", "mixed references", *[label(m) for m in methods], *[f"paper {c}" for c in TABLE4]]
    rows, wins, compared = [], 0, 0
    for d in datasets:
        good, ran = references(runs, d, trials)
        missing = "no reference" if ran else "–"
        cells = [fmt_mean_se(*mean_se(corr[m][d].values())[:2]) if corr[m][d] else missing for m in methods]
        paper = [f"{TABLE4[c][d][0]:.3f} ± {TABLE4[c][d][1]:.3f}" for c in TABLE4]
        rows.append([SHORT[d], f"{good} / {ran}", *cells, *paper])
        if {"noisy_kfac", "noisy_adam"} <= set(methods) and corr["noisy_kfac"][d] and corr["noisy_adam"][d]:
            compared += 1
            wins += mean_se(corr["noisy_kfac"][d].values())[0] > mean_se(corr["noisy_adam"][d].values())[0]
    text.append(markdown_table(header, rows))
    budget = config["budget"]
    text.append(
        f"\nA trial counts only where its NUTS reference mixed: every prediction's split R-hat ≤ "
        f"{budget.get('target_r_hat', 1.05):g} and ESS ≥ {budget.get('target_ess', 100):g} "
        '("mixed references": such trials / trials run). A set without one is marked "no reference", '
        "not given a number.\n"
    )
    if compared:
        text.append(
            f"\nNoisy K-FAC's mean correlation is above noisy Adam's on {wins} of {compared} sets "
            "(the paper: NNG-MVG above NNG-FFG on all 8).\n"
        )
    text.append("\n" + _diagnostics_table(runs, datasets, trials))
    text.append("\n" + _timing_table(runs, methods, datasets, trials))
    (run.out / "table.md").write_text("\n".join(text))
    print((run.out / "table.md").read_text())
    _bars(corr, methods, datasets, run.out / "correlations.png")
    _scatter(runs, methods, datasets[0], run.out / "variances.png")
    print(f"wrote {run.out / 'table.md'}, correlations.png, variances.png and results.json")


def _budget(budget: dict[str, Any]) -> str:
    doublings = budget.get("doublings", 0)
    rerun = f", rerun with twice the warm-up and draws up to {doublings}× until mixed" if doublings else ""
    return (
        f"{budget['steps']} full-batch steps per variational fit; NUTS: {budget['chains']} chains × "
        f"({budget['warmup']} warm-up + {budget['samples']} draws), tree depth ≤ {budget['tree_depth']}"
        + rerun
    )


def _diagnostics_table(runs: dict[str, Any], datasets: list[str], trials: int) -> str:
    rows = []
    for d in datasets:
        hmc = [runs[k] for t in range(trials) if (k := f"hmc/{d}/{t}") in runs]
        if not hmc:
            continue
        rows.append(
            [
                SHORT[d],
                f"{sum(reference_mixed(h) for h in hmc)} / {len(hmc)}",
                f"{max(len(h.get('attempts', [h])) for h in hmc)}",
                f"{max(h['output_max_r_hat'] for h in hmc):.3f}",
                f"{min(h['output_min_ess'] for h in hmc):.0f}",
                f"{np.median([h['output_median_ess'] for h in hmc]):.0f}",
                f"{max(h['max_r_hat'] for h in hmc):.2f}",
                str(sum(sum(h["divergences"]) for h in hmc)),
                f"{np.mean([np.mean(h['step_size']) for h in hmc]):.3f}",
                f"{np.mean([h['seconds_total'] for h in hmc]):.0f}",
            ]
        )
    header = [
        "data set",
        "mixed",
        "most NUTS runs",
        "worst R-hat of f(x*)",
        "lowest ESS of f(x*)",
        "median ESS of f(x*)",
        "worst R-hat of a weight",
        "divergences",
        "mean step size",
        "NUTS seconds / trial",
    ]
    note = (
        "NUTS diagnostics over all trials, of each trial's last run (pyro's split R-hat; ESS by Geyer's "
        'initial monotone sequence; both over the chains; "most NUTS runs": the most runs a trial '
        "needed). f(x*) are the predictions at the unlabelled points, which the table uses; "
        "single weights are not identified "
        "(hidden units can swap), so their R-hat can be large while every prediction agrees.\n\n"
    )
    return note + markdown_table(header, rows)


def _timing_table(runs: dict[str, Any], methods: list[str], datasets: list[str], trials: int) -> str:
    rows = []
    for m in methods:
        secs = [runs[k]["seconds"] for d in datasets for t in range(trials) if (k := f"{m}/{d}/{t}") in runs]
        if secs:
            rows.append([label(m), f"{np.mean(secs):.1f}", str(len(secs))])
    return "Training time of the variational methods\n\n" + markdown_table(
        ["method", "seconds per fit", "fits"], rows
    )


def _bars(corr: dict, methods: list[str], datasets: list[str], path: Any) -> None:
    """One bar per method and set (mean ± s.e.); the paper's value for that method's column, where it has
    one, as a white diamond on the bar."""
    fig, (ax,) = figure(1, cols=1, size=(10.0, 4.0))
    width = 0.8 / len(methods)
    xs = np.arange(len(datasets))
    marked = False
    for i, m in enumerate(methods):
        stats = [mean_se(corr[m][d].values()) for d in datasets]
        where = xs + i * width
        ax.bar(where, [s[0] for s in stats], width, yerr=[s[1] for s in stats], label=label(m), capsize=2)
        column = PAPER_COLUMN.get(m)
        if column in TABLE4:
            # a white diamond, not a bar-like tick: a horizontal mark read as an error bar's cap (issue 48)
            ax.plot(where, [TABLE4[column][d][0] for d in datasets], "D", ms=5.5, mfc="white", mec="black",
                    mew=1.2, ls="none", zorder=4,
                    label=None if marked else "the paper's value for that column (Table 4)")  # fmt: skip
            marked = True
    ax.set_xticks(xs + (len(methods) - 1) * width / 2, [SHORT[d] for d in datasets], fontsize=8)
    ax.set_ylabel("Pearson r with HMC's predictive variance", fontsize=9)
    ax.set_ylim(min(0.0, ax.get_ylim()[0]), 1.0)
    ax.axhline(0, color="0.5", lw=0.5)
    ax.set_title("Agreement with HMC (mean ± s.e. over trials)", fontsize=10)
    save_figure(fig, path, legend_from=ax)


def _scatter(runs: dict[str, Any], methods: list[str], dataset: str, path: Any) -> None:
    hmc = runs.get(f"hmc/{dataset}/0")
    shown = [m for m in methods if f"{m}/{dataset}/0" in runs]
    if hmc is None or not shown:
        return
    fig, axes = figure(len(shown), cols=4, size=(3.0, 2.9))
    ref = np.asarray(hmc["variance"])
    for ax, m in zip(axes, shown, strict=True):
        var = np.asarray(runs[f"{m}/{dataset}/0"]["variance"])
        ax.scatter(ref, var, s=6)
        ax.set_title(f"{label(m)}\nr = {protocol.pearson(var, ref):.2f}", fontsize=8)
        ax.set_xlabel("HMC predictive variance", fontsize=7)
        ax.set_ylabel("method's variance", fontsize=7)
        ax.tick_params(labelsize=6)
    fig.suptitle(f"{SHORT[dataset]}, trial 0: 100 unlabelled points", fontsize=9)
    save_figure(fig, path)
