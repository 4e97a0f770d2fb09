"""``ngvi rl``'s table (final, area under the test curve, paired against a baseline) and figure (test
return against steps: median and range over seeds)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.report import figure, fmt_mean_se, markdown_table, mean_se, save_figure
from .variants import TABLE3, VARIANTS

COLORS = {
    "vadagrad": "tab:green", "vadam": "tab:blue", "sgd_plain": "tab:gray", "adam_plain": "tab:orange",
    "sgd_explore": "tab:olive", "adam_explore": "tab:red", "adam_action": "tab:purple",
}  # fmt: skip
ADAM_FAMILY = ("vadam", "adam_plain", "adam_explore")  # Fig. 5
Done = dict[str, list[dict[str, Any]]]  # variant → one result per seed, in seed order


def area(result: dict[str, Any]) -> float:
    """The area under the test-return curve from step 0 (the untrained actor) to the last test, by the
    trapezoid rule, divided by the steps: the curve's mean height, in units of return. It rewards learning
    early, which the final test does not see."""
    steps = np.asarray(result["step"], dtype=float)
    return float(np.trapezoid(result["test_return"], steps) / (steps[-1] - steps[0]))


def paired(done: Done, name: str, baseline: str) -> tuple[float, float, int, float]:
    """Area of ``name`` minus that of ``baseline``, seed by seed (same initial networks, same test episodes):
    (mean, s.e., seeds where ``name`` is higher, two-sided paired t-test p; NaN below 2 seeds)."""
    from scipy import stats

    diff = np.array([area(r) - area(b) for r, b in zip(done[name], done[baseline], strict=True)])
    mean, se, n = mean_se(diff)
    p = (
        float(stats.ttest_rel(diff, np.zeros_like(diff)).pvalue)
        if n > 1 and np.ptp(diff) > 0
        else float("nan")
    )
    return mean, se, int((diff > 0).sum()), p


def table(done: Done, config: dict[str, Any], baseline: str | None = None) -> str:
    seeds = len(next(iter(done.values())))
    rows = []
    for name, results in done.items():
        final = mean_se(r["test_return"][-1] for r in results)
        auc = mean_se(area(r) for r in results)
        best = mean_se(max(r["test_return"][1:]) for r in results)
        std = [r["median_search_std"][-1] for r in results]
        row = [VARIANTS[name].label, fmt_mean_se(*final[:2]), fmt_mean_se(*auc[:2]), fmt_mean_se(*best[:2])]
        if baseline is not None:
            if name == baseline:
                row.append("—")
            else:
                mean, se, wins, p = paired(done, name, baseline)
                row.append(f"{fmt_mean_se(mean, se)} ({wins}/{seeds} seeds higher, p = {p:.2g})")
        row += [
            "—" if std[0] is None else f"{np.mean(std):.2g}",
            f"{np.mean([r['seconds'] for r in results]):.0f}",
        ]
        rows.append(row)
    head = (
        f"# ngvi rl: DDPG on {config['env']}, {config['steps']:,} steps, actor sampled at every step "
        "(Khan et al. 2018, App. K)\n\n"
        f"Test return: mean over {config['test_episodes']} episode(s) acting with μ, every "
        f"{config['eval_every']:,} steps; mean ± s.e. over {seeds} seed(s). Area: the area under the test "
        "curve from step 0, divided by the steps (the curve's mean height). The paper gives its curves "
        "(Figs. 5–6) only as plots.\n\n"
    )
    header = ["variant", "final test return", "area under the test curve / steps", "best test"]
    if baseline is not None:
        label = VARIANTS[baseline].label
        header.append(f"area − {label}'s, paired by seed (two-sided paired t-test)")
    header += ["median σ at the end", "train time [s]"]
    return head + markdown_table(header, rows)


def plot(done: Done, path: Path, config: dict[str, Any]) -> None:
    """Test return against steps, the median over seeds with their range shaded: the Adam family (Fig. 5)
    in a panel of its own where the run also has two or more others (Fig. 6), else all in one."""
    adam = [v for v in ADAM_FAMILY if v in done]
    others = [v for v in done if v not in ADAM_FAMILY]
    panels = (
        [("Vadam, Adam-Plain, Adam-Explore (cf. Fig. 5)", adam)] if len(adam) > 1 and len(others) > 1 else []
    )
    title = "all six variants (cf. Fig. 6)" if set(done) == set(TABLE3) else "variants run (cf. Fig. 6)"
    panels.append((title, list(done)))
    fig, axes = figure(len(panels), cols=2, size=(5.2, 3.6))
    for ax, (title, names) in zip(axes, panels, strict=True):
        for name in names:
            results = done[name]
            steps = np.array(results[0]["step"])
            returns = np.array([r["test_return"] for r in results])
            ax.plot(steps, np.median(returns, 0), color=COLORS[name], lw=1.6, label=VARIANTS[name].label)
            if len(results) > 1:
                ax.fill_between(steps, returns.min(0), returns.max(0), color=COLORS[name], alpha=0.15, lw=0)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("environment steps", fontsize=8)
        ax.set_ylabel(f"test return ({config['test_episodes']} ep., μ)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
        ax.legend(fontsize=7, loc="best")
    seeds = len(next(iter(done.values())))
    spread = f"median (line) and range (shaded) over {seeds} seeds" if seeds > 1 else "one seed"
    fig.suptitle(f"DDPG on {config['env']}: {spread}", fontsize=10)
    save_figure(fig, path, dpi=120)


def plot_paired(
    done: Done, path: Path, config: dict[str, Any], baseline: str, looks: Sequence[int] = ()
) -> None:
    """The paired evidence every variant-minus-``baseline`` verdict rests on, one row per variant: left,
    each seed's area difference (dots, in seed order) with the running mean and its 95% t-interval as seeds
    are added, the ``looks`` (seed counts at which the test was read before the last) marked with their
    naive p; right, the mean paired difference of the test return at each test with its 95% interval."""
    from scipy import stats

    names = [v for v in done if v != baseline]
    fig, axes = figure(2 * len(names), cols=2, size=(5.2, 3.4))
    base = VARIANTS[baseline].label
    for row, name in enumerate(names):
        left, right = axes[2 * row], axes[2 * row + 1]
        diff = np.array([area(r) - area(b) for r, b in zip(done[name], done[baseline], strict=True)])
        n = np.arange(1, len(diff) + 1)
        cum = np.cumsum(diff) / n
        sd = np.array([np.std(diff[:k], ddof=1) if k > 1 else np.nan for k in n])
        half = np.array([stats.t.ppf(0.975, k - 1) if k > 1 else np.nan for k in n]) * sd / np.sqrt(n)
        stage = np.searchsorted(np.asarray(looks, dtype=int), np.arange(len(diff)), side="right")
        for s in np.unique(stage):
            lo = 0 if s == 0 else looks[s - 1]
            hi = looks[s] if s < len(looks) else len(diff)
            left.scatter(n[stage == s], diff[stage == s], s=14, color=f"C{s}", zorder=3,
                         label=f"seeds {lo}–{hi - 1}")  # fmt: skip
        left.plot(n, cum, color="black", lw=1.4, label="running mean")
        left.fill_between(
            n, cum - half, cum + half, color="black", alpha=0.12, lw=0, label="its 95% interval"
        )
        left.axhline(0.0, color="gray", lw=0.8)
        for k in [*looks, len(diff)]:
            p = float(stats.ttest_1samp(diff[:k], 0.0).pvalue)
            left.axvline(k, color="gray", ls="--", lw=0.8)
            left.annotate(
                f"n = {k}\nnaive p = {p:.2g}", (k, 1.0), xycoords=("data", "axes fraction"), xytext=(-3, -3),
                textcoords="offset points", ha="right", va="top", fontsize=7,
            )  # fmt: skip
        left.set_title(f"{VARIANTS[name].label} − {base}: area / steps, paired by seed", fontsize=9)
        span = float(np.ptp(diff)) or 1.0  # room below the dots for the legend; the early intervals clipped
        left.set_ylim(float(diff.min()) - 0.55 * span, float(diff.max()) + 0.3 * span)
        left.set_xlabel("seeds n in the test (dot n: seed n − 1)", fontsize=8)
        left.set_ylabel("difference in area / steps", fontsize=8)
        left.legend(fontsize=6.5, loc="lower center", ncol=3)
        steps = np.array(done[name][0]["step"])
        per_test = np.array(
            [
                np.subtract(r["test_return"], b["test_return"])
                for r, b in zip(done[name], done[baseline], strict=True)
            ]
        )
        mean = per_test.mean(0)
        se = per_test.std(0, ddof=1) / np.sqrt(len(per_test))
        t = stats.t.ppf(0.975, len(per_test) - 1)
        right.plot(steps, mean, color=COLORS[name], lw=1.6, label="mean over seeds")
        right.fill_between(steps, mean - t * se, mean + t * se, color=COLORS[name], alpha=0.2, lw=0,
                           label="95% interval")  # fmt: skip
        right.axhline(0.0, color="gray", lw=0.8)
        right.set_title(f"{VARIANTS[name].label} − {base}: test return at each test", fontsize=9)
        right.set_xlabel("environment steps", fontsize=8)
        right.set_ylabel("difference in test return", fontsize=8)
        right.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
        right.legend(fontsize=7, loc="best")
        for ax in (left, right):
            ax.tick_params(labelsize=7)
    fig.suptitle(f"DDPG on {config['env']}: {len(done[baseline])} paired seeds", fontsize=10)
    save_figure(fig, path, dpi=120)


def main(argv: Sequence[str] | None = None) -> None:
    """Redraw the paired figure of a results folder from its results.json alone (no run, no environment):
    ``python -m ngvi.experiments.rl.report FOLDER --variants a,b --baseline a --seeds N [--looks 4,14]``."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m ngvi.experiments.rl.report", description=main.__doc__)
    parser.add_argument("folder", type=Path, help="a results folder of `ngvi rl` (its results.json is read)")
    parser.add_argument("--variants", required=True, help="comma-separated, the baseline among them")
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--seeds", type=int, required=True, help="seeds 0 .. N-1, paired")
    parser.add_argument("--looks", default="", help="seed counts at which the test was read before N")
    parser.add_argument("--out", default="paired.png", help="file name inside FOLDER (default paired.png)")
    args = parser.parse_args(argv)
    results = json.loads((args.folder / "results.json").read_text(encoding="utf-8"))
    variants = args.variants.split(",")
    if args.baseline not in variants:
        parser.error(f"--baseline {args.baseline} is not among --variants {args.variants}: add it")
    try:
        done = {v: [results["runs"][f"{v}/seed{s}"] for s in range(args.seeds)] for v in variants}
    except KeyError as missing:
        parser.error(f"{args.folder}/results.json has no run {missing}: run those seeds first")
    looks = [int(k) for k in args.looks.split(",") if k]
    config = {"env": "the task", **results.get("config", {})}
    plot_paired(done, args.folder / args.out, config, args.baseline, looks)
    print(f"wrote {args.folder / args.out}")


if __name__ == "__main__":
    main()
