"""The report of ``ngvi classify``: a table per method (ours beside NNG's pattern), reliability diagrams in
the
style of NNG Fig. 2, entropy histograms in and out of distribution, and the rotation-shift curve."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.methods import METHODS
from ..core.report import figure, markdown_table, save_figure
from ..core.runner import Run

#: NNG Table 2 (CIFAR-10, half-width VGG16, test accuracy %): plain, [D] augmentation, [B] batch norm, both
NNG_TABLE2 = {
    "SGD": (81.79, 88.35, 85.75, 91.39),
    "K-FAC": (82.39, 88.89, 86.86, 92.13),
    "BBB": (82.82, 88.31, None, None),
    "Noisy Adam": (82.68, 88.23, None, None),
    "Noisy K-FAC": (85.52, 89.35, 88.22, 92.01),
}
POINT_COUNTERPART = ("kfac", "map")  # noisy K-FAC's point-estimate counterpart: K-FAC, else Adam (MAP)


def label(name: str) -> str:
    return METHODS[name].label if name in METHODS else name


def _fmt(value: float | None, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def table(runs: dict[str, dict[str, Any]], config: dict[str, Any]) -> str:
    ood = config["ood"]
    header = ["method", "acc", "NLL", "ECE", "Brier", *(["OOD AUROC"] if ood else []),
              "acc (μ)", "NLL (μ)", "ECE (μ)", "Brier (μ)", *(["AUROC (μ)"] if ood else []),
              "train [s]"]  # fmt: skip
    rows = []
    n_bins = len(next(iter(runs.values()))["reliability"]["bma"]["count"])  # as the run binned it
    for name, r in runs.items():
        cells = [label(name)]
        for kind in ("bma", "mean"):
            m = r[kind]
            cells += [f"{100 * m['accuracy']:.2f}", _fmt(m["nll"]), _fmt(m["ece"]), _fmt(m["brier"])]
            if ood:
                cells.append(_fmt(m.get("ood_auroc"), 3))
        cells.append(f"{r['train_seconds']:.0f}")
        rows.append(cells)
    size = config["train_size"] or "all"
    head = (
        f"# ngvi classify: {config['dataset']}, {config['model']}"
        f"{' + BatchNorm' if config['batch_norm'] else ''}, {config['epochs']} epoch(s), "
        f"{size} training images, batch {config['batch_size']}, seed {config['seed']}\n\n"
        f"Left: the Bayesian model average over {config['test_samples']} posterior samples; (μ): the mean "
        f"weights. Accuracy in %, NLL in nats per image, ECE with {n_bins} equal-width bins, Brier = "
        "Σ_c (p_c − 1[y=c])² averaged over images"
        + (", OOD AUROC of the predictive entropy, MNIST test (negative) against Fashion-MNIST test "
           "(positive)" if ood else "")
        + ". One seed: no standard errors.\n\n"
    )  # fmt: skip
    return head + markdown_table(header, rows) + "\n" + pattern(runs) + "\n" + nng_table()


def pattern(runs: dict[str, dict[str, Any]]) -> str:
    """NNG Fig. 2's claim (noisy K-FAC better calibrated than its point-estimate counterpart), checked."""
    if "noisy_kfac" not in runs:
        return ""
    nk = runs["noisy_kfac"]
    lines = ["## NNG's pattern: noisy K-FAC better calibrated than its point-estimate counterpart\n"]
    for other in POINT_COUNTERPART:
        if other in runs:
            o = runs[other]["bma"]
            verdict = "holds" if nk["bma"]["ece"] < o["ece"] else "does not hold"
            lines.append(
                f"- ECE noisy K-FAC (BMA) {nk['bma']['ece']:.4f} vs {label(other)} {o['ece']:.4f}: {verdict} "
                f"(NLL {nk['bma']['nll']:.4f} vs {o['nll']:.4f}, "
                f"accuracy {100 * nk['bma']['accuracy']:.2f} vs "
                f"{100 * o['accuracy']:.2f} %)."
            )
    lines.append(
        f"- noisy K-FAC's own mean weights: ECE {nk['mean']['ece']:.4f} (BMA {nk['bma']['ece']:.4f})."
    )
    return "\n".join(lines) + "\n"


def nng_table() -> str:
    rows = [[m, *(_fmt(v, 2) if v is not None else "N/A" for v in vals)] for m, vals in NNG_TABLE2.items()]
    return (
        "\n## For reference: NNG Table 2 (CIFAR-10, half-width VGG16, test accuracy %, not rerun here)\n\n"
        + markdown_table(["method", "plain", "[D]", "[B]", "[D+B]"], rows)
        + "\nNNG Fig. 2 shows reliability diagrams of K-FAC and noisy K-FAC on CIFAR-10 (without and with "
        "BN): the point estimate is over-confident, noisy K-FAC's bars lie near the diagonal.\n"
    )


def reliability_figure(runs: dict[str, dict[str, Any]], path: Any, kind: str = "bma") -> None:
    """One panel per method, NNG Fig. 2 style: accuracy per confidence bin as bars, the gap to the diagonal
    shaded, the ECE in the corner."""
    fig, axes = figure(len(runs), cols=4, size=(3.0, 3.0))
    for ax, (name, r) in zip(axes, runs.items(), strict=True):
        rel = r["reliability"][kind]
        n_bins = len(rel["count"])  # the bins are the run's: the report needs no constant of the experiment
        edges = np.linspace(0.0, 1.0, n_bins + 1)
        centres, width = (edges[:-1] + edges[1:]) / 2, 1.0 / n_bins
        acc, conf, count = (np.array(rel[k]) for k in ("accuracy", "confidence", "count"))
        filled = count > 0
        ax.bar(centres[filled], acc[filled], width=width, color="tab:blue", edgecolor="k", lw=0.5,
               label="accuracy")  # fmt: skip
        low = np.minimum(acc, conf)[filled]
        ax.bar(centres[filled], np.abs(conf - acc)[filled], bottom=low, width=width, color="none",
               edgecolor="tab:red", hatch="////", lw=0.5, label="gap to mean confidence")  # fmt: skip
        ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
        ax.text(0.04, 0.9, f"ECE = {r[kind]['ece']:.4f}", fontsize=8, transform=ax.transAxes,
                bbox={"facecolor": "white", "edgecolor": "0.7"})  # fmt: skip
        ax.set_title(f"{label(name)} (acc {100 * r[kind]['accuracy']:.1f} %)", fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("confidence (top-class probability)", fontsize=8)
        ax.set_ylabel("accuracy", fontsize=8)
        ax.tick_params(labelsize=7)
    save_figure(fig, path, legend_from=axes[0])


def entropy_figure(runs: dict[str, dict[str, Any]], path: Any) -> None:
    """Histograms (densities) of the BMA's predictive entropy on MNIST test and Fashion-MNIST test."""
    fig, axes = figure(len(runs), cols=4, size=(3.0, 2.6))
    for ax, (name, r) in zip(axes, runs.items(), strict=True):
        for key, colour, text in (("in_bma", "tab:blue", "MNIST test (in)"),
                                  ("ood_bma", "tab:orange", "Fashion-MNIST (OOD)")):  # fmt: skip
            counts = np.array(r["entropy_hist"][key], dtype=float)
            edges = np.linspace(0.0, np.log(10), len(counts) + 1)  # the run's histogram over [0, log 10]
            ax.stairs(counts / counts.sum(), edges, fill=True, alpha=0.45, color=colour, label=text)
        ax.set_title(f"{label(name)}: AUROC {r['bma']['ood_auroc']:.3f}", fontsize=9)
        ax.set_xlabel("predictive entropy [nats]", fontsize=8)
        ax.set_ylabel("fraction of images", fontsize=8)
        ax.set_yscale("log")
        ax.tick_params(labelsize=7)
    save_figure(fig, path, legend_from=axes[0])


def shift_figure(runs: dict[str, dict[str, Any]], path: Any) -> None:
    """Accuracy and ECE of the BMA against the rotation angle, a line per method."""
    fig, axes = figure(2, cols=2, size=(4.6, 3.4))
    for name, r in runs.items():
        angles = r["shift"]["angles"]
        for ax, key in zip(axes, ("accuracy", "ece"), strict=True):
            ax.plot(angles, r["shift"]["bma"][key], marker="o", ms=3, label=label(name))
    for ax, text in zip(axes, ("accuracy (BMA)", "ECE (BMA, 15 bins)"), strict=True):
        ax.set_xlabel("rotation of the test images [degrees]", fontsize=8)
        ax.set_ylabel(text, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    save_figure(fig, path, legend_from=axes[0])


def write_report(run: Run, names: list[str]) -> None:
    runs = {n: run.results["runs"][n] for n in names}
    config = run.results["config"]
    (run.out / "table.md").write_text(table(runs, config))
    reliability_figure(runs, run.out / "reliability.png")
    reliability_figure(runs, run.out / "reliability_mean_weights.png", kind="mean")
    if config["ood"]:
        entropy_figure(runs, run.out / "entropy.png")
    shift_figure(runs, run.out / "shift.png")
    print((run.out / "table.md").read_text())
    print(f"wrote table.md and the figures to {run.out}")
