"""``table.md`` and ``curves.png`` from ``results.json``: our rows beside the papers' rows.

Each cell is mean ± standard error over splits. Among our methods, per data set, the best mean is bold, and so
is every method that a paired t-test over the splits cannot tell from it at p = 0.01 (the rule of Khan et al.
2018, Table 1). Published rows carry no per-split values, so ours are compared with them by a two-sample
z-score on the standard errors, listed under "Comparison with the papers".
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from .._io import markdown_table
from .methods import METHODS
from .published import DECIMALS, SOURCES, published

METRICS = {"rmse": ("Test RMSE", -1), "loglik": ("Test log-likelihood", +1)}  # sign: +1 higher is better
SHORT = {"khan2018": "K18", "zhang2018": "Z18"}
P_VALUE = 0.01


def _per_split(results: dict[str, Any], dataset: str, method: str, metric: str) -> dict[int, float]:
    prefix = f"{dataset}/{method}/"
    return {
        int(k[len(prefix) :]): v[metric]
        for k, v in results["runs"].items()
        if k.startswith(prefix) and "diverged" not in v
    }


def diverged(results: dict[str, Any], datasets: list[str], methods: list[str]) -> str:
    """A note listing the fits that diverged (non-finite gradients), which the table leaves out."""
    counts: Counter[str] = Counter()
    for k, v in results["runs"].items():
        dataset, method, _ = k.split("/")
        if "diverged" in v and dataset in datasets and method in methods:
            counts[f"{METHODS[method].label} on {dataset}"] += 1
    if not counts:
        return ""
    listed = ", ".join(f"{k}: {n}" for k, n in sorted(counts.items()))
    return (
        "\nDiverged fits (non-finite gradients; left out of the means, and the cell shows how many splits "
        f"it averages): {listed}.\n"
    )


def _fmt(mean: float, se: float) -> str:
    """Enough decimals to show the standard error to two significant digits (2 to 5 decimals)."""
    if not math.isfinite(mean):
        return str(mean)
    digits = 2 if se <= 0 or not math.isfinite(se) else min(5, max(2, 1 - math.floor(math.log10(se))))
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def summarize(values: dict[int, float]) -> tuple[float, float, int]:
    v = np.array(list(values.values()), dtype=float)
    se = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")
    return float(v.mean()), se, len(v)


def _bold(results, dataset: str, methods: list[str], metric: str) -> set[str]:
    sign = METRICS[metric][1]
    values = {m: _per_split(results, dataset, m, metric) for m in methods}
    values = {m: v for m, v in values.items() if v}
    if not values:
        return set()
    best = max(values, key=lambda m: sign * summarize(values[m])[0])
    bold = {best}
    for m, v in values.items():
        common = sorted(set(v) & set(values[best]))
        if m == best or len(common) < 2:
            continue
        diff = np.array([v[s] - values[best][s] for s in common])
        if np.allclose(diff, 0.0):
            bold.add(m)
        elif (
            diff.std() > 1e-12 * abs(diff.mean())
            and stats.ttest_rel(diff, np.zeros_like(diff)).pvalue > P_VALUE
        ):
            bold.add(m)  # (a constant non-zero difference is as significant as it gets)
    return bold


def build_table(results: dict[str, Any], datasets: list[str], methods: list[str], header: str) -> str:
    sections = [header]
    for metric, (title, _) in METRICS.items():
        columns = ["Dataset"]
        for m in methods:
            columns.append(f"{METHODS[m].label} (ours)")
            columns += [f"{row} [{SHORT[src]}]" for src, row in METHODS[m].published.items()]
        rows = []
        for d in datasets:
            bold = _bold(results, d, methods, metric)
            row = [d]
            for m in methods:
                values = _per_split(results, d, m, metric)
                if values:
                    mean, se, n = summarize(values)
                    cell = _fmt(mean, se) + (
                        "" if n >= 20 or d == "protein-tertiary-structure" else f" ({n})"
                    )
                    row.append(f"**{cell}**" if m in bold else cell)
                else:
                    row.append("—")
                for src, name in METHODS[m].published.items():
                    pub = published(src, name, metric, d)
                    row.append(f"{pub[0]:.{DECIMALS[src]}f} ± {pub[1]:.{DECIMALS[src]}f}" if pub else "—")
            rows.append(row)
        sections.append(f"## {title}\n\n" + markdown_table(columns, rows))
    sections.append(diverged(results, datasets, methods))
    sections.append(comparison(results, datasets, methods))
    return "\n".join(sections)


def comparison(results: dict[str, Any], datasets: list[str], methods: list[str]) -> str:
    lines = [
        "## Comparison with the papers\n",
        "Difference ours − published, and its z-score on the two standard errors and the published "
        "rounding (|z| > 2 flagged).\n",
    ]
    rows = []
    for m in methods:
        for src, name in METHODS[m].published.items():
            for d in datasets:
                for metric, (title, sign) in METRICS.items():
                    pub = published(src, name, metric, d)
                    values = _per_split(results, d, m, metric)
                    if pub is None or not values:
                        continue
                    mean, se, _ = summarize(values)
                    diff = mean - pub[0]
                    # the papers round to DECIMALS places: a uniform error of ±half a unit (sd half/√3)
                    rounding = 0.5 * 10.0 ** -DECIMALS[src] / math.sqrt(3.0)
                    scale = math.sqrt((se if math.isfinite(se) else 0.0) ** 2 + pub[1] ** 2 + rounding**2)
                    z = diff / scale if scale > 0 else float("inf") * np.sign(diff)
                    verdict = "better" if sign * diff > 0 else "worse"
                    flag = f"**{verdict}**" if abs(z) > 2 else "same within noise"
                    rel = f"{100 * abs(diff) / abs(pub[0]):.0f}%" if pub[0] else "—"
                    rows.append(
                        [
                            METHODS[m].label,
                            f"{name} [{SHORT[src]}]",
                            d,
                            title,
                            f"{diff:+.3g}",
                            rel,
                            f"{z:+.1f}",
                            flag,
                        ]
                    )
    lines.append(
        markdown_table(
            ["ours", "paper row", "dataset", "metric", "ours − paper", "|diff|", "z", "verdict"], rows
        )
    )
    refs = "; ".join(f"[{SHORT[k]}] {v[0]}" for k, v in SOURCES.items())
    lines.append(f"\n{refs}. [Z18] used other splits (Hernández-Lobato & Adams' protocol).\n")
    return "\n".join(lines)


def plot_curves(results: dict[str, Any], datasets: list[str], methods: list[str], path: Path) -> None:
    """Test RMSE against epochs, mean ± one standard error over splits (Khan et al. 2018, Fig. 4)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(datasets))
    rows = math.ceil(len(datasets) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows), squeeze=False)
    for ax, d in zip(axes.flat, datasets, strict=False):
        for m in methods:
            prefix = f"{d}/{m}/"
            curves = [
                v["curve"] for k, v in results["runs"].items() if k.startswith(prefix) and v.get("curve")
            ]
            if not curves:
                continue
            c = np.array(curves)
            mean, se = c.mean(0), c.std(0, ddof=1) / math.sqrt(len(c)) if len(c) > 1 else np.zeros(c.shape[1])
            epochs = np.arange(1, c.shape[1] + 1)
            (line,) = ax.plot(epochs, mean, lw=1.3, label=METHODS[m].label)
            ax.fill_between(epochs, mean - se, mean + se, color=line.get_color(), alpha=0.2, lw=0)
        ax.set_title(d, fontsize=9)
        ax.set_xlabel("epoch", fontsize=8)
        ax.set_ylabel("test RMSE", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(datasets) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)) or 1, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
