"""``table.md`` and ``curves.png`` from ``results.json``: our rows beside the papers' rows.

Each cell is mean ± standard error over splits. Among our methods, per data set, the best mean is bold, and so
is every method that a paired t-test over the splits cannot tell from it at p = 0.01 (the rule of Khan et al.
2018, Table 1). Published rows carry no per-split values, so ours are compared with them by a two-sample
z-score on the standard errors, listed under "Comparison with the papers".
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..core.report import (
    BOLD_LEGEND,
    bold_set,
    diverged_note,
    figure,
    fmt_mean_se,
    markdown_table,
    mean_se,
    save_figure,
    verdict,
)
from ..core.report import per_split as _per_split  # the name tests/experiments/test_uci.py imports
from .methods import METHODS
from .published import DECIMALS, SOURCES, published

METRICS = {"rmse": ("Test RMSE", -1), "loglik": ("Test log-likelihood", +1)}  # sign: +1 higher is better
SHORT = {"khan2018": "K18", "zhang2018": "Z18"}


def diverged(results: dict[str, Any], datasets: list[str], methods: list[str]) -> str:
    """A note listing the fits that diverged (non-finite gradients), which the table leaves out."""
    left_out = "left out of the means, and the cell shows how many splits it averages"
    return diverged_note(results["runs"], datasets, methods, lambda m: METHODS[m].label, left_out, METRICS)


def _tau_on_edge(results: dict[str, Any], dataset: str, method: str) -> bool:
    from .tuning import tau_at_bound

    hp = results.get("hparams", {}).get(f"{dataset}/{method}")
    return bool(hp) and hp.get("source") == "bo" and tau_at_bound(dataset, hp) is not None


def build_table(results: dict[str, Any], datasets: list[str], methods: list[str], header: str) -> str:
    sections = [header]
    for metric, (title, _) in METRICS.items():
        columns = ["Dataset"]
        for m in methods:
            columns.append(f"{METHODS[m].label} (ours)")
            columns += [f"{row} [{SHORT[src]}]" for src, row in METHODS[m].published.items()]
        rows = []
        for d in datasets:
            per_method = {m: _per_split(results, d, m, metric) for m in methods}
            bold = bold_set(per_method, METRICS[metric][1])
            row = [d]
            for m in methods:
                values = per_method[m]
                if values:
                    mean, se, n = mean_se(values.values())
                    cell = fmt_mean_se(mean, se) + (
                        "" if n >= 20 or n < 2 or d == "protein-tertiary-structure" else f" ({n})"
                    )
                    cell = f"**{cell}**" if m in bold else cell
                    row.append(cell + (" †" if metric == "loglik" and _tau_on_edge(results, d, m) else ""))
                else:
                    row.append("—")
                for src, name in METHODS[m].published.items():
                    pub = published(src, name, metric, d)
                    row.append(f"{pub[0]:.{DECIMALS[src]}f} ± {pub[1]:.{DECIMALS[src]}f}" if pub else "—")
            rows.append(row)
        sections.append(f"## {title}\n\n" + markdown_table(columns, rows))
    sections.append(
        BOLD_LEGEND + " (n): the mean of n splits where not all ran; no s.e.: a single split. †: τ was tuned "
        "onto an edge of its BO box (the τ column above): its log-likelihood is set or limited by the bound, "
        "not by the fit.\n"
    )
    sections.append(diverged(results, datasets, methods))
    sections.append(comparison(results, datasets, methods))
    return "\n".join(sections)


def comparison(results: dict[str, Any], datasets: list[str], methods: list[str]) -> str:
    lines = [
        "## Comparison with the papers\n",
        "Difference ours − published, and its z-score on the two standard errors and the published "
        "rounding (|z| > 2 flagged; no verdict where ours has a single split, hence no standard error).\n",
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
                    mean, se, _ = mean_se(values.values())
                    diff = mean - pub[0]
                    # the papers round to DECIMALS places: a uniform error of ±half a unit (sd half/√3)
                    rounding = 0.5 * 10.0 ** -DECIMALS[src] / math.sqrt(3.0)
                    z, flag = verdict(diff, sign, se, pub[1], rounding)
                    rel = f"{100 * abs(diff) / abs(pub[0]):.0f}%" if pub[0] else "—"
                    rows.append(
                        [
                            METHODS[m].label,
                            f"{name} [{SHORT[src]}]",
                            d,
                            title,
                            f"{diff:+.3g}",
                            rel,
                            z,
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
    fig, axes = figure(len(datasets))
    for ax, d in zip(axes, datasets, strict=True):
        for m in methods:
            prefix = f"{d}/{m}/"
            curves = [
                v["curve"]
                for k, v in results["runs"].items()
                if k.startswith(prefix) and v.get("curve") and "diverged" not in v
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
    save_figure(fig, path, legend_from=axes[0])
