"""``ngvi hmc``: NNG §5.3, Table 4: how well each method's predictive variances match HMC's.

Protocol (Zhang et al. 2018, §5.3): in each trial, 20 labelled training points and 100 unlabelled points
are drawn at random from a UCI data set; every method fits the 20 points and predicts the 100; the Pearson
correlation between its predictive variances and those of HMC (here pyro's NUTS) over the 100 points is
the score; 10 trials per set, mean ± s.e. The model and each method's settings are in :mod:`.protocol`.
One job is one (data set, trial): NUTS and every method on the same points.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from typing import Any

from ..core import args as arg_types
from ..core.runner import Experiment, Job, Run
from ..data.uci import uci_name
from . import protocol
from .protocol import DATASETS, Budget, Standardised

_BUDGET_OPTIONS = (
    ("--steps", "steps", "full-batch steps of each variational method"),
    ("--chains", "chains", "NUTS chains"),
    ("--warmup", "warmup", "NUTS warm-up iterations per chain"),
    ("--samples", "samples", "NUTS draws kept per chain"),
    ("--tree-depth", "tree_depth", "NUTS maximum tree depth (at most 2^depth leapfrog steps a draw)"),
    ("--doublings", "doublings", "NUTS reruns with twice the warm-up and draws while it has not mixed"),
    ("--target-r-hat", "target_r_hat", "mixed: every prediction's split R-hat at most this"),
    ("--target-ess", "target_ess", "mixed: every prediction's effective sample size at least this"),
)


#: the options that decide when a NUTS reference has mixed (``ngvi active`` runs NUTS once a round and
#: judges it by the default targets, so it leaves them out)
MIXING_FIELDS = ("doublings", "target_r_hat", "target_ess")


def add_budget_arguments(parser: argparse.ArgumentParser, budget: Budget, mixing: bool = True) -> None:
    """The NUTS and VI budget options (defaults from ``budget``; the mixing targets unless ``mixing`` is
    False), --quick, --seed and --data-dir. An option given on the command line wins over --quick's tiny
    budget."""
    kinds = {
        "samples": arg_types.int_range(2),  # 2 for the ESS
        "doublings": arg_types.int_range(0, 6),
        "target_r_hat": arg_types.float_range(1.0, 10.0),
        "target_ess": arg_types.positive_float,
    }
    for flag, field, text in _BUDGET_OPTIONS:
        if field in MIXING_FIELDS and not mixing:
            continue
        default = getattr(budget, field)
        kind = kinds.get(field, arg_types.positive_int)
        help = f"{text} (default {default}; --quick: {getattr(Budget.quick(), field)})"
        parser.add_argument(flag, type=kind, default=None, help=help)
    parser.set_defaults(budget_defaults=budget)
    arg_types.add_quick(parser, "a smoke run: tiny budgets, for tests (options given explicitly win)")
    parser.add_argument("--seed", type=arg_types.non_negative_int, default=0)
    arg_types.add_data_dir(parser, "UCI data folder")


def budget_of(args: argparse.Namespace, extra: tuple[str, ...] = ()) -> Budget:
    """The budget ``args`` give; ``extra`` names a caller's own budget options (argparse default None)."""
    defaults = asdict(args.budget_defaults)
    fields = [field for _, field, _ in _BUDGET_OPTIONS if hasattr(args, field)] + list(extra)
    values = arg_types.with_quick(args, {f: defaults[f] for f in fields}, asdict(Budget.quick()))
    return Budget(**{**defaults, **values})


def method_argument(parser: argparse.ArgumentParser) -> None:
    arg_types.add_subset(parser, "--methods", protocol.available_methods())
    parser.add_argument(
        "--datasets",
        type=arg_types.names(DATASETS, aliases=uci_name),
        default=list(DATASETS),
        help="comma-separated UCI sets of NNG Tables 3-4 (boston, naval, power, wine, ...; default: all 8)",
    )


class HMC(Experiment):
    name = "hmc"
    requires = ("tqdm", "matplotlib", "scipy", "pyro")
    help = "NNG Table 4: correlation of each method's predictive variances with HMC's (pyro NUTS) on UCI"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        method_argument(parser)
        arg_types.add_count(parser, "--trials", 10, "trials per set (10)")
        arg_types.add_count(parser, "--train", 20, "labelled points (20)")
        arg_types.add_count(parser, "--unlabelled", 100, "unlabelled points (100)")
        add_budget_arguments(parser, Budget())

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        return {
            "budget": asdict(budget_of(args)),
            "train": args.train,
            "unlabelled": args.unlabelled,
            "seed": args.seed,
            "model": dict(protocol.MODEL),
        }

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        """NUTS once per (data set, trial), and each method on the same points: a method added later (a
        rerun with more --methods and the same --out) trains only itself against the cached NUTS runs."""
        config = self.config(args)
        return [
            Job(
                f"{method}/{dataset}/{trial}",
                {"method": method, "dataset": dataset, "trial": trial, "data_dir": args.data_dir, **config},
            )
            for trial in range(args.trials)  # trial-major: a run stopped early has every set's first trials
            for dataset in args.datasets
            for method in ["hmc", *args.methods]
        ]

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        budget = Budget(**spec["budget"])
        x, y = protocol.load(spec["dataset"], spec["data_dir"])
        seed = spec["seed"] * 1000 + spec["trial"]
        train, unlabelled = protocol.subset_indices(len(x), (spec["train"], spec["unlabelled"]), seed)
        data = Standardised.of(x[train], y[train])
        x_eval = data.inputs(x[unlabelled])
        start = time.perf_counter()
        name = spec["method"]
        if name == "hmc":
            post, record = protocol.nuts_reference(data, x_eval, budget, seed)
            return {
                **record,
                "seconds_total": time.perf_counter() - start,
                "variance": post.predict(x_eval)[..., 0].var(0).tolist(),
            }
        model, trainer = protocol.build(name, x_eval.shape[1], len(train), seed)
        seconds = protocol.train_vi(model, trainer, data, budget.steps)
        var = protocol.vi_predictions(model, trainer, name, x_eval, protocol.PREDICT_SAMPLES).var(0)
        return {"seconds": seconds, "variance": var.tolist()}

    def report(self, args: argparse.Namespace, run: Run) -> None:
        from .report import write_report

        write_report(args, run, self.jobs(args, run))


EXPERIMENT = HMC()
