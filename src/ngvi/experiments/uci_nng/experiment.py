"""``ngvi uci-nng``: the UCI regression benchmark under Zhang et al. 2018's protocol (NNG §5.1, Table 1).

A sibling of ``ngvi uci`` (Khan et al. 2018's protocol: 40 epochs, λ and τ tuned by BO), which stays as it
is. Here the prior is fixed (η = 1), the observation noise is learned with the weights (:mod:`.noise`) and
the training length is NNG's (:mod:`.protocol`). Fits run on ``--jobs`` worker processes, each kept in
``results.json`` as it finishes, so a killed run resumes. A benchmark run in pieces (methods or data sets
with different budgets) becomes one table with ``--merge-from DIR1,DIR2 --report-only``: every fit records
the settings it ran with, and the table states them.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

from ..core import args as arg_types
from ..core.runner import Experiment, Job, Run
from ..data import load_uci, uci_info
from ..uci.experiment import STANDARD_SETS, split_jobs
from .methods import METHODS
from .protocol import Protocol, fit

#: NNG's Table 1 without year (not in the staged data)
DATASETS = tuple(sorted((*STANDARD_SETS, "protein-tertiary-structure")))


class UCINNG(Experiment):
    name = "uci-nng"
    requires = ("tqdm", "matplotlib", "scipy")
    help = "the UCI regression benchmark under NNG's protocol (Zhang et al. 2018, §5.1, Table 1)"
    #: what the report reads of a fit (issue 31: a hand-edited results.json is checked entry by entry)
    result_fields: ClassVar[dict[str, str]] = {"rmse": "number", "loglik": "number", "seconds?": "seconds"}

    examples = (
        "ngvi uci-nng --datasets yacht --methods noisy_kfac --splits 3",
        "ngvi uci-nng --epochs-large 100 --splits 3            # shorter runs on the four large sets",
        "ngvi uci-nng --merge-from A,B --report-only --out ALL  # one table from runs in pieces",
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        arg_types.add_uci_datasets(parser, DATASETS, "all nine")
        arg_types.add_subset(parser, "--methods", METHODS)
        arg_types.add_count(parser, "--splits", None, "first K splits (default: all, 20 or 5)")
        arg_types.add_count(parser, "--epochs", 1000, "epochs on the five small sets (1000)")
        arg_types.add_count(
            parser, "--epochs-large", None, "epochs on kin8nm, naval, power and protein (default: --epochs)"
        )
        arg_types.add_count(
            parser, "--train-samples", 10, "training particles (MC samples) per step (NNG: 10)"
        )
        parser.add_argument(
            "--damping",
            type=arg_types.float_range(0.0, 1e3),
            default=0.0,
            help="extrinsic damping γ_ex of noisy K-FAC and NNG-BlkTri (NNG's config: 0; protein diverges "
            "without it)",
        )
        parser.add_argument("--seed", type=arg_types.non_negative_int, default=0)
        arg_types.add_data_dir(parser, "UCI data folder")
        arg_types.add_merge_from(
            parser, "comma-separated results folders whose fits of --datasets and --methods are copied first"
        )
        parser.add_argument(
            "--report-only", action="store_true", help="run no fits: report the ones in --out (after merging)"
        )

    def _protocol(self, args: argparse.Namespace) -> Protocol:
        large = args.epochs_large if args.epochs_large is not None else args.epochs
        return Protocol(
            epochs=args.epochs, epochs_large=large, train_samples=args.train_samples, damping=args.damping
        )

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        return {"protocol": self._protocol(args).asdict(), "seed": args.seed}

    def prepare(self, args: argparse.Namespace, run: Run) -> None:
        self.n_splits = {d: uci_info(d, args.data_dir).n_splits for d in args.datasets}  # fails early
        for path in args.merge_from:
            self._merge(path, args, run)
        run.save()

    def _merge(self, path: str, args: argparse.Namespace, run: Run) -> None:
        from ..core.results import ResultsFolder

        other = ResultsFolder(path, writable=False).load_results()
        if not other:
            raise ValueError(f"{path} holds no results.json to merge")
        for key, value in other["runs"].items():
            dataset, method = key.split("/")[:2]
            if dataset in args.datasets and method in args.methods:
                run.results["runs"].setdefault(key, value)
        run.results.setdefault("merged_from", {})[path] = {
            "config": other.get("config"),
            "wall_seconds": other.get("wall_seconds"),
        }

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        if args.report_only:
            return []
        common = {"protocol": self._protocol(args).asdict(), "seed": args.seed, "data_dir": args.data_dir}
        return split_jobs(args, self.n_splits, common)

    def report_keys(self, args: argparse.Namespace, jobs: Sequence[Job]) -> list[str]:
        """The fits the table shows: those of ``jobs``, with --report-only too (it runs none)."""
        return [job.key for job in split_jobs(args, self.n_splits, {})]

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        split = load_uci(spec["dataset"], spec["split"], spec["data_dir"])
        protocol = Protocol(**spec["protocol"])
        settings = {
            "epochs": protocol.epochs_for(spec["dataset"]),
            "batch_size": protocol.batch_size(spec["dataset"]),
            "train_samples": protocol.train_samples,
        }
        if protocol.damping and METHODS[spec["method"]].extrinsic_damping:
            settings["damping"] = protocol.damping
        try:
            result = fit(
                METHODS[spec["method"]], spec["dataset"], split, protocol, spec["seed"] + spec["split"]
            )
        except FloatingPointError as err:  # ngvi.NonFiniteGradientError: this fit diverged; the others go on
            result = {"diverged": str(err)}
        return {**result, "settings": settings}

    def report(self, args: argparse.Namespace, run: Run) -> None:
        from .report import plot, table

        command = " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == [self.name] else ""
        text = table(run.results, args.datasets, args.methods, command)
        (run.out / "table.md").write_text(text)
        plot(run.results, args.datasets, args.methods, run.out / "rmse.png")
        print(text)
        print(f"wrote {run.out / 'table.md'}, {run.out / 'rmse.png'} and {run.out / 'results.json'}")


EXPERIMENT = UCINNG()
