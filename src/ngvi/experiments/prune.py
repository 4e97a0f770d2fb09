"""``ngvi prune``: pruning MNIST weights by signal-to-noise ratio (BADAM §4 and App. D.2, Fig. 2).

Each method trains a 784-400-400-10 ReLU network with dropout 0.2 on the hidden layers (BADAM App. D.2)
on the 60,000 MNIST training images (pixels in [0, 1], minibatches of 128, as BADAM's code), with
N = 60,000. Its posterior q = N(μ, σ²) then ranks the weights: the fraction p with the lowest |μ|/σ is
set to zero (:mod:`ngvi.pruning`, all weights and biases ranked together, as BADAM's code does), and the
test accuracy of the pruned mean network is measured for every p. The baseline prunes the same μ by |μ|
alone (BADAM's "Σ = 1"). One job per (method, seed); a killed run resumes with the jobs it had not
finished. Writes ``results.json``, ``table.md`` and ``prune.png``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

import ngvi

from .core import args as types
from .core import training
from .core.methods import METHODS
from .core.report import figure, fmt_mean_se, markdown_table, mean_se, save_figure
from .core.runner import Experiment, Job, Run

DATA_SIZE = 60_000
HIDDEN = (400, 400)
#: the options that --quick sets (when not given), with their defaults (subset None: all the images)
DEFAULTS = {"epochs": 100, "subset": None}
QUICK = {"epochs": 2, "subset": 1000}
#: the fractions pruned: BADAM's code evaluates these
FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.96, 0.97, 0.98, 0.99, 0.995, 0.999)
TABLE_FRACTIONS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98)
CRITERIA = ("snr", "magnitude")
CRITERION_LABEL = {"snr": "|μ|/σ", "magnitude": "|μ|"}
#: each method's settings (beside data_size = N). BAdam as BADAM App. D.2: Adam's defaults with β₂ = 0.99999
#: and no L2 regularisation. VOGN and BBVI as Khan et al.'s MNIST code (lr 10⁻³, prior precision 1; BBVI
#: starts at σ = 0.01). Vadam: prior precision 10³, the best of {1, 10², 10³, 10⁴} after 1-2 epochs (with 1
#: its weight noise keeps it at chance: docs/results/prune/README.md). IVON: lr 0.1, h₀ = 0.1, β₂ = 0.9999
#: (0.99999 leaves h at h₀ over a run this short) and its update clip 10⁻³; without the clip, β₂ = 0.999
#: diverged after 3 epochs (docs/results/prune/README.md).
OPTIONS: dict[str, dict[str, Any]] = {
    "badam": {"lr": 1e-3, "betas": (0.9, 0.99999), "prior_prec": 0.0},
    "vadam": {"lr": 1e-3, "betas": (0.9, 0.999), "prior_prec": 1e3, "init_prec": None},
    "vogn": {"lr": 1e-3, "beta": 1e-3, "prior_prec": 1.0, "init_prec": None, "momentum": 0.0},
    "ivon": {"lr": 0.1, "betas": (0.9, 0.9999), "prior_prec": 6.0, "hess_init": 0.1, "clip_radius": 1e-3},
    "bbvi": {"lr": 1e-3, "prior_prec": 1.0, "init_prec": 1e4},
}
#: BADAM's own numbers, read off the output of the authors' notebook (github.com/skezle/BADAM,
#: badam_weight_pruning.ipynb): one run, sigmoid units, 200 epochs, lr 10⁻³, β₂ = 0.999, dropout 0.2.
#: The paper's Fig. 2 gives its curves only as a plot.
BADAM_NOTEBOOK = {
    "snr": {0.0: 0.9818, 0.5: 0.9822, 0.8: 0.9751, 0.9: 0.9398, 0.95: 0.7219, 0.98: 0.1653},
    "magnitude": {0.0: 0.9818, 0.5: 0.9807, 0.8: 0.9446, 0.9: 0.5514, 0.95: 0.2315, 0.98: 0.1604},
}


def network(dropout: float) -> nn.Sequential:
    """784-400-400-10 ReLU with dropout after each hidden layer (BADAM App. D.2); none on the inputs."""
    layers: list[nn.Module] = []
    fan_in = 784
    for width in HIDDEN:
        layers += [nn.Linear(fan_in, width), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        fan_in = width
    return nn.Sequential(*layers, nn.Linear(fan_in, 10))


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    return float((model(x).argmax(1) == y).double().mean())


def pruning_curve(
    model: nn.Module, posterior: ngvi.GaussianPosterior, x: torch.Tensor, y: torch.Tensor, criterion: str
) -> list[float]:
    """Test accuracy of the mean network with the fraction p of weights pruned by ``criterion``, per p."""
    params = list(model.parameters())
    out = []
    for p in FRACTIONS:
        with ngvi.pruned(params, posterior.prune_masks(p, criterion=criterion)):
            out.append(accuracy(model, x, y))
    return out


class Prune(Experiment):
    name = "prune"
    help = "prune MNIST weights by |μ|/σ and by |μ|: test accuracy against the fraction pruned (BADAM Fig. 2)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        types.add_subset(parser, "--methods", OPTIONS)
        types.add_count(parser, "--epochs", None, "epochs (default 100, BADAM App. D.2; --quick: 2)")
        types.add_count(parser, "--seeds", 1, "runs per method (default 1)")
        parser.add_argument("--batch-size", type=types.positive_int, default=128)
        parser.add_argument(
            "--dropout",
            type=types.float_range(0.0, 0.99),
            default=0.2,
            help="dropout rate of the hidden layers, in [0, 0.99] (default 0.2)",
        )
        types.add_count(
            parser,
            "--subset",
            None,
            "train and test on the first K training and test images (default: all; --quick: 1000)",
        )
        types.add_quick(
            parser,
            "a smoke run: 1,000 training and 1,000 test images, 2 epochs (options given explicitly win)",
        )
        types.add_data_dir(parser, "data folder holding mnist/")
        parser.add_argument(
            "--report-only",
            action="store_true",
            help="write table.md and prune.png from --out's results.json under the configuration it "
            "records, running nothing (--methods and --seeds pick the runs)",
        )

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        if getattr(args, "report_only", False):  # the folder's own configuration, whatever OPTIONS say now
            from .core.results import ResultsFolder

            recorded = ResultsFolder(args.out, writable=False).load_results().get("config")
            if recorded is None:
                raise ValueError(f"--report-only: {args.out} holds no results.json with a config to report")
            return recorded
        if not 0 <= args.dropout < 1:
            raise ValueError(f"--dropout must lie in [0, 1), got {args.dropout}")
        sizes = types.with_quick(args, DEFAULTS, QUICK)  # an explicit option wins over --quick
        return {
            "epochs": sizes["epochs"],
            "batch_size": args.batch_size,
            "dropout": args.dropout,
            "subset": sizes["subset"],
            "options": {m: OPTIONS[m] for m in args.methods},
        }

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        if getattr(args, "report_only", False):
            return []
        from .data.mnist import load_mnist

        load_mnist("test", args.data_dir)  # a missing data folder fails here, before any worker starts
        config = self.config(args)
        return [
            Job(
                f"{m}/seed{s}",
                {"method": m, "seed": s, "data_dir": args.data_dir, **config, "options": OPTIONS[m]},
            )
            for m in args.methods
            for s in range(args.seeds)
        ]

    def report_keys(self, args: argparse.Namespace, jobs: Sequence[Job]) -> list[str]:
        """The runs the table shows: ``--methods`` × ``--seeds``, with --report-only too (it runs none)."""
        return [f"{m}/seed{s}" for m in args.methods for s in range(args.seeds)]

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        from .data.mnist import load_mnist

        x, y = load_mnist("train", spec["data_dir"], flatten=True, normalize="unit")
        x_test, y_test = load_mnist("test", spec["data_dir"], flatten=True, normalize="unit")
        if spec["subset"]:
            x, y, x_test, y_test = (t[: spec["subset"]] for t in (x, y, x_test, y_test))
        seed = spec["seed"]
        torch.manual_seed(seed)
        model = network(spec["dropout"])
        method = METHODS[spec["method"]]
        trainer = method.build(model, DATA_SIZE, seed=seed, skip_nonfinite=True, **spec["options"])
        curve: list[float] = []
        start = time.perf_counter()
        training.train(
            model,
            trainer,
            x,
            y,
            nn.functional.cross_entropy,
            epochs=spec["epochs"],
            batch_size=spec["batch_size"],
            generator=torch.Generator().manual_seed(seed),
            after_epoch=lambda epoch: curve.append(accuracy(model, x_test, y_test)),
        )
        seconds = time.perf_counter() - start
        posterior = trainer.posterior()
        std = torch.cat([s.reshape(-1) for s in posterior.std])
        snr = torch.cat([s.reshape(-1) for s in posterior.snr()])
        return {
            "seconds": seconds,
            "test_accuracy_per_epoch": curve,
            "fractions": list(FRACTIONS),
            "accuracy": {c: pruning_curve(model, posterior, x_test, y_test, c) for c in CRITERIA},
            "std_quantiles": torch.quantile(std.double(), torch.tensor([0.1, 0.5, 0.9]).double()).tolist(),
            "snr_quantiles": torch.quantile(snr.double(), torch.tensor([0.1, 0.5, 0.9]).double()).tolist(),
            "weights": int(std.numel()),
            "skipped_steps": trainer.skipped_steps,
        }

    def report(self, args: argparse.Namespace, run: Run) -> None:
        config = run.results["config"]
        missing = [f"{m}/seed{s}" for m in args.methods for s in range(args.seeds)]
        missing = [k for k in missing if k not in run.results["runs"]]
        if missing:
            raise ValueError(f"{run.out} has no run {', '.join(missing)}: lower --seeds or pick --methods")
        done = {m: [run.results["runs"][f"{m}/seed{s}"] for s in range(args.seeds)] for m in args.methods}
        (run.out / "table.md").write_text(_table(done, config))
        plot(done, run.out / "prune.png", config)
        print((run.out / "table.md").read_text())
        print(f"wrote {run.out / 'prune.png'}, {run.out / 'table.md'} and {run.out / 'results.json'}")


#: a run counts as diverged when its last epoch's test accuracy is this many points below its best epoch's
DIVERGED_DROP = 20.0


def label(name: str, results: list[dict[str, Any]], config: dict[str, Any]) -> str:
    """The method's label, saying where its runs used IVON without the update clip, or diverged (every seed
    ending ``DIVERGED_DROP`` points or more below its best epoch): such rows are not the method's result."""
    notes = []
    if name == "ivon" and config["options"].get("ivon", {}).get("clip_radius") is None:
        notes.append("unclipped")
    drops = [100 * (max(r["test_accuracy_per_epoch"]) - r["test_accuracy_per_epoch"][-1]) for r in results]
    if drops and min(drops) >= DIVERGED_DROP:
        notes.append("diverged")
    return METHODS[name].label + (f" ({', '.join(notes)})" if notes else "")


def _at(result: dict[str, Any], criterion: str, p: float) -> float:
    return result["accuracy"][criterion][result["fractions"].index(p)]


def _table(done: dict[str, list[dict[str, Any]]], config: dict[str, Any]) -> str:
    seeds = len(next(iter(done.values())))
    header = ["method", "pruned by", *(f"p = {p:g}" for p in TABLE_FRACTIONS), "train time [s]"]
    rows = []
    for name, results in done.items():
        for c in CRITERIA:
            cells = [fmt_mean_se(*mean_se(100 * _at(r, c, p) for r in results)[:2]) for p in TABLE_FRACTIONS]
            time_cell = f"{np.mean([r['seconds'] for r in results]):.0f}" if c == "snr" else ""
            rows.append([label(name, results, config), CRITERION_LABEL[c], *cells, time_cell])
    for c in CRITERIA:
        rows.append(
            [
                "BADAM's notebook",
                CRITERION_LABEL[c],
                *(f"{100 * BADAM_NOTEBOOK[c][p]:.2f}" for p in TABLE_FRACTIONS),
                "",
            ]
        )
    verdicts = []
    for name, results in done.items():
        diff = [100 * (_at(r, "snr", 0.9) - _at(r, "magnitude", 0.9)) for r in results]
        m, se, n = mean_se(diff)
        verdicts.append(
            f"- {label(name, results, config)}: |μ|/σ − |μ| at p = 0.9 is {fmt_mean_se(m, se)} points "
            f"({n} run{'s' if n > 1 else ''}; {sum(d > 0 for d in diff)} of {n} favour |μ|/σ)"
        )
    subset = config["subset"]
    data = (
        f"the first {subset:,} training and {min(subset, 10_000):,} test images of MNIST"
        if subset
        else "MNIST (60,000 / 10,000)"
    )
    head = (
        f"# ngvi prune: test accuracy [%] with the fraction p of weights pruned (BADAM Fig. 2)\n\n"
        f"{data}; 784-400-400-10 ReLU, dropout {config['dropout']} on the hidden layers, "
        f"{config['epochs']} epochs of minibatches of {config['batch_size']}, N = {DATA_SIZE}; "
        f"mean ± s.e. over {seeds} seed(s). Pruning zeroes the fraction p of all weights and biases "
        "with the lowest score (|μ|/σ or |μ|, ranked together); accuracy of the pruned mean network. "
        "BADAM's notebook row: the authors' code, one run (sigmoid units, 200 epochs); the paper's Fig. 2 "
        "is a plot only.\n\n"
    )
    return head + markdown_table(header, rows) + "\nAt p = 0.9:\n" + "\n".join(verdicts) + "\n"


def plot(done: dict[str, list[dict[str, Any]]], path, config: dict[str, Any]) -> None:
    """One panel per method (|μ|/σ solid, |μ| dashed; mean ± s.e. over seeds) and one with every method's
    |μ|/σ curve; x is the fraction pruned, on a logit scale so that 0.9–0.999 can be told apart."""
    fig, axes = figure(len(done) + 1, cols=3, size=(4.0, 3.1))
    colors = dict(
        zip(done, ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"], strict=False)
    )
    shown = [i for i, p in enumerate(FRACTIONS) if p > 0]
    xs = np.array([FRACTIONS[i] for i in shown])

    def band(ax, results, criterion, color, style, label):
        acc = 100 * np.array([[r["accuracy"][criterion][i] for i in shown] for r in results])
        mean = acc.mean(0)
        ax.plot(xs, mean, style, color=color, lw=1.5, label=label, marker=".", ms=4)
        if len(results) > 1:
            se = acc.std(0, ddof=1) / np.sqrt(len(results))
            ax.fill_between(xs, mean - se, mean + se, color=color, alpha=0.2, lw=0)

    for ax, (name, results) in zip(axes, done.items(), strict=False):
        band(ax, results, "snr", colors[name], "-", "pruned by |μ|/σ")
        band(ax, results, "magnitude", "0.35", "--", "pruned by |μ|")
        ax.set_title(f"{label(name, results, config)}: {config['epochs']} epochs", fontsize=9)
    last = axes[-1]
    for name, results in done.items():
        band(last, results, "snr", colors[name], "-", label(name, results, config))
    last.set_title("pruned by |μ|/σ, all methods", fontsize=9)
    last.legend(fontsize=7, loc="lower left")
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    for ax in axes:
        ax.set_xscale("logit")
        ax.set_xlim(0.08, 0.9995)
        ax.xaxis.set_major_locator(FixedLocator([0.1, 0.5, 0.9, 0.99, 0.999]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda p, _: f"{p:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(0, 100)
        ax.axvline(0.9, color="0.8", lw=0.8, zorder=0)
        ax.set_xlabel("fraction of weights pruned, p", fontsize=8)
        ax.set_ylabel("test accuracy [%]", fontsize=8)
        ax.tick_params(labelsize=7)
    save_figure(fig, path, legend_from=axes[0], dpi=120)


EXPERIMENT = Prune()
