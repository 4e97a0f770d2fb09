"""The bandits report: ``table.md`` (our normalised rewards beside BADAM Table 1, the wheel, timings) and
``regret.png`` (cumulative regret against rounds, mean and ± one std over the runs, one panel per problem).

Like BADAM Table 1 the tables give mean ± one standard deviation over the runs (ddof = 1), not the
standard error. Bold marks the best mean in a column and every agent a paired t-test over the runs (the runs
share their contexts and rewards) cannot tell from it at p = 0.01.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..core.report import bold_set, figure, markdown_table, save_figure
from ..core.runner import Run
from .agents import AGENTS
from .jobs import job_key, problems
from .protocol import Protocol
from .published import BADAM_TABLE1, COLUMNS, PAPER_CONTEXTS

BOLD_NOTE = (
    "Bold: the best mean in that column and every agent that a paired t-test over the runs cannot tell from "
    "it at p = 0.01."
)


def fmt_mean_std(values: list[float], digits: int = 2) -> str:
    if not values:
        return "—"
    v = np.asarray(values, dtype=float)
    if len(v) == 1:
        return f"{v[0]:.{digits}f} (1 run)"
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}"


def collect(run: Run, experiment: Any, args: argparse.Namespace) -> dict[str, dict[str, list[dict]]]:
    """problem -> agent -> the finished runs' results (in run order). Only the runs that every agent of a
    problem finished are taken (an agent that has not run a problem at all is left out of it), so a
    problem's agents are always compared on the same contexts and rewards, also when a run was stopped."""
    runs = run.results["runs"]
    out: dict[str, dict[str, list[dict]]] = {}
    for key, dataset, _ in problems(args.datasets, args.deltas):
        contexts = experiment.n_contexts(args, dataset)
        keys = {a: {r: job_key(key, contexts, a, r) for r in range(args.runs)} for a in args.agents}
        present = [a for a in args.agents if any(k in runs for k in keys[a].values())]
        common = [r for r in range(args.runs) if all(keys[a][r] in runs for a in present)]
        out[key] = {a: [runs[keys[a][r]] for r in common] if a in present else [] for a in args.agents}
    return out


def n_runs(done: dict[str, list[dict]]) -> int:
    """The number of runs behind a problem's cells (the same for every agent that ran it)."""
    return max((len(rs) for rs in done.values()), default=0)


def _scores(results: list[dict]) -> dict[int, float]:
    return {i: r["normalised_reward"] for i, r in enumerate(results)}


def _bold(cells: dict[str, str], done: dict[str, list[dict]]) -> dict[str, str]:
    best = bold_set({a: _scores(rs) for a, rs in done.items() if rs}, +1)
    return {a: f"**{c}**" if a in best else c for a, c in cells.items()}


def badam_table(done: dict[str, dict[str, list[dict]]], agents: list[str]) -> str:
    """Our normalised rewards beside BADAM Table 1, for the problems the paper has a column for."""
    cols = [p for p in done if p in COLUMNS]
    if not cols:
        return ""
    header = ["agent"]
    for p in cols:
        n = {r["contexts"] for rs in done[p].values() for r in rs}
        t = "/".join(str(x) for x in sorted(n)) or "?"
        paper_t = PAPER_CONTEXTS.get(p, "all")
        header += [f"{COLUMNS[p]}: ours (T = {t}, {n_runs(done[p])} runs)", f"BADAM (T = {paper_t}, 10 runs)"]
    cells = {
        p: _bold({a: fmt_mean_std(list(_scores(done[p][a]).values())) for a in agents}, done[p]) for p in cols
    }
    rows = []
    for a in agents:
        spec = AGENTS[a]
        row = [spec.label]
        for p in cols:
            paper = BADAM_TABLE1.get(spec.published or "", {}).get(p)
            row += [cells[p][a], f"{paper[0]:.2f} ± {paper[1]:.2f}" if paper else "—"]
        rows.append(row)
    return markdown_table(header, rows)


def other_table(done: dict[str, dict[str, list[dict]]], agents: list[str]) -> str:
    """Problems without a BADAM column (the wheel): normalised reward, and cumulative regret relative to
    uniform's (Riquelme et al.'s measure) where uniform ran."""
    cols = [p for p in done if p not in COLUMNS]
    if not cols:
        return ""
    cells = {
        p: _bold({a: fmt_mean_std(list(_scores(done[p][a]).values())) for a in agents}, done[p]) for p in cols
    }
    rows = []
    for a in agents:
        row = [AGENTS[a].label]
        for p in cols:
            row.append(cells[p][a])
            uniform = done[p].get("uniform", [])
            mine = done[p][a]
            if uniform and mine:
                base = np.mean([r["curve_regret"][-1] for r in uniform])
                rel = [100.0 * r["curve_regret"][-1] / base for r in mine]
                row.append(fmt_mean_std(rel, 1))
            else:
                row.append("—")
        rows.append(row)
    header = ["agent"]
    for p in cols:
        header += [f"{p}: normalised reward ({n_runs(done[p])} runs)", f"{p}: regret, % of uniform"]
    return markdown_table(header, rows)


def timing_table(done: dict[str, dict[str, list[dict]]], agents: list[str]) -> str:
    header = ["agent", *[f"{p} [s/run]" for p in done]]
    rows = []
    for a in agents:
        row = [AGENTS[a].label]
        for p in done:
            rs = done[p][a]
            row.append(f"{np.mean([r['seconds'] for r in rs]):.1f}" if rs else "—")
        rows.append(row)
    return markdown_table(header, rows)


def skipped_table(done: dict[str, dict[str, list[dict]]], agents: list[str], protocol: Protocol) -> str:
    """Where a trainer met a non-finite gradient or curvature: the runs affected and the share of their
    training steps skipped (``skip_nonfinite``); empty if none did."""
    rows = []
    for a in agents:
        cells, any_skipped = [], False
        for p in done:
            rs = done[p][a]
            # a run without the count is from before it: it met none (a non-finite step then raised)
            hit = [r for r in rs if r.get("skipped_steps", 0) > 0]
            any_skipped |= bool(hit)
            if not hit:
                cells.append("—")
                continue
            share = np.mean([r["skipped_steps"] / (r["sessions"] * protocol.train_steps) for r in hit])
            cells.append(f"{len(hit)}/{len(rs)} runs, {100 * share:.0f}% of their steps")
        if any_skipped:
            rows.append([AGENTS[a].label, *cells])
    return markdown_table(["agent", *done], rows) if rows else ""


def plot_regret(done: dict[str, dict[str, list[dict]]], agents: list[str], path: Path) -> None:
    problems = [p for p in done if any(done[p].values())]
    if not problems:
        return
    # one panel: wide enough for the shared legend below it
    size = (7.2, 4.2) if len(problems) == 1 else (4.4, 3.4)
    fig, axes = figure(len(problems), cols=min(3, len(problems)), size=size)
    colors = {a: f"C{i}" for i, a in enumerate(AGENTS)}
    for ax, p in zip(axes, problems, strict=True):
        for a in agents:
            rs = done[p][a]
            if not rs:
                continue
            x = np.asarray(rs[0]["curve_rounds"])
            y = np.asarray([r["curve_regret"] for r in rs])
            mean = y.mean(0)
            ax.plot(x, mean, color=colors[a], lw=1.4, label=AGENTS[a].label)
            if len(rs) > 1:
                std = y.std(0, ddof=1)
                ax.fill_between(x, mean - std, mean + std, color=colors[a], alpha=0.15, lw=0)
        ax.set_title(f"{p} ({n_runs(done[p])} runs)", fontsize=9)
        ax.set_xlabel("round t", fontsize=8)
        ax.set_ylabel("cumulative regret", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))
    save_figure(fig, path, legend_from=axes[0], dpi=120)


def write_report(experiment: Any, args: argparse.Namespace, run: Run) -> None:
    done = collect(run, experiment, args)
    protocol: Protocol = experiment.protocol(args)
    n_rule = "t × batch size" if protocol.data_size == "rounds_x_batch" else "t (the buffer size)"
    head = (
        "# ngvi bandits: Thompson sampling on contextual bandits (BADAM Table 1, App. D.3)\n\n"
        "Cumulative reward normalised by the optimal expected reward, mean ± one std over the runs "
        "(ddof = 1; their number is in each column's header: run r of every agent of a problem sees the same "
        f"contexts and rewards). Protocol: each arm pulled {protocol.initial_pulls} times first; "
        f"every {protocol.train_every} rounds {protocol.train_steps} minibatches of {protocol.batch_size} "
        f"from the replay buffer; 2 × {protocol.hidden[0]} ReLU; "
        f"lr {protocol.lr}/(1 + {protocol.lr_decay}k) (agents' own lr₀: see README); "
        f"N = {n_rule}; λ = {protocol.prior_prec}, τ = {protocol.noise_prec}. T = contexts per run "
        "(BADAM: the whole data set).\n\n"
    )
    parts = [head]
    table = badam_table(done, args.agents)
    if table:
        parts += ["## Beside BADAM Table 1\n\n", table, "\n", BOLD_NOTE, "\n\n"]
    table = other_table(done, args.agents)
    if table:
        parts += ["## Problems without a BADAM column (the wheel bandit of Riquelme et al.)\n\n", table, "\n"]
        parts += [
            BOLD_NOTE,
            " Regret relative to uniform: 100 × agent's / uniform's mean cumulative regret.\n\n",
        ]
    table = skipped_table(done, args.agents, protocol)
    if table:
        parts += [
            "## Training steps skipped as non-finite\n\n",
            "A step whose gradient or curvature is not finite is skipped (the trainer's `skip_nonfinite`) "
            "and the agent goes on acting on its posterior; these runs' scores are in the tables above.\n\n",
            table,
            "\n",
        ]
    parts += ["## Wall time per run (one thread)\n\n", timing_table(done, args.agents)]
    (run.out / "table.md").write_text("".join(parts))
    plot_regret(done, args.agents, run.out / "regret.png")
    print((run.out / "table.md").read_text())
    wall = run.results.get("wall_seconds")
    spent = f" ({wall / 60:.1f} min of jobs in all)" if wall and math.isfinite(wall) else ""
    print(f"wrote {run.out / 'table.md'}, {run.out / 'regret.png'} and {run.out / 'results.json'}{spent}")
