"""``ngvi vime``: VIME with a BBB or an NNG-MVG dynamics model against TRPO with Gaussian control noise
(Zhang et al. 2018, §5.4, Fig. 3; Houthooft et al. 2016).

One job is one (task, arm, seed): TRPO for ``--iterations`` iterations of ``--steps`` environment steps;
each iteration records the mean extrinsic return of the episodes that ended in it (the sparse reward only,
never the bonus, as Fig. 3), and the mean intrinsic bonus. The report plots the median and interquartile
range over the seeds per task (Fig. 3's statistics). ``--quick`` is the CI smoke run. Writes
``results.json``, ``table.md`` and ``vime.png``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from ..core import args as types
from ..core.report import figure, markdown_table, save_figure
from ..core.runner import Experiment, Job, Run

ARMS = {"trpo": "TRPO (Gaussian noise)", "bbb": "TRPO+BBB (VIME)", "nng_mvg": "TRPO+NNG-MVG (VIME)"}
COLORS = {"trpo": "tab:gray", "bbb": "tab:blue", "nng_mvg": "tab:red"}
TASK_LABELS = {
    "mountain_car": "MountainCar (sparse)",
    "cartpole_swingup": "CartpoleSwingup (sparse)",
    "half_cheetah": "HalfCheetah (sparse)",
}
TASKS = tuple(TASK_LABELS)  # as in .tasks, which imports gymnasium (not needed for --help)
DEFAULTS = {
    "iterations": 40, "steps": 1000, "eta": 0.01, "hidden": 32, "updates": 100, "batch": 32,
    "min_pool": 500,
}  # fmt: skip
QUICK = {"iterations": 3, "steps": 500, "updates": 20, "tasks": ["mountain_car"], "seeds": 1}


class VIME(Experiment):
    name = "vime"
    requires = ("tqdm", "matplotlib", "gymnasium", "sb3_contrib")
    help = "VIME's information-gain bonus with a BBB or NNG-MVG dynamics model vs TRPO (NNG §5.4, Fig. 3)"
    examples = (
        "ngvi vime --quick                      # CI smoke run: mountain car, 3 iterations, 1 seed",
        "ngvi vime --tasks mountain_car --seeds 10 --iterations 100 --steps 5000   # nearer the paper",
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--tasks",
            type=types.names(TASKS),
            default=None,
            help=f"comma-separated subset of: {', '.join(TASKS)} (default: all; --quick: mountain_car)",
        )
        types.add_subset(parser, "--arms", ARMS)
        types.add_count(parser, "--seeds", None, "seeds per arm (default 3)")
        parser.add_argument("--first-seed", type=types.non_negative_int, default=0)
        for flag, text in [
            ("--iterations", "TRPO iterations"),
            ("--steps", "environment steps per iteration"),
            ("--hidden", "hidden units of the dynamics network"),
            ("--updates", "dynamics-model updates per iteration"),
            ("--batch", "minibatch of a dynamics-model update"),
            ("--min-pool", "transitions in the replay pool before the model is fitted"),
        ]:
            key = flag[2:].replace("-", "_")
            quick = f"; --quick: {QUICK[key]}" if key in QUICK else ""
            parser.add_argument(
                flag, type=types.positive_int, default=None, help=f"{text} (default {DEFAULTS[key]}{quick})"
            )
        parser.add_argument(
            "--eta",
            type=types.float_range(0.0, 1e3),
            default=None,
            help=f"η, the weight of the normalised information gain (default {DEFAULTS['eta']})",
        )
        types.add_quick(parser, "CI smoke run (options given explicitly win)")

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        config = types.with_quick(args, {**DEFAULTS, "tasks": list(TASKS), "seeds": 3}, QUICK)
        config["arms"] = list(args.arms)
        config["first_seed"] = args.first_seed
        return config

    def _seeds(self, config: dict[str, Any]) -> list[int]:
        return list(range(config["first_seed"], config["first_seed"] + config["seeds"]))

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        config = self.config(args)
        spec = {k: config[k] for k in DEFAULTS}
        return [
            Job(f"{task}/{arm}/seed{s}", {"task": task, "arm": arm, "seed": s, **spec})
            for task in config["tasks"]
            for arm in config["arms"]
            for s in self._seeds(config)
        ]

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        from ..rl.experiment import _mujoco_warnings_to_python
        from .agent import train
        from .tasks import make_task

        _mujoco_warnings_to_python()
        start = time.perf_counter()
        fit = {k: spec[k] for k in ("updates", "batch", "min_pool")}
        log = train(
            make_task(spec["task"]),
            spec["arm"],
            spec["seed"],
            iterations=spec["iterations"],
            n_steps=spec["steps"],
            eta=spec["eta"],
            hidden=spec["hidden"],
            fit=fit,
        )
        return {**log, "seconds": time.perf_counter() - start}

    def report(self, args: argparse.Namespace, run: Run) -> None:
        config = self.config(args)
        done = {
            task: {
                arm: [run.results["runs"][f"{task}/{arm}/seed{s}"] for s in self._seeds(config)]
                for arm in config["arms"]
            }
            for task in config["tasks"]
        }
        (run.out / "table.md").write_text(_table(done, config))
        plot(done, run.out / "vime.png", config)
        print((run.out / "table.md").read_text())
        print(f"wrote {run.out / 'vime.png'}, {run.out / 'table.md'} and {run.out / 'results.json'}")


def curve(result: dict[str, Any]) -> np.ndarray:
    """Mean extrinsic return per iteration; an iteration in which no episode ended carries the last one."""
    out, last = [], 0.0
    for r in result["return"]:
        last = last if r is None else r
        out.append(last)
    return np.array(out)


def _table(done: dict[str, dict[str, list[dict[str, Any]]]], config: dict[str, Any]) -> str:
    rows = []
    for task, arms in done.items():
        for arm, results in arms.items():
            curves = np.array([curve(r) for r in results])
            last = curves[:, -max(1, curves.shape[1] // 5) :].mean(1)  # the last fifth of the iterations
            reached = [int(np.argmax(c > 0)) + 1 if (c > 0).any() else None for c in curves]
            first = [r for r in reached if r is not None]
            rows.append([
                TASK_LABELS[task], ARMS[arm], f"{np.median(last):.3f}",
                f"[{np.percentile(last, 25):.3f}, {np.percentile(last, 75):.3f}]",
                f"{len(first)}/{len(results)}", f"{np.median(first):.0f}" if first else "—",
                f"{np.mean([r['seconds'] for r in results]):.0f}",
            ])  # fmt: skip
    head = (
        f"# ngvi vime: {config['iterations']} TRPO iterations of {config['steps']:,} steps, "
        f"{config['seeds']} seed(s) per arm, η = {config['eta']:g}\n\n"
        "Return: the mean extrinsic (sparse) return of the episodes of an iteration; 'final' is its mean "
        "over "
        "the last fifth of the iterations, median and interquartile range over the seeds.\n\n"
    )
    header = [
        "task", "arm", "final return (median)", "IQR", "seeds that reached the goal",
        "median first iteration at the goal", "time per job [s]",
    ]  # fmt: skip
    return head + markdown_table(header, rows)


def plot(done: dict[str, dict[str, list[dict[str, Any]]]], path, config: dict[str, Any]) -> None:
    """Median and interquartile range over the seeds of the return per iteration, one panel per task."""
    fig, axes = figure(len(done), cols=3, size=(4.4, 3.4))
    for ax, (task, arms) in zip(axes, done.items(), strict=True):
        for arm, results in arms.items():
            curves = np.array([curve(r) for r in results])
            x = np.arange(1, curves.shape[1] + 1)
            ax.plot(x, np.median(curves, 0), color=COLORS[arm], lw=1.6, label=ARMS[arm])
            if len(results) > 1:
                low, high = np.percentile(curves, [25, 75], axis=0)
                ax.fill_between(x, low, high, color=COLORS[arm], alpha=0.2, lw=0)
        ax.set_title(TASK_LABELS[task], fontsize=9)
        ax.set_xlabel(f"TRPO iteration ({config['steps']:,} steps each)", fontsize=8)
        ax.set_ylabel("mean extrinsic return per episode", fontsize=8)
        ax.tick_params(labelsize=7)
    spread = f"median and IQR over {config['seeds']} seeds" if config["seeds"] > 1 else "one seed"
    fig.suptitle(f"VIME (cf. NNG Fig. 3): {spread}, η = {config['eta']:g}", fontsize=10)
    save_figure(fig, path, legend_from=axes[0], dpi=120)


EXPERIMENT = VIME()
