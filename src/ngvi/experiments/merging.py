"""``ngvi merging``: one MNIST network trained on disjoint parts of the data, merged by precision
(``ngvi.merge``) and by plain averaging, against training on all of it (issue 45, item 5).

The training images are cut into K = 2 parts, either at random (``halves``) or by digit (``digits``: 0-4
and 5-9, so each part sees half of the classes). From one shared initialisation (the seed's), a rule fits a
posterior qₖ to each part under the prior N(0, I) with N = the part's size; a third run fits all of it.
Then:

* ``precision``: ``ngvi.merge([q₁, q₂], prior=1.0)``, Σ Pₖμₖ / Σ Pₖ with the prior counted once (Bayes'
  rule for posteriors fitted apart; for a mean-field posterior an approximation, :mod:`ngvi.merge`);
* ``average``: the plain average of the means (the variances averaged too, so that the predictive is
  sampled the same way);
* ``part`` (each part alone, their metrics averaged) and ``joint`` (all the data) as references.

Each is scored on the test images by its Monte-Carlo predictive (``--test-samples`` draws): accuracy, NLL
and ECE (15 bins). The rules and their settings are ``ngvi continual``'s (:mod:`.continual`), not tuned here.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, ClassVar

import numpy as np
import torch

import ngvi

from . import continual
from .core import args as types
from .core.report import figure, fmt_mean_se, markdown_table, mean_se, save_figure
from .core.runner import Experiment, Job, Run

SPLITS = ("halves", "digits")
RULES = ("vadam", "vogn", "ivon")
VARIANTS = ("joint", "part", "precision", "average")
LABELS = {
    "joint": "all data (reference)",
    "part": "one part alone",
    "precision": "merged by precision",
    "average": "plain average",
}
DEFAULTS = {"epochs": 5, "train_size": 20000, "test_size": 5000, "test_samples": 10}
QUICK = {"epochs": 1, "train_size": 400, "test_size": 300, "test_samples": 2}


def _parts(y: torch.Tensor, split: str, gen: torch.Generator) -> list[torch.Tensor]:
    if split == "halves":
        order = torch.randperm(len(y), generator=gen)
        return [order[: len(y) // 2], order[len(y) // 2 :]]
    return [torch.nonzero(y < 5)[:, 0], torch.nonzero(y >= 5)[:, 0]]


def _fit(rule: str, x, y, state: dict[str, torch.Tensor], spec: dict[str, Any], seed: int):
    """A fresh network from the shared initialisation ``state``, trained on (x, y); (model, posterior)."""
    model = continual.network("permuted")
    model.load_state_dict(state)
    opt = continual._bayesian(rule, model, len(x), seed, None)
    gen = torch.Generator().manual_seed(seed)
    continual._fit(model, opt, x, y, torch.arange(10), spec["epochs"], spec["batch_size"], gen)
    return model, ngvi.posterior_of(model, opt)


@torch.no_grad()
def _scores(model, post, x, y, samples: int, seed: int) -> dict[str, float]:
    sampler = ngvi.PosteriorSampler(model, post, seed=seed)
    logits = ngvi.predict(model, sampler, x, samples=samples)
    probs = ngvi.metrics.predictive_probs(logits)
    return {
        "accuracy": ngvi.metrics.accuracy(probs, y),
        "nll": ngvi.metrics.categorical_nll(logits, y),
        "ece": ngvi.metrics.ece(probs, y),
    }


def run_merge(spec: dict[str, Any]) -> dict[str, Any]:
    from .data.mnist import load_mnist

    seed, rule = spec["seed"], spec["rule"]
    x, y = load_mnist("train", spec["data_dir"], flatten=True, normalize="unit")
    x_test, y_test = load_mnist("test", spec["data_dir"], flatten=True, normalize="unit")
    gen = torch.Generator().manual_seed(20_000 + seed)
    pick = torch.randperm(len(x), generator=gen)[: spec["train_size"]]
    x, y = x[pick], y[pick]
    x_test, y_test = x_test[: spec["test_size"]], y_test[: spec["test_size"]]
    torch.manual_seed(seed)
    init = {k: v.clone() for k, v in continual.network("permuted").state_dict().items()}
    start = time.perf_counter()
    model, joint = _fit(rule, x, y, init, spec, seed)
    out = {"joint": _scores(model, joint, x_test, y_test, spec["test_samples"], seed)}
    posts = []
    for k, idx in enumerate(_parts(y, spec["split"], gen)):
        model, post = _fit(rule, x[idx], y[idx], init, spec, seed + 100 * (k + 1))
        posts.append(post)
        out[f"part{k}"] = _scores(model, post, x_test, y_test, spec["test_samples"], seed)
    out["part"] = {m: float(np.mean([out[f"part{k}"][m] for k in range(2)])) for m in out["part0"]}
    merged = ngvi.merge(posts, prior=continual.PRIOR_PREC)
    out["precision"] = _scores(model, merged, x_test, y_test, spec["test_samples"], seed)
    average = ngvi.DiagonalGaussian(
        [sum(p.mean[i] for p in posts) / 2 for i in range(len(posts[0].mean))],
        [sum(p.variance[i] for p in posts) / 2 for i in range(len(posts[0].mean))],
    ).annotate(names=posts[0].names)
    out["average"] = _scores(model, average, x_test, y_test, spec["test_samples"], seed)
    return {"scores": out, "seconds": time.perf_counter() - start}


class Merging(Experiment):
    name = "merging"
    help = "MNIST fitted on disjoint parts, merged by precision (ngvi.merge) and by averaging, vs all data"
    examples = ("ngvi merging --quick   # a smoke run in seconds",)
    result_fields: ClassVar[dict[str, str]] = {"seconds": "seconds"}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        types.add_subset(parser, "--splits", SPLITS)
        types.add_subset(parser, "--rules", RULES)
        types.add_count(parser, "--seeds", 3, "runs per rule and split (default 3)")
        types.add_count(parser, "--epochs", None, "epochs per fit (default 5; --quick: 1)")
        types.add_count(parser, "--train-size", None, "training images (default 20000; --quick: 400)")
        types.add_count(parser, "--test-size", None, "test images (default 5000; --quick: 300)")
        types.add_count(parser, "--test-samples", None, "posterior draws per prediction (default 10)")
        parser.add_argument("--batch-size", type=types.positive_int, default=256)
        types.add_quick(parser, "a smoke run: 400 images, 1 epoch (options given explicitly win)")
        types.add_data_dir(parser, "data folder holding mnist/")

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        sizes = types.with_quick(args, DEFAULTS, QUICK)
        return {**sizes, "batch_size": args.batch_size, "options": continual.OPTIONS}

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        from .data.mnist import load_mnist

        load_mnist("test", args.data_dir)
        config = self.config(args)
        return [
            Job(
                f"{split}/{rule}/seed{s}",
                {**config, "split": split, "rule": rule, "seed": s, "data_dir": args.data_dir},
            )
            for split in args.splits
            for rule in args.rules
            for s in range(args.seeds)
        ]

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        return run_merge(spec)

    def report(self, args: argparse.Namespace, run: Run) -> None:
        runs = run.results["runs"]
        done = {
            (split, rule): [runs[k] for s in range(args.seeds) if (k := f"{split}/{rule}/seed{s}") in runs]
            for split in args.splits
            for rule in args.rules
        }
        (run.out / "table.md").write_text(table(done, run.results["config"]))
        plot(done, run.out / "merging.png")
        print((run.out / "table.md").read_text())
        print(f"wrote {run.out / 'merging.png'}, {run.out / 'table.md'} and {run.out / 'results.json'}")


def table(done: dict[tuple[str, str], list[dict[str, Any]]], config: dict[str, Any]) -> str:
    head = (
        "# ngvi merging: two posteriors fitted on disjoint parts of MNIST, merged\n\n"
        f"{config['train_size']} training and {config['test_size']} test images, {config['epochs']} "
        f"epoch(s) per fit, {config['test_samples']} posterior draws per prediction; mean ± s.e. over "
        "seeds. halves: random halves; digits: 0-4 and 5-9.\n\n"
    )
    rows = []
    for (split, rule), results in done.items():
        if not results:
            continue
        for v in VARIANTS:
            cells = [
                fmt_mean_se(
                    *mean_se(r["scores"][v][m] * (100 if m == "accuracy" else 1) for r in results)[:2]
                )
                for m in ("accuracy", "nll", "ece")
            ]
            rows.append([split, continual.LABELS[rule], LABELS[v], *cells, len(results)])
    header = ["split", "rule", "posterior", "accuracy [%]", "NLL", "ECE", "seeds"]
    return head + markdown_table(header, rows)


def plot(done: dict[tuple[str, str], list[dict[str, Any]]], path) -> None:
    shown = [(key, r) for key, r in done.items() if r]
    fig, axes = figure(max(1, len(shown)), cols=3, size=(3.8, 3.0))
    for ax, ((split, rule), results) in zip(axes, shown, strict=False):
        for i, v in enumerate(VARIANTS):
            acc = [100 * r["scores"][v]["accuracy"] for r in results]
            ax.bar(i, np.mean(acc), color=f"C{i}", label=LABELS[v])
            ax.scatter([i] * len(acc), acc, color="k", s=6, zorder=3)
        ax.set_xticks([])
        ax.set_ylim(0, 100)
        ax.set_title(f"{continual.LABELS[rule]}, {split}", fontsize=9)
        ax.set_ylabel("test accuracy [%]", fontsize=8)
        ax.tick_params(labelsize=7)
    save_figure(fig, path, legend_from=axes[0], dpi=120)


EXPERIMENT = Merging()
