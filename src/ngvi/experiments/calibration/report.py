"""``ngvi calibration``'s report: ``table.md`` (a summary of the criteria met, then one table per problem) and
two figures, ``calibration.png`` (each criterion's metric per method and problem, met in green, missed in
red) and ``spread.png`` (the predictive s.d. against the distance from the data)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.methods import METHODS
from ..core.report import figure, fmt_mean_se, markdown_table, mean_se, save_figure
from ..core.runner import Run
from . import measure
from .problems import FAR, PROBLEMS, SCALES

REFERENCE = "deep_ensemble"
FAR_KEY = f"x{FAR:g}"
MET, MISSED = "✓", "✗"


def label(method: str) -> str:
    return {"noisy_adam": "Noisy Adam (Alg. 1)", "badam": "BAdam (linearised)"}.get(
        method, METHODS[method].label
    )


def cell(runs: dict[str, Any], problem: str, method: str, seeds: int) -> dict[str, Any] | None:
    """One (problem, method): its finished and diverged seeds, and the seeds' means (paired with the
    ensemble's and MAP's seeds for the differences and the cost); None when no seed has run."""
    results = {s: runs.get(f"{problem}/{method}/seed{s}") for s in range(seeds)}
    results = {s: r for s, r in results.items() if r is not None}
    if not results:
        return None
    done = {s: r for s, r in results.items() if "diverged" not in r}
    diverged = {s: r["diverged"] for s, r in results.items() if "diverged" in r}
    out: dict[str, Any] = {"seeds": len(results), "done": done, "diverged": diverged}
    ensemble = {s: runs.get(f"{problem}/{REFERENCE}/seed{s}") for s in done}
    maps = {s: runs.get(f"{problem}/map/seed{s}") for s in results}
    keys = ("nll", "coverage95", "ece", "rmse", "accuracy")
    for key in keys:
        values = [r[key] for r in done.values() if key in r]
        if values:
            out[key] = mean_se(values)
    paired = [s for s in done if ensemble[s] is not None and "diverged" not in ensemble[s]]
    if paired:
        out["delta_nll"] = mean_se([done[s]["nll"] - ensemble[s]["nll"] for s in paired])
        out["ensemble"] = {
            k: float(np.mean([ensemble[s][k] for s in paired]))
            for k in ("nll", "ece")
            if k in ensemble[paired[0]]
        }
        out["paired"] = {k: float(np.mean([done[s][k] for s in paired])) for k in ("nll", "coverage95", "ece")
                         if k in done[paired[0]]}  # fmt: skip
    ratios = [measure.far_near(r["sd"], FAR_KEY) for r in done.values()]
    if ratios and all(v is not None for v in ratios):
        out["far_near"] = mean_se(ratios)
        if all("gap" in r["sd"] for r in done.values()):
            out["gap_near"] = mean_se([r["sd"]["gap"] / r["sd"]["x1"] for r in done.values()])
    out["sd"] = {
        k: float(np.mean([r["sd"][k] for r in done.values()]))
        for k in next(iter(done.values()), {"sd": {}})["sd"]
    }
    costs = [r["train_seconds"] / maps[s]["train_seconds"] for s, r in done.items()
             if maps[s] is not None and maps[s]["train_seconds"] > 0]  # fmt: skip
    if costs:
        out["cost"] = float(np.mean(costs))
    return out


def verdicts(task: str, c: dict[str, Any]) -> dict[str, bool | None] | None:
    """The criteria of a cell (None: no seed finished, or no ensemble to compare with). A cell with a diverged
    seed misses them all: the defaults did not train."""
    if "paired" not in c:
        return None
    if c["diverged"]:
        return {"nll": False, "calibration": False, "growing": False}
    cell_means = {**c["paired"], "far_near": c["far_near"][0] if "far_near" in c else None}
    return measure.criteria(task, cell_means, c["ensemble"])


def _mark(v: bool | None) -> str:
    return "–" if v is None else MET if v else MISSED


def summary_cell(task: str, method: str, c: dict[str, Any] | None) -> str:
    if c is None:
        return "n/a"
    if c["diverged"] and not c["done"]:
        return f"diverged ({len(c['diverged'])}/{c['seeds']})"
    if method == REFERENCE:
        return "reference"
    v = verdicts(task, c)
    if v is None:
        return "–"
    calib = "cov" if task == "regression" else "ECE"
    text = f"NLL {_mark(v['nll'])} {calib} {_mark(v['calibration'])} s.d. {_mark(v['growing'])}"
    return text + (f" (diverged {len(c['diverged'])}/{c['seeds']})" if c["diverged"] else "")


def _fmt(value: tuple[float, float, int] | None, digits: str = ".3f", signed: bool = False) -> str:
    if value is None:
        return "–"
    mean, se, n = value
    if not math.isfinite(mean):
        return str(mean)
    sign = "+" if signed and mean >= 0 else ""
    if abs(mean) >= 1e4:
        return f"{sign}{mean:.3g}"
    return sign + (fmt_mean_se(mean, se) if n > 1 else format(mean, digits))


def problem_table(problem: str, methods: list[str], cells: dict[str, Any]) -> str:
    p = PROBLEMS[problem]
    regression = p.task == "regression"
    header = ["method", "test NLL", "NLL − ensemble's", "95% coverage" if regression else "ECE",
              "RMSE" if regression else "accuracy", f"s.d. far/near (c = {FAR:g})"]  # fmt: skip
    if any(c is not None and "gap_near" in c for c in cells.values()):
        header.append("s.d. gap/near")
    header += ["train cost × MAP", "criteria"]
    rows = []
    for m in methods:
        c = cells.get(m)
        if c is None:
            continue
        if not c["done"]:
            first = next(iter(c["diverged"].values())).split(":")[0]  # results.json has the whole message
            why = f"diverged in {len(c['diverged'])}/{c['seeds']} seeds ({first})"
            rows.append([label(m), *["–"] * (len(header) - 2), why])
            continue
        row = [
            label(m),
            _fmt(c.get("nll")),
            "0 (itself)" if m == REFERENCE else _fmt(c.get("delta_nll"), ".3f", signed=True),
            _fmt(c.get("coverage95" if regression else "ece")),
            _fmt(c.get("rmse" if regression else "accuracy")),
            "– (one network)" if m == "map" else _fmt(c.get("far_near"), ".2f"),
        ]
        if "s.d. gap/near" in header:
            row.append("–" if m == "map" else _fmt(c.get("gap_near"), ".2f"))
        row += [f"{c['cost']:.1f}" if "cost" in c else "–", summary_cell(p.task, m, c)]
        rows.append(row)
    return f"## {problem}: {p.description}\n\n" + markdown_table(header, rows)


def report(run: Run, problems: list[str], methods: list[str], seeds: int, config: dict[str, Any]) -> None:
    runs = run.results["runs"]
    cells = {p: {m: cell(runs, p, m, seeds) for m in methods} for p in problems}
    low, high = measure.COVERAGE_BAND
    head = (
        "# ngvi calibration: every posterior rule with its defaults against a 5-member deep ensemble\n\n"
        f"{config['steps']:,} steps of minibatches of {config['batch_size']}, the predictive from "
        f"{config['samples']} draws (the ensemble: its {config['members']} members; MAP: its one network; "
        f"BAdam: linearised), {seeds} seed(s) per cell; means ± s.e. over the seeds. Criteria (issue 32), on "
        f"the means: NLL at most {measure.NLL_MARGIN} nats above the ensemble's; 95% coverage in "
        f"[{low}, {high}] (regression); ECE at most the ensemble's + {measure.ECE_MARGIN} (classification); "
        f"s.d. growing: the mean s.d. of the network's output across draws (f for regression, the class "
        f"probabilities for classification) on the test inputs moved {FAR:g}× as far from the training mean "
        "over that on the test inputs, > 1. A cell with a diverged seed misses every criterion. "
        "Train cost: CPU seconds of training (one thread) over MAP's on the same draw; the ensemble trains 5 "
        "networks.\n\n"
    )
    summary_rows = []
    for m in methods:
        costs = [cells[p][m]["cost"] for p in problems if cells[p][m] is not None and "cost" in cells[p][m]]
        cost = f"{np.mean(costs):.1f}" if costs else "–"
        summary_rows.append(
            [label(m), cost, *(summary_cell(PROBLEMS[p].task, m, cells[p][m]) for p in problems)]
        )
    text = head + "## Summary: criteria met (✓) or missed (✗)\n\n"
    text += markdown_table(["method", "train cost × MAP (mean)", *problems], summary_rows)
    for p in problems:
        text += "\n" + problem_table(p, methods, cells[p])
    (run.out / "table.md").write_text(text)
    plot_criteria(cells, problems, methods, run.out / "calibration.png")
    plot_spread(cells, problems, methods, run.out / "spread.png")
    print(text)
    print(f"wrote {run.out / 'table.md'}, calibration.png, spread.png and results.json")


def _colour(method: str, ok: bool | None) -> str:
    if method in (REFERENCE, "map") or ok is None:
        return "0.55"
    return "tab:green" if ok else "tab:red"


#: the x-ranges of calibration.png's rows: a bar beyond is drawn to the edge and labelled with its value
NLL_RANGE = (-0.5, 1.5)
RATIO_RANGE = (0.1, 30.0)  # from 0.1: moons' Vprop (0.31), Vadam and BAdam drawn, not hidden (issue 48)


def _bar(
    ax: Any,
    y: float,
    value: tuple[float, float, int],
    colour: str,
    limits: tuple[float, float],
    label_small: bool = False,
) -> None:
    """A horizontal bar of ``value``'s mean (± its s.e.), clipped to ``limits`` and then labelled."""
    mean, se, _ = value
    low, high = limits
    shown = min(max(mean, low), high)
    ax.barh(y, shown, color=colour, xerr=se if math.isfinite(se) and shown == mean else None)
    if shown != mean:  # past the top: inside the full bar; below the bottom: no bar to write on
        ax.text(shown, y, f" {mean:.3g} ", va="center", ha="right" if mean > high else "left", fontsize=7,
                color="white" if mean > high else "black", fontweight="bold")  # fmt: skip
    elif label_small and abs(mean) < 0.02 * (high - low):  # a bar too short to see
        ax.text(mean, y, f" {mean:.2g}", va="center", fontsize=7)


def plot_criteria(
    cells: dict[str, dict[str, Any]], problems: list[str], methods: list[str], path: Any
) -> None:
    """Rows: NLL − ensemble's, coverage or ECE, far/near s.d.; columns: the problems; one bar per method."""
    from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter

    fig, axes = figure(3 * len(problems), cols=len(problems), size=(4.3, 4.6))
    y = np.arange(len(methods))[::-1]
    names = [label(m) for m in methods]
    for j, p in enumerate(problems):
        task = PROBLEMS[p].task
        rows = [axes[j], axes[len(problems) + j], axes[2 * len(problems) + j]]
        for i, m in enumerate(methods):
            c = cells[p][m]
            if c is None or not c["done"]:
                what, colour = ("n/a", "0.3") if c is None else ("diverged", "tab:red")
                for ax in rows:
                    ax.text(0.02, y[i], what, va="center", fontsize=7, color=colour,
                            transform=ax.get_yaxis_transform())  # fmt: skip
                continue
            v = verdicts(task, c) or {}
            if m == REFERENCE:
                rows[0].text(0.0, y[i], " the reference", va="center", fontsize=7)
            elif "delta_nll" in c:
                _bar(rows[0], y[i], c["delta_nll"], _colour(m, v.get("nll")), NLL_RANGE)
            calib = c["coverage95"] if task == "regression" else c["ece"]
            _bar(rows[1], y[i], calib, _colour(m, v.get("calibration")), (0.0, 1.0), label_small=True)
            if "far_near" in c:
                _bar(rows[2], y[i], c["far_near"], _colour(m, v.get("growing")), RATIO_RANGE)
            elif m == "map":
                rows[2].text(1.0, y[i], " one network", va="center", fontsize=7)
        rows[0].axvline(measure.NLL_MARGIN, color="k", ls="--", lw=1)
        rows[0].axvline(0.0, color="k", lw=0.6)
        rows[0].set_xlim(*NLL_RANGE)
        rows[0].set_xlabel("test NLL − ensemble's [nats] (--: +0.15)")
        if task == "regression":
            rows[1].axvspan(*measure.COVERAGE_BAND, color="tab:green", alpha=0.15)
            rows[1].set_xlim(0, 1.02)
            rows[1].set_xlabel("95% coverage (shaded: [0.90, 0.99])")
        else:
            ens = cells[p][REFERENCE]
            if ens is not None and "ece" in ens:
                rows[1].axvline(ens["ece"][0] + measure.ECE_MARGIN, color="k", ls="--", lw=1)
            rows[1].set_xlim(left=0.0)
            rows[1].set_xlabel("ECE (--: the ensemble's + 0.02)")
        rows[2].axvline(1.0, color="k", ls="--", lw=1)
        rows[2].set_xscale("log")
        rows[2].set_xlim(*RATIO_RANGE)
        rows[2].xaxis.set_major_locator(FixedLocator([0.1, 0.3, 1, 3, 10, 30]))
        rows[2].xaxis.set_major_formatter(ScalarFormatter())
        rows[2].xaxis.set_minor_formatter(NullFormatter())
        rows[2].set_xlabel(f"s.d. {FAR:g}× as far out / s.d. on test (log; --: 1)")
        rows[0].set_title(f"{p} ({task})", fontsize=10)
        for ax in rows:
            ax.set_yticks(y)
            ax.set_yticklabels(names if j == 0 else [], fontsize=8)
            ax.set_ylim(-0.6, len(methods) - 0.4)
            ax.tick_params(axis="x", labelsize=8)
            ax.xaxis.label.set_size(8)
    fig.suptitle(
        "Each rule with its defaults against a 5-member deep ensemble: green met, red missed, grey the "
        "references",
        fontsize=11,
    )
    save_figure(fig, path)


def plot_spread(cells: dict[str, dict[str, Any]], problems: list[str], methods: list[str], path: Any) -> None:
    """The mean predictive s.d. of the network's output on the probes, against their distance c: the ensemble
    in thick black, each rule in its own colour and line style; one legend for all panels."""
    import matplotlib
    import matplotlib.pyplot as plt

    colours = matplotlib.colormaps["tab10"]
    fig, axes = figure(len(problems), cols=len(problems), size=(4.4, 3.8))
    handles: dict[str, Any] = {}
    for ax, p in zip(axes, problems, strict=True):
        for i, m in enumerate(methods):
            c = cells[p][m]
            if m == "map" or c is None or not c["done"] or not c["sd"]:
                continue
            sd = [c["sd"][f"x{s:g}"] for s in SCALES]
            style = (
                {"color": "k", "lw": 2.8, "ls": "-"}
                if m == REFERENCE
                else {"color": colours(i % 10), "lw": 1.4, "ls": ("-", "--", ":")[i // 10 % 3]}
            )
            (handles[label(m)],) = ax.plot(SCALES, sd, marker="o", ms=3, **style)
        ax.set_yscale("log")
        ax.set_xticks(SCALES)
        ax.set_xlabel(
            "c: distance from the training mean\n(× the test inputs'; c = 1: the test set)", fontsize=8
        )
        ax.set_ylabel("mean s.d. of " + ("f(x)" if PROBLEMS[p].task == "regression" else "p(class | x)"))
        ax.set_title(f"{p} ({PROBLEMS[p].task})", fontsize=10)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle("Predictive s.d. across posterior draws, moving away from the training data", fontsize=11)
    fig.tight_layout(rect=(0, 0.2, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
