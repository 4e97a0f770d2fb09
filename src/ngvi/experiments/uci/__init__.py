"""``ngvi uci``: the UCI regression benchmark of Khan et al. 2018 (Table 1) and Zhang et al. 2018 (Table 1).

Protocol (Khan et al. 2018, App. J.1; Zhang et al. 2018, §5.1): Gal & Ghahramani's splits (20 per data set,
5 for protein), one hidden layer of 50 ReLU units (100 for protein), 40 epochs, minibatches of 32 on the four
small sets and 128 on the others, inputs and targets standardised with training statistics, 100 posterior
samples at test time, RMSE and log-likelihood in the targets' units. λ and τ are tuned by Bayesian
optimisation (see :mod:`.tuning`); ``--tune none`` uses cached or shipped values.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ngvi.experiments.data import uci_name

from .._io import markdown_table
from .methods import METHODS
from .report import build_table, plot_curves
from .runner import STANDARD_SETS, default_jobs, fit_seconds, run

__all__ = ["add_arguments", "main", "run"]


def _source(hp: dict) -> str:
    if hp.get("source") == "bo":
        b = hp["budget"]
        return f"BO, {b['trials']} trials × {b['folds']} folds, {b['epochs']} epochs"
    return hp.get("source", "?")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "examples:\n"
        "  ngvi uci --datasets yacht,concrete --methods vadam,bbvi --splits 20 --tune none\n"
        "  ngvi uci --methods vadam --tune bo --trials 30 --folds 5     # tune on split 0, then all splits\n"
        "A killed run resumes: rerun the same command with the same --out."
    )
    parser.add_argument(
        "--datasets",
        default=",".join(STANDARD_SETS),
        help="comma-separated UCI sets (aliases: boston, naval, power, wine, protein); default: Table 1's 8",
    )
    parser.add_argument(
        "--methods", default="vadam,bbvi,mc_dropout", help=f"comma-separated: {', '.join(METHODS)}"
    )
    parser.add_argument("--splits", type=int, default=None, help="first K splits (default: all, 20 or 5)")
    parser.add_argument(
        "--tune", choices=["bo", "none"], default="none", help="bo: Bayesian optimisation on split 0"
    )
    parser.add_argument(
        "--trials", type=int, default=30, help="BO evaluations per data set and method (default 30)"
    )
    parser.add_argument(
        "--folds", type=int, default=5, help="cross-validation folds per BO evaluation (default 5)"
    )
    parser.add_argument("--epochs", type=int, default=40, help="training epochs (default 40)")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="worker processes (default: 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=None, help="UCI data folder (default: $NGVI_DATA)")
    parser.add_argument("--out", default="runs/uci", help="results folder (default: runs/uci)")
    parser.add_argument(
        "--merge-from",
        default="",
        help="comma-separated results folders (same protocol and seed) whose fits and tuned values for "
        "--datasets and --methods are copied into --out first: a benchmark run in pieces, one table",
    )


def main(args: argparse.Namespace) -> None:
    datasets = [d for d in args.datasets.split(",") if d]
    methods = [m for m in args.methods.split(",") if m]
    out = Path(args.out)
    results = run(
        datasets,
        methods,
        args.splits,
        args.tune,
        out,
        trials=args.trials,
        folds=args.folds,
        epochs=args.epochs,
        jobs=args.jobs,
        seed=args.seed,
        data_dir=args.data_dir,
        merge_from=[Path(d) for d in args.merge_from.split(",") if d],
    )
    shown = [uci_name(d) for d in datasets]
    hp_rows = [
        [k, f"{v['prior_prec']:.3g}", f"{v['noise_prec']:.3g}", v.get("dropout", "—"), _source(v)]
        for k, v in sorted(results["hparams"].items())
        if k.split("/")[0] in shown and k.split("/")[1] in methods
    ]
    fit_minutes = [
        f"{METHODS[m].label} {fit_seconds(results, shown, m) / 60:.1f}" for m in methods if m in METHODS
    ]
    command = " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["uci"] else "uci ..."
    header = (
        "# UCI regression benchmark\n\n"
        f"Command: `ngvi {command}`  \n"
        f"Fitting time, summed over each method's fits on one core (tuning not included; with 2 worker "
        f"processes the wall time is about half): {', '.join(fit_minutes)} min.  \n"
        "λ (prior precision) and τ (noise precision, standardised units) were tuned on split 0 of each data "
        "set and reused for every split.\n\n"
        + markdown_table(["data set / method", "λ", "τ", "dropout", "tuned by"], hp_rows)
    )
    (out / "table.md").write_text(build_table(results, shown, methods, header))
    plot_curves(results, shown, methods, out / "curves.png")
    print((out / "table.md").read_text())
    print(f"wrote {out / 'table.md'}, {out / 'curves.png'} and {out / 'results.json'}")
