"""Report helpers: mean ± standard error, tables beside published numbers, and figures.

Small-sample honesty: with one value there is no standard error, so :func:`fmt_mean_se` prints none and
:func:`verdict` gives no verdict; bold marks (see :data:`BOLD_LEGEND`) need at least two paired values.

A metric that is NaN or infinite (a fit that blew up, or a hand-edited file) is a diverged fit: it enters no
mean (:func:`per_split`), is listed by :func:`diverged_note`, and is never bold (:func:`bold_set`). The
runner already hands each report only its own command's jobs, with such fits marked (``Run.own``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

P_VALUE = 0.01
BOLD_LEGEND = (
    "Bold: the best mean of our methods in that row, and every one of our methods that a paired t-test over "
    f"the splits cannot tell from it at p = {P_VALUE} (needs at least 2 splits)."
)


def _finite(x: Any) -> bool:
    return type(x) in (int, float) and math.isfinite(x)


def _diverged(result: dict[str, Any], metrics: Sequence[str]) -> bool:
    """A fit that diverged: so marked, or with one of ``metrics`` NaN or infinite."""
    return "diverged" in result or any(m in result and not _finite(result[m]) for m in metrics)


def diverged_note(
    runs: dict[str, Any],
    datasets: list[str],
    methods: list[str],
    label: Callable[[str], str],
    left_out: str,
    metrics: Sequence[str] = (),
) -> str:
    """A note listing the fits (keys ``dataset/method/split``) that diverged (non-finite gradients, or a
    metric among ``metrics`` that is NaN or infinite), which the table leaves out (``left_out`` says how);
    empty when none did."""
    counts: Counter[str] = Counter()
    for k, v in runs.items():
        dataset, method, _ = k.split("/")
        if _diverged(v, metrics) and dataset in datasets and method in methods:
            counts[f"{label(method)} on {dataset}"] += 1
    if not counts:
        return ""
    listed = ", ".join(f"{k}: {n}" for k, n in sorted(counts.items()))
    return f"\nDiverged fits (non-finite gradients or metrics; {left_out}): {listed}.\n"


def per_split(results: dict[str, Any], dataset: str, method: str, key: str) -> dict[int, float]:
    """``key`` of each fit ``dataset/method/<split>`` that did not diverge (and whose ``key`` is finite), by
    split."""
    prefix = f"{dataset}/{method}/"
    return {
        int(k[len(prefix) :]): v[key]
        for k, v in results["runs"].items()
        if k.startswith(prefix) and "diverged" not in v and _finite(v.get(key))
    }


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def mean_se(values: Iterable[float]) -> tuple[float, float, int]:
    """Mean, standard error (NaN for fewer than 2 values) and count."""
    v = np.asarray(list(values), dtype=float)
    se = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")
    return float(v.mean()) if len(v) else float("nan"), se, len(v)


def fmt_mean_se(mean: float, se: float) -> str:
    """Enough decimals to show the standard error to two significant digits (2 to 5); no ``± nan``."""
    if not math.isfinite(mean):
        return str(mean)
    if not math.isfinite(se):
        return f"{mean:.3f} (no s.e.)"
    digits = 2 if se <= 0 else min(5, max(2, 1 - math.floor(math.log10(se))))
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def indistinguishable(a: dict[Any, float], b: dict[Any, float]) -> bool:
    """True if a paired t-test over the keys the two share cannot tell a from b at :data:`P_VALUE`
    (False with fewer than 2 shared keys: no test, no claim)."""
    from scipy import stats

    common = sorted(set(a) & set(b))
    if len(common) < 2:
        return False
    diff = np.array([a[k] - b[k] for k in common])
    if np.allclose(diff, 0.0):
        return True
    if diff.std() <= 1e-12 * abs(diff.mean()):  # a constant non-zero difference is as significant as it gets
        return False
    return bool(stats.ttest_rel(diff, np.zeros_like(diff)).pvalue > P_VALUE)


def bold_set(values: dict[str, dict[Any, float]], sign: int) -> set[str]:
    """The best of ``values`` (method → per-split values; ``sign`` +1 if higher is better) and every
    method indistinguishable from it. Nothing is bold without at least two splits, and nothing with a value
    that is NaN or infinite."""
    values = {m: v for m, v in values.items() if len(v) >= 2 and all(map(_finite, v.values()))}
    if not values:
        return set()
    best = max(values, key=lambda m: sign * mean_se(values[m].values())[0])
    return {best} | {m for m, v in values.items() if indistinguishable(v, values[best])}


def verdict(diff: float, sign: int, se: float, published_se: float, rounding: float = 0.0) -> tuple[str, str]:
    """(z, verdict) of ours − published: "better"/"worse" where |z| > 2, "same within noise" otherwise,
    and no verdict where ours has no standard error (a single split)."""
    if not math.isfinite(se):
        return "—", "no verdict (1 split: no standard error)"
    scale = math.sqrt(se**2 + published_se**2 + rounding**2)
    z = diff / scale if scale > 0 else math.copysign(math.inf, diff)
    if abs(z) <= 2:
        return f"{z:+.1f}", "same within noise"
    return f"{z:+.1f}", "**better**" if sign * diff > 0 else "**worse**"


def figure(panels: int, *, cols: int = 4, size: tuple[float, float] = (3.6, 2.9)) -> tuple[Any, list[Any]]:
    """A figure with ``panels`` axes on a grid (the unused ones hidden); matplotlib's Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = max(1, min(cols, panels))
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(size[0] * cols, size[1] * rows), squeeze=False)
    for ax in list(axes.flat)[panels:]:
        ax.axis("off")
    return fig, list(axes.flat)[:panels]


def save_figure(fig: Any, path: Path, *, legend_from: Any = None, dpi: int = 110) -> None:
    """Save with a shared legend below the panels (from the axes ``legend_from``) and close the figure."""
    import matplotlib.pyplot as plt

    bottom = 0.0
    if legend_from is not None:
        handles, labels = legend_from.get_legend_handles_labels()
        if labels:
            fig.legend(
                handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8, frameon=False
            )
            bottom = 0.06 if len(labels) <= 6 else 0.1
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
