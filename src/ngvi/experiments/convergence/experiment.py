r"""``ngvi convergence``: how fast BBVI, Vadam and VOGN (and IVON) converge (Khan et al. 2018, App. J.2,
Fig. 3 left).

**Protocol** (App. J.2 and the authors' ``pytorch/vogn_code/run_experiments.py``): australian-scale, the fixed
50/50 split of the authors' PyTorch code (345 / 345, features in [−1, 1], not normalised), an MLP 14-64-1
with ReLU, Bernoulli likelihood, prior precision λ = 1, every method starting at precision 1. 5000
iterations for (M, S) ∈ {(1, 1), (1, 16), (128, 16)} (minibatch size M, MC samples S; the last minibatch of
each epoch is the remainder, as with the authors' data loader). Adam and Vadam: α = 1e-3, (γ₁, γ₂) = (0.9,
0.999); VOGN: α = 1e-3, β = 1e-3 (the authors' ``beta = 0.999`` is 1 − β), no momentum; IVON (an extra row):
α = 1e-3, (β₁, β₂) = (0.9, 0.999), h₀ = 0.01 (q₀'s precision N(h₀ + λ/N) = 4.5; with h₀ near 0, q₀ the
prior as for the others, IVON's first steps diverge at M = S = 1: log-loss 14 after 50 iterations). BBVI
draws its S samples as S copies of the minibatch in one forward pass (under its local reparameterisation
every row has its own noise: the same estimator as S passes).

**Metrics**, at 110 iterations from 0 to 5000, each (method, setting) over ``--seeds`` seeds (model
initialisation, minibatch order and MC noise):

* the authors' "test log-loss" (their ``metrics.predictive_avneg_loglik_bernoulli``, 10 samples):
  −(1/N) log (1/S) Σₛ Πᵢ p(yᵢ | θₛ), the mean over samples of the likelihood of the *whole* test set. It is
  dominated by the best of the S samples (at initialisation, random networks with σ = 1 on every weight,
  it is about 2.3 where the predictive log-loss below is 0.69). The authors evaluated it at every
  iteration, one seed; their curves (``pytorch/vogn_code/results/results.zip``, the mean of the 101
  evaluations around each mark) are drawn beside ours in this metric.
* the log-loss of the MC predictive, −(1/N) Σᵢ log (1/S) Σₛ p(yᵢ | θₛ) with S = 100: the usual metric.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch
from torch import nn

import ngvi

from ..core import args as types
from ..core import models, training
from ..core.methods import METHODS
from ..core.report import figure, fmt_mean_se, markdown_table, mean_se, save_figure
from ..core.runner import Experiment, Job, Run
from ..data import load_australian_scale
from .published import PAPER_CURVES, PAPER_MARKS

SETTINGS = ((1, 1), (1, 16), (128, 16))
METHOD_NAMES = ("bbvi", "vadam", "vogn", "ivon")
PRIOR_PREC = 1.0
HIDDEN = 64
EVAL_SAMPLES = 100
AUTHORS_EVAL_SAMPLES = 10
COLORS = {"bbvi": "tab:brown", "vadam": "tab:red", "vogn": "tab:blue", "ivon": "tab:green"}


def options(name: str, data_size: int) -> dict[str, Any]:
    """Each method's settings (App. J.2), beside prior_prec = 1 and mc_samples."""
    if name == "vogn":
        return {"lr": 1e-3, "beta": 1e-3, "init_prec": 1.0, "momentum": 0.0}
    if name == "ivon":
        return {"lr": 1e-3, "betas": (0.9, 0.999), "hess_init": 0.01}
    if name == "vadam":  # eqs. 88-93 as written (the step divides by the uncorrected s)
        return {"lr": 1e-3, "betas": (0.9, 0.999), "init_prec": 1.0, "step_moment": "paper"}
    return {"lr": 1e-3, "betas": (0.9, 0.999), "init_prec": 1.0}  # BBVI (Adam on the ELBO)


def eval_iterations(steps: int) -> list[int]:
    """0, 10, …, 100, then every 50 up to ``steps``."""
    marks = set(range(0, min(steps, 100) + 1, 10)) | set(range(0, steps + 1, 50)) | {steps}
    return sorted(marks)


TABLE_MARKS = (100, 500, 1000, 2000, 5000)


def _log_p(logit_samples: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """log p(yᵢ | θₛ) for every sample and test point, [S, N]."""
    signs = torch.where(y > 0, 1.0, -1.0).to(logit_samples.dtype)
    return nn.functional.logsigmoid(signs * logit_samples[..., 0])


def predictive_log_loss(logit_samples: torch.Tensor, y: torch.Tensor) -> float:
    """−(1/N) Σᵢ log (1/S) Σₛ p(yᵢ | θₛ): the log-loss of the MC predictive."""
    log_p = _log_p(logit_samples, y)
    return float(-(torch.logsumexp(log_p, 0) - np.log(log_p.shape[0])).mean())


def authors_log_loss(logit_samples: torch.Tensor, y: torch.Tensor) -> float:
    """−(1/N) log (1/S) Σₛ Πᵢ p(yᵢ | θₛ): the authors' ``predictive_avneg_loglik_bernoulli``."""
    joint = _log_p(logit_samples, y).sum(1)  # [S]
    return float(-(torch.logsumexp(joint, 0) - np.log(joint.shape[0])) / y.shape[0])


#: the options that --quick sets (when not given), with their defaults
DEFAULTS = {"steps": 5000, "seeds": 3}
QUICK = {"steps": 60, "seeds": 1}


class Convergence(Experiment):
    name = "convergence"
    requires = ("tqdm", "matplotlib", "scipy")
    help = "test log-loss against iterations for BBVI, Vadam, VOGN and IVON (Khan et al. 2018, Fig. 3 left)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        types.add_subset(
            parser, "--methods", METHOD_NAMES, f"comma-separated: {', '.join(METHOD_NAMES)} (default: all)"
        )
        types.add_count(parser, "--steps", None, "iterations (default 5000; --quick: 60)")
        types.add_count(parser, "--seeds", None, "seeds per curve (default 3; --quick: 1)")
        types.add_quick(parser, "60 iterations, 1 seed: a smoke run (options given explicitly win)")
        types.add_data_dir(parser)

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        return {
            "methods": list(args.methods),
            **types.with_quick(args, DEFAULTS, QUICK),  # an explicit option wins over --quick
            "settings": [list(s) for s in SETTINGS],
        }

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        config = self.config(args)
        return [
            Job(
                f"M{m}-S{s}/{name}/seed{seed}",
                {
                    "method": name,
                    "batch_size": m,
                    "mc_samples": s,
                    "seed": seed,
                    "steps": config["steps"],
                    "data_dir": args.data_dir,
                },
            )
            for m, s in SETTINGS
            for name in config["methods"]
            for seed in range(config["seeds"])
        ]

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        data = load_australian_scale(spec["data_dir"])
        x, y, x_test, y_test = data.to_torch(label_dtype=torch.float32)
        n, name, samples = x.shape[0], spec["method"], spec["mc_samples"]
        torch.manual_seed(spec["seed"])
        model = models.mlp(x.shape[1], HIDDEN, 1)
        copies = samples if name == "bbvi" else 1  # BBVI: S samples as S copies of the minibatch
        trainer = METHODS[name].build(
            model,
            n,
            prior_prec=PRIOR_PREC,
            mc_samples=samples // copies,
            seed=spec["seed"],
            **options(name, n),
        )
        marks = eval_iterations(spec["steps"])
        curves: dict[str, list[float]] = {"log_loss": [], "authors_log_loss": []}
        seconds = 0.0
        start = time.process_time()

        def evaluate() -> None:
            nonlocal seconds, start
            seconds += time.process_time() - start
            with torch.no_grad():
                logits = ngvi.predict(model, trainer, x_test, samples=EVAL_SAMPLES)
            curves["log_loss"].append(predictive_log_loss(logits, y_test))
            curves["authors_log_loss"].append(authors_log_loss(logits[:AUTHORS_EVAL_SAMPLES], y_test))
            start = time.process_time()

        def before_step(t: int) -> None:
            if t - 1 in marks:
                evaluate()

        def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return nn.functional.binary_cross_entropy_with_logits(output[:, 0], target)

        training.train_steps(
            model,
            trainer,
            x,
            y,
            loss_fn,
            steps=spec["steps"],
            batch_size=spec["batch_size"],
            generator=torch.Generator().manual_seed(spec["seed"]),
            copies=copies,
            before_step=before_step,
        )
        if spec["steps"] in marks:
            evaluate()
        seconds += time.process_time() - start
        return {"iterations": marks, **curves, "train_seconds": seconds}

    def report(self, args: argparse.Namespace, run: Run) -> None:
        config, runs = self.config(args), run.results["runs"]
        curves = {
            (metric, m, s, name): np.array(
                [runs[f"M{m}-S{s}/{name}/seed{k}"][metric] for k in range(config["seeds"])]
            )
            for metric in METRICS
            for m, s in SETTINGS
            for name in config["methods"]
        }
        marks = eval_iterations(config["steps"])
        _figure(curves, marks, config, run)
        text = _table(curves, marks, config, runs)
        (run.out / "table.md").write_text(text)
        print(text)
        print(f"wrote {run.out / 'table.md'}, {run.out / 'convergence.png'} and {run.out / 'results.json'}")


def _at(marks: list[int], values: np.ndarray, iteration: int) -> np.ndarray:
    return values[..., marks.index(iteration)]


def _cell(values: np.ndarray) -> str:
    mean, se, _ = mean_se(values.tolist())
    return fmt_mean_se(mean, se) if len(values) > 1 else f"{mean:.3f}"


def _table(curves: dict, marks: list[int], config: dict[str, Any], runs: dict[str, Any]) -> str:
    table_marks = [t for t in TABLE_MARKS if t in marks] + (
        [marks[-1]] if marks[-1] not in TABLE_MARKS else []
    )
    sections = [
        "# ngvi convergence: test log-loss against iterations (Khan et al. 2018, App. J.2, Fig. 3 left)\n\n"
        f"australian-scale (345 training, 345 test), MLP 14-64-1, λ = {PRIOR_PREC}, {config['steps']} "
        f"iterations, {config['seeds']} seed(s) per row (mean ± s.e.). Figure: `convergence.png`. IVON is an "
        "extra row.\n"
    ]
    for metric, (title, note) in METRICS.items():
        rows = []
        for m, s in SETTINGS:
            for name in config["methods"]:
                values = curves[metric, m, s, name]
                paper = PAPER_CURVES.get((m, s, name)) if metric == "authors_log_loss" else None
                cells = []
                for t in table_marks:
                    ours = _cell(_at(marks, values, t))
                    if metric == "authors_log_loss":
                        theirs = f"{paper[PAPER_MARKS.index(t)]:.3f}" if paper and t in PAPER_MARKS else "—"
                        ours = f"{ours} ({theirs})"
                    cells.append(ours)
                row = [f"M = {m}, S = {s}", METHODS[name].label, *cells]
                if metric == "log_loss":
                    seconds = [
                        runs[f"M{m}-S{s}/{name}/seed{k}"]["train_seconds"] for k in range(config["seeds"])
                    ]
                    row.append(f"{np.mean(seconds):.0f}")
                rows.append(row)
        suffix = ": ours (paper)" if metric == "authors_log_loss" else ""
        header = ["setting", "method", *[f"iteration {t}{suffix}" for t in table_marks]]
        header += ["train CPU s / run"] if metric == "log_loss" else []
        sections.append(f"## {title}\n\n{note}\n\n" + markdown_table(header, rows))
    return "\n".join(sections)


def _figure(curves: dict, marks: list[int], config: dict[str, Any], run: Run) -> None:
    fig, axes = figure(2 * len(SETTINGS), cols=3, size=(4.6, 3.6))
    x = np.array(marks)
    for row, (metric, (title, _)) in enumerate(METRICS.items()):
        for col, (m, s) in enumerate(SETTINGS):
            ax = axes[row * len(SETTINGS) + col]
            for name in config["methods"]:
                values = curves[metric, m, s, name]
                ax.plot(x, values.mean(0), color=COLORS[name], lw=1.8, label=f"{METHODS[name].label} (ours)")
                if len(values) > 1:
                    ax.fill_between(x, values.min(0), values.max(0), color=COLORS[name], alpha=0.15, lw=0)
                paper = PAPER_CURVES.get((m, s, name)) if metric == "authors_log_loss" else None
                if paper is not None:
                    ax.plot(
                        PAPER_MARKS,
                        paper,
                        "--",
                        color=COLORS[name],
                        lw=1.1,
                        label=f"{METHODS[name].label} (paper)",
                    )
            ax.set_title(f"M = {m}, S = {s}: {title}", fontsize=9)
            ax.set_xlabel("iteration")
            ax.set_ylabel("test log-loss [nats]")
            ax.set_xlim(0, max(marks))
            if metric == "authors_log_loss":  # log scale: the early 2.5 and the late 0.4 both readable
                ax.set_yscale("log")
                ax.set_ylim(0.33, 3.0)
                ticks = [0.4, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0]
                ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
                ax.minorticks_off()
            else:
                ax.set_ylim(0.3, 1.0)
            ax.grid(alpha=0.3)
    fig.suptitle(
        "Fig. 3 (left): australian-scale, MLP 14-64-1 (ours: mean over seeds, band: min–max; "
        "dashed: the authors' run)",
        fontsize=10,
    )
    save_figure(fig, run.out / "convergence.png", legend_from=axes[0], dpi=100)


METRICS = {
    "authors_log_loss": (
        "the authors' metric (10 samples)",
        "−(1/N) log (1/10) Σₛ Πᵢ p(yᵢ | θₛ), as the authors compute it "
        "(`predictive_avneg_loglik_bernoulli`): dominated by the best of the 10 samples. In brackets the "
        "authors' run (one seed; the mean of the 101 "
        "evaluations around the iteration, from their `results.zip`).",
    ),
    "log_loss": (
        "predictive log-loss (100 samples)",
        "−(1/N) Σᵢ log (1/100) Σₛ p(yᵢ | θₛ), the log-loss of the MC predictive (the authors did not "
        "report it).",
    ),
}


EXPERIMENT = Convergence()
