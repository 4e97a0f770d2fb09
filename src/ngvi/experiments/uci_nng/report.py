"""``table.md`` and ``rmse.png`` of ``ngvi uci-nng``: our rows beside NNG's Table 1 (Zhang et al. 2018).

Cells are mean ± standard error over the splits that ran (their number in brackets where it is not all of
them). Bold marks our best method per row and those a paired t-test cannot tell from it (p = 0.01). The
check the issue asks for is listed separately: noisy K-FAC against NNG-MVG's published row, "within or
better" meaning RMSE ≤ published + 2 s.e. (log-likelihood ≥ published − 2 s.e.), with the paper's s.e.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..core import report as shared
from ..core.report import BOLD_LEGEND, bold_set, figure, fmt_mean_se, markdown_table, mean_se, save_figure
from ..uci.published import ZHANG2018
from .methods import METHODS

METRICS = {"rmse": ("Test RMSE", -1), "loglik": ("Test log-likelihood", +1)}
#: every column of NNG's Table 1, in its order (PBP has no counterpart among our methods but is shown: it
#: holds some of the best published cells, e.g. yacht's log-likelihood and wine's RMSE)
PUBLISHED = ("BBB", "PBP", "NNG-FFG", "NNG-MVG")
#: our methods' marker colours: matplotlib's cycle without C6–C9, which the published rows' lines use
MARKERS = ("C0", "C1", "C2", "C3", "C4", "C5", "black", "navy")


def _published(row: str | None, metric: str, dataset: str) -> tuple[float, float] | None:
    return None if row is None else ZHANG2018[metric].get(row, {}).get(dataset)


def _fmt_published(pub: tuple[float, float] | None) -> str:
    return f"{pub[0]:.3f} ± {pub[1]:.3f}" if pub else "—"


def _settings(results: dict[str, Any], datasets: list[str], method: str) -> str:
    """The settings the method's fits ran with, grouped: 'epochs × batch, particles: sets (splits)'."""
    groups: dict[str, list[str]] = {}
    for d in datasets:
        runs = [v for k, v in results["runs"].items() if k.startswith(f"{d}/{method}/")]
        if not runs:
            continue
        s = runs[0].get("settings", {})
        label = f"{s.get('epochs')} epochs × batch {s.get('batch_size')}, {s.get('train_samples')} particles"
        if s.get("damping"):
            label += f", damping γ_ex = {s['damping']:g}"
        groups.setdefault(label, []).append(f"{d} ({len(runs)})")
    return "; ".join(f"{label}: {', '.join(sets)}" for label, sets in groups.items()) or "—"


def table(results: dict[str, Any], datasets: list[str], methods: list[str], command: str) -> str:
    minutes = {
        m: sum(v.get("seconds", 0.0) for k, v in results["runs"].items() if k.split("/")[1] == m) / 60
        for m in methods
    }
    lines = [
        "# UCI regression under NNG's protocol (Zhang et al. 2018, §5.1, Table 1)\n",
        (f"Command: `ngvi {command}`  \n" if command else "")
        + "Published rows: Z18 = Zhang et al. 2018, Table 1 (their splits are Hernández-Lobato & Adams'; "
        "ours are Gal & Ghahramani's 20 (protein: 5), drawn the same way). Fitting time, summed over each "
        "method's fits on one core: "
        + ", ".join(f"{METHODS[m].label} {minutes[m]:.0f} min" for m in methods)
        + ".\n",
        markdown_table(
            ["method", "settings: epochs × batch, particles: data set (splits run)"],
            [[METHODS[m].label, _settings(results, datasets, m)] for m in methods],
        ),
    ]
    for metric, (title, sign) in METRICS.items():
        ours = [f"{METHODS[m].label} (ours)" for m in methods]
        columns = ["Dataset", *ours, *[f"{r} [Z18]" for r in PUBLISHED]]
        rows = []
        for d in datasets:
            per_method = {m: shared.per_split(results, d, m, metric) for m in methods}
            bold = bold_set(per_method, sign)
            row = [d]
            for m in methods:
                values = per_method[m]
                if values:
                    mean, se, n = mean_se(values.values())
                    cell = fmt_mean_se(mean, se) + f" ({n})"
                    row.append(f"**{cell}**" if m in bold else cell)
                else:
                    row.append("—")
            pubs = {r: _published(r, metric, d) for r in PUBLISHED}
            best = max((sign * p[0] for p in pubs.values() if p), default=None)
            row += [
                f"_{_fmt_published(p)}_" if p and sign * p[0] == best else _fmt_published(p)
                for p in pubs.values()
            ]
            rows.append(row)
        lines.append(f"## {title}\n\n" + markdown_table(columns, rows))
    lines.append(
        BOLD_LEGEND + " (n): the number of splits the mean is over. [Z18]: every column of NNG's Table 1 "
        "(20 splits, protein 5); our methods' counterparts: noisy K-FAC ↔ NNG-MVG, noisy Adam and VOGN ↔ "
        "NNG-FFG, BBVI ↔ BBB; PBP (Hernández-Lobato & Adams 2015) has none. Italic: the best published mean "
        "of the row (ties all italic; naval's RMSE is 0.000 at the paper's 3 decimals).\n"
    )
    lines.append(_check(results, datasets, methods))
    lines.append(_noise(results, datasets, methods))
    lines.append(
        shared.diverged_note(
            results["runs"], datasets, methods, lambda m: METHODS[m].label, "left out of the means", METRICS
        )
    )
    return "\n".join(lines)


def _check(results: dict[str, Any], datasets: list[str], methods: list[str]) -> str:
    """Noisy K-FAC against NNG-MVG: within the paper's ±2 s.e., or better."""
    if "noisy_kfac" not in methods:
        return ""
    rows, passed, total = [], 0, 0
    for d in datasets:
        for metric, (title, sign) in METRICS.items():
            pub = _published("NNG-MVG", metric, d)
            values = shared.per_split(results, d, "noisy_kfac", metric)
            if pub is None or not values:
                continue
            mean, se, n = mean_se(values.values())
            bound = pub[0] - sign * 2 * pub[1]  # RMSE: published + 2 s.e.; log-likelihood: − 2 s.e.
            ok = sign * (mean - bound) >= 0
            # the repository's one rule (docs/FINDINGS.md): "better" only for |z| > 2
            better = sign * (mean - pub[0]) > 2 * math.hypot(se, pub[1])
            total += 1
            passed += ok
            rows.append(
                [d, title, fmt_mean_se(mean, se) + f" ({n})", f"{pub[0]:.3f} ± {pub[1]:.3f}", f"{bound:.3f}",
                 ("better" if better else "within ±2 s.e.") if ok else "**outside**"]
            )  # fmt: skip
    return (
        "## Noisy K-FAC against NNG-MVG (Z18)\n\n"
        f"Within the paper's ±2 s.e. of NNG-MVG, or better: {passed} of {total} (data set, metric) pairs.\n\n"
        + markdown_table(["data set", "metric", "ours", "NNG-MVG [Z18]", "bound", "verdict"], rows)
    )


def _noise(results: dict[str, Any], datasets: list[str], methods: list[str]) -> str:
    rows = []
    for d in datasets:
        row = [d]
        for m in methods:
            values = shared.per_split(results, d, m, "noise_std")
            row.append(fmt_mean_se(*mean_se(values.values())[:2]) if values else "—")
        rows.append(row)
    return (
        "## Learned observation noise\n\nE_q[τ]^(−1/2) in the targets' units (q(τ) = Gamma(a, b), prior "
        "Gamma(6, 6) on standardised targets), mean ± s.e. over splits.\n\n"
        + markdown_table(["Dataset", *[METHODS[m].label for m in methods]], rows)
    )


def plot(results: dict[str, Any], datasets: list[str], methods: list[str], path: Path) -> None:
    """Test RMSE per data set: ours (mean ± s.e., one marker per method) and NNG's published rows (lines)."""
    fig, axes = figure(len(datasets), cols=5, size=(3.0, 2.6))
    published_rows = PUBLISHED
    colours = dict(zip(PUBLISHED, ("tab:gray", "tab:olive", "tab:cyan", "tab:pink"), strict=True))
    for ax, d in zip(axes, datasets, strict=True):
        for i, m in enumerate(methods):
            values = shared.per_split(results, d, m, "rmse")
            if not values:
                continue
            mean, se, _ = mean_se(values.values())
            ax.errorbar(
                [i],
                [mean],
                yerr=[se if se == se else 0.0],
                fmt="o",
                color=MARKERS[i % len(MARKERS)],
                label=METHODS[m].label,
            )
        for row in published_rows:
            pub = _published(row, "rmse", d)
            if pub:
                ax.axhline(pub[0], color=colours[row], ls="--", lw=1, label=f"{row} [Z18]")
                ax.axhspan(pub[0] - 2 * pub[1], pub[0] + 2 * pub[1], color=colours[row], alpha=0.12)
        ax.set_title(d, fontsize=9)
        ax.set_xticks([])
        ax.set_ylabel("test RMSE", fontsize=8)
        ax.tick_params(labelsize=7)
    # the legend from the panel with the most entries: a method that ran on some sets only still gets one
    legend_from = max(axes[: len(datasets)], key=lambda ax: len(ax.get_legend_handles_labels()[1]))
    save_figure(fig, path, legend_from=legend_from)
