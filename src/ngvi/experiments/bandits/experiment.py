"""``ngvi bandits`` as an experiment of the harness: one job per (data set, agent, run), each a full pass
over the data set's contexts (:func:`.protocol.run_bandit`), kept in ``results.json`` as it finishes, so a
killed run resumes. Run r of every agent sees the same contexts and rewards (data seed = seed + r), so the
agents are compared on paired problems.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..core import args as arg_types
from ..core.runner import Experiment, Job, Run
from ..data.bandits import load_bandit
from ..data.bandits_user import USER_BANDITS
from .agents import AGENTS
from .jobs import job_key, problems
from .protocol import DATA_SIZE_RULES, Protocol, run_bandit
from .report import write_report

REAL_SETS = ("mushroom", "statlog", "adult")
DATASETS = (*REAL_SETS, "wheel", *USER_BANDITS)
DEFAULT_DELTAS = (0.5, 0.7, 0.9, 0.95, 0.99)
#: contexts of a wheel problem when --contexts does not say (the other sets default to all their rows)
WHEEL_CONTEXTS = 2000
#: the options that --quick sets (when not given), with their defaults (contexts {}: every row of a data set)
DEFAULTS = {"datasets": [*REAL_SETS, "wheel"], "agents": list(AGENTS), "contexts": {}, "runs": 10}
#: the reduced run of --quick (and of the CI test): mushroom, Vadam against greedy and uniform
QUICK = {"datasets": ["mushroom"], "agents": ["vadam", "greedy", "uniform"], "contexts": 300, "runs": 12}


def parse_contexts(text: str) -> dict[str, int]:
    """``2000`` (every data set) or ``mushroom=8124,wheel=2000`` (per data set; others: all rows)."""
    out: dict[str, int] = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        name, eq, value = item.rpartition("=")
        key = name.strip().lower() if eq else "*"
        if eq and key not in DATASETS:
            raise argparse.ArgumentTypeError(f"unknown data set {name!r}; choose from {', '.join(DATASETS)}")
        out[key] = arg_types.positive_int(value)
    if not out:
        raise argparse.ArgumentTypeError("expected a number of contexts, or name=number pairs")
    return out


def _deltas(text: str) -> list[float]:
    values = [arg_types.positive_float(t) for t in text.split(",") if t.strip()]
    if not values or any(v > 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected radii δ in (0, 1], got {text!r}")
    return list(dict.fromkeys(values))


class Bandits(Experiment):
    name = "bandits"
    help = "contextual bandits with Thompson sampling (BADAM Table 1, Riquelme et al. 2018)"

    examples = (
        "ngvi bandits --datasets mushroom --contexts 2000 --runs 10",
        "ngvi bandits --datasets mushroom,wheel --contexts mushroom=8124,wheel=2000 --deltas 0.5,0.9",
        "ngvi bandits --datasets covertype --user-data-dir ~/bandit-data   # files you provide",
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        arg_types.add_subset(
            parser,
            "--datasets",
            DATASETS,
            f"comma-separated: {', '.join(DATASETS)} (default: mushroom,statlog,adult,wheel; --quick: "
            f"mushroom); {', '.join(USER_BANDITS)} are read from --user-data-dir",
            default=None,
        )
        arg_types.add_subset(
            parser,
            "--agents",
            AGENTS,
            f"comma-separated: {', '.join(AGENTS)} (default: all; --quick: {','.join(QUICK['agents'])})",
            default=None,
        )
        parser.add_argument(
            "--contexts",
            type=parse_contexts,
            default=None,
            help="contexts per run: N for every data set, or name=N pairs (default: every row of a data set, "
            f"as BADAM; the wheel {WHEEL_CONTEXTS}; --quick: {QUICK['contexts']})",
        )
        arg_types.add_count(parser, "--runs", None, f"runs per agent (default 10; --quick: {QUICK['runs']})")
        parser.add_argument(
            "--deltas",
            type=_deltas,
            default=list(DEFAULT_DELTAS),
            help="radii δ of the wheel bandit (default 0.5,0.7,0.9,0.95,0.99)",
        )
        parser.add_argument(
            "--data-size",
            choices=DATA_SIZE_RULES,
            default="rounds_x_batch",
            help="N of a session after t rounds: t × batch size (BADAM, default) or t (the buffer size)",
        )
        arg_types.add_quick(
            parser,
            f"the reduced run CI executes: {QUICK['contexts']} mushroom contexts, {QUICK['runs']} runs, "
            "Vadam, greedy and uniform (options given explicitly win)",
        )
        parser.add_argument(
            "--report-only",
            action="store_true",
            help="write table.md and regret.png from the runs already in --out's results.json, running none "
            "(a problem's cells take the runs every agent finished)",
        )
        parser.add_argument("--seed", type=arg_types.non_negative_int, default=0)
        arg_types.add_data_dir(parser, "ngvi data folder")
        parser.add_argument(
            "--user-data-dir",
            default=None,
            help=f"a folder of your own with the files of {', '.join(USER_BANDITS)} (not in the ngvi data)",
        )

    def resolve(self, args: argparse.Namespace) -> argparse.Namespace:
        """The arguments with --quick applied: an option given explicitly wins over it."""
        quick = {**QUICK, "contexts": {"*": QUICK["contexts"]}}  # every data set's
        return argparse.Namespace(**{**vars(args), **arg_types.with_quick(args, DEFAULTS, quick)})

    def protocol(self, args: argparse.Namespace) -> Protocol:
        return replace(Protocol(), data_size=args.data_size)

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        return {"protocol": self.protocol(args).config(), "seed": args.seed}

    def n_contexts(self, args: argparse.Namespace, dataset: str) -> int | None:
        fallback = WHEEL_CONTEXTS if dataset == "wheel" else None
        return args.contexts.get(dataset, args.contexts.get("*", fallback))

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        args = self.resolve(args)
        run.results["layout"] = {
            "problems": [key for key, _, _ in problems(args.datasets, args.deltas)],
            "agents": args.agents,
            "runs": args.runs,
        }
        out: list[Job] = []
        if getattr(args, "report_only", False):
            return out
        for key, dataset, delta in problems(args.datasets, args.deltas):
            contexts = self.n_contexts(args, dataset)
            if dataset in USER_BANDITS and args.user_data_dir is None:
                load_bandit(dataset, contexts)  # says the data is not available offline, before any work
            for agent in args.agents:
                for r in range(args.runs):
                    spec = {
                        "problem": key,
                        "dataset": dataset,
                        "delta": delta,
                        "contexts": contexts,
                        "agent": agent,
                        "run": r,
                        "seed": args.seed + r,
                        "protocol": self.config(args)["protocol"],
                        "data_dir": args.data_dir,
                        "user_dir": args.user_data_dir,
                    }
                    out.append(Job(job_key(key, contexts, agent, r), spec))
        return out

    def report_keys(self, args: argparse.Namespace, jobs: Sequence[Job]) -> list[str]:
        """The runs the tables compare: those of ``jobs``, with --report-only too (it runs none)."""
        args = self.resolve(args)
        return [
            job_key(key, self.n_contexts(args, dataset), agent, r)
            for key, dataset, _ in problems(args.datasets, args.deltas)
            for agent in args.agents
            for r in range(args.runs)
        ]

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        start, cpu = time.perf_counter(), time.process_time()
        data = load_problem(spec)
        protocol = Protocol(**{**spec["protocol"], "hidden": tuple(spec["protocol"]["hidden"])})
        result = run_bandit(data, spec["agent"], protocol, spec["seed"])
        result.update(
            contexts=len(data), seconds=time.perf_counter() - start, cpu_seconds=time.process_time() - cpu
        )
        return result

    def report(self, args: argparse.Namespace, run: Run) -> None:
        args = self.resolve(args)
        write_report(self, args, run)


def load_problem(spec: dict[str, Any]) -> Any:
    """The data set of a job: seeded by the run, the same for every agent. Every context is seen once:
    mushroom with fewer contexts than its 8,124 rows takes the first ones of a seeded permutation (its loader
    would draw with replacement, as Riquelme et al.'s sampler does, which it still does beyond 8,124)."""
    dataset, seed, contexts = spec["dataset"], spec["seed"], spec["contexts"]
    if dataset == "wheel":
        return load_bandit("wheel", contexts, delta=spec["delta"], seed=seed)
    if dataset in USER_BANDITS:
        return load_bandit(dataset, contexts, seed=seed, user_dir=spec["user_dir"])
    if dataset == "mushroom" and contexts is not None:
        full = load_bandit("mushroom", None, seed=seed, data_dir=spec["data_dir"])
        if contexts <= len(full):
            return full.head(contexts)
    return load_bandit(dataset, contexts, seed=seed, data_dir=spec["data_dir"])


EXPERIMENT = Bandits()
