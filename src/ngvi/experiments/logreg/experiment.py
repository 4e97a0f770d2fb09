"""``ngvi logreg``: Khan et al. 2018, §6.1 and Fig. 2, as an experiment of the harness.

Three parts, each a set of jobs (one fit each, resumable):

* ``toy`` (Fig. 2a): VOGN-1 and Vadam on Murphy's 2-D mixture; MF-Exact and the true posterior on a grid.
* ``splits`` (Fig. 2b): every method on 20 random 50/50 splits of breast-cancer and USPS 3-vs-5; negative
  ELBO, test log-loss and symmetric KL to the split's MF-Exact.
* ``minibatch`` (Fig. 2c): Vadam with M ∈ {1, 8, 16, 32, 64} and VOGN-1, 20 runs each on breast-cancer's
  fixed split; symmetric KL to MF-Exact.

MF-Exact of every split is computed first (``prepare``, on the workers) and kept in ``results.json``.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

import ngvi

from ..core import args as types
from ..core.runner import Experiment, Job, Run, job_key
from . import protocol, toy
from .protocol import ALL_METHODS, DATASETS
from .report import report

PARTS = ("toy", "splits", "minibatch")
BATCH_SIZES = (1, 8, 16, 32, 64)
# the budget options, with their defaults, and what --quick sets (when not given)
DEFAULTS = {"splits": 20, "restarts": 20, "steps": 20_000, "minibatch_steps": 30_000, "toy_steps": toy.STEPS}
QUICK = {"splits": 2, "restarts": 2, "steps": 200, "minibatch_steps": 200, "toy_steps": 200}


class LogReg(Experiment):
    name = "logreg"
    requires = ("tqdm", "matplotlib", "scipy")
    help = "Bayesian logistic regression against MF-Exact (Khan et al. 2018, §6.1, Fig. 2)"

    examples = (
        "ngvi logreg --quick                      # every part, tiny budgets (a smoke run)",
        "ngvi logreg --parts minibatch --restarts 20 --jobs 2",
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        types.add_subset(parser, "--parts", PARTS, f"comma-separated: {', '.join(PARTS)} (default: all)")
        types.add_subset(
            parser, "--datasets", DATASETS, f"data sets of Fig. 2b: {', '.join(DATASETS)} (default: both)"
        )
        types.add_subset(
            parser, "--methods", ALL_METHODS, f"methods of Fig. 2b: {', '.join(ALL_METHODS)} (default: all)"
        )
        types.add_count(parser, "--splits", None, "random splits (default 20; --quick: 2)")
        types.add_count(
            parser, "--restarts", None, "runs per minibatch size in Fig. 2c (default 20; --quick: 2)"
        )
        parser.add_argument(
            "--batch-sizes",
            type=_sizes,
            default=list(BATCH_SIZES),
            help="Vadam's minibatch sizes in Fig. 2c (default 1,8,16,32,64)",
        )
        types.add_count(
            parser, "--steps", None, "iterations per fit in Fig. 2b (default 20000; --quick: 200)"
        )
        types.add_count(
            parser, "--minibatch-steps", None, "iterations per fit in Fig. 2c (default 30000; --quick: 200)"
        )
        types.add_count(
            parser,
            "--toy-steps",
            None,
            f"iterations per fit in Fig. 2a (default {toy.STEPS}, as App. I.1; --quick: 200)",
        )
        types.add_quick(
            parser, "2 splits, 2 runs, 200 iterations per fit: a smoke run (options given explicitly win)"
        )
        types.add_data_dir(parser)

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        batch_sizes = sorted(set(args.batch_sizes))
        budget = types.with_quick(args, DEFAULTS, QUICK)  # an explicit option wins over --quick
        return {
            "parts": list(args.parts),
            "datasets": list(args.datasets),
            "methods": list(args.methods),
            "batch_sizes": batch_sizes,
            **budget,
            **(
                {"pilot": {"base_lr": protocol.BASE_LR, "factors": list(protocol.PILOT_FACTORS)}}
                if "splits" in args.parts
                else {}
            ),
        }

    # ------------------------------------------------------------------------------------------------
    def _reference_specs(self, config: dict[str, Any], data_dir: str | None) -> list[dict[str, Any]]:
        specs = []
        if "toy" in config["parts"]:
            specs.append({"kind": "reference", "dataset": "toy", "split": None})
        if "splits" in config["parts"]:
            specs += [
                {"kind": "reference", "dataset": d, "split": k}
                for d in config["datasets"]
                for k in range(config["splits"])
            ]
        if "minibatch" in config["parts"]:
            specs.append({"kind": "reference", "dataset": "breast_cancer", "split": None})
        for spec in specs:
            spec["data_dir"] = data_dir
        return specs

    def _pilot_specs(self, config: dict[str, Any], data_dir: str | None) -> list[dict[str, Any]]:
        if "splits" not in config["parts"]:
            return []
        extras = [m for m in config["methods"] if m in protocol.EXTRA_METHODS]
        return [
            {
                "kind": "pilot",
                "dataset": d,
                "method": m,
                "lr0": protocol.BASE_LR[m] * f,
                "steps": config["steps"],
                "data_dir": data_dir,
            }
            for d in config["datasets"]
            for m in extras
            for f in protocol.PILOT_FACTORS
        ]

    def prepare(self, args: argparse.Namespace, run: Run) -> None:
        """MF-Exact of every split the jobs need (L-BFGS; well under a second each), then the pilot that
        chooses each extra row's α₀: split 0 of every data set, α₀ ∈ PILOT_FACTORS × BASE_LR, the fits'
        budget; the α₀ with the lowest training negative ELBO summed over the data sets is kept. (The
        symmetric KL to MF-Exact is recorded, but plays no part in the choice.)"""
        config = self.config(args)
        stages = (
            ("references", self._reference_specs(config, args.data_dir), _reference_key),
            ("pilot", self._pilot_specs(config, args.data_dir), _pilot_key),
        )
        for name, specs, key in stages:
            store = run.results.setdefault(name, {})
            todo = [s for s in specs if key(s) not in store]
            for spec in todo:  # the pilot's KL is against split 0's MF-Exact, computed just before
                if spec["kind"] == "pilot":
                    spec["reference"] = run.results["references"][job_key(spec["dataset"], _split_name(0))]
            for spec, result in zip(todo, run.map(todo), strict=True):
                store[key(spec)] = result
            if todo:
                run.save()

    def chosen_lr(self, config: dict[str, Any], run: Run) -> dict[str, float]:
        """The pilot's α₀ per extra method: the lowest training negative ELBO summed over the data sets."""
        totals: dict[str, dict[float, float]] = {}
        for spec in self._pilot_specs(config, None):
            by_lr = totals.setdefault(spec["method"], {})
            neg_elbo = run.results["pilot"][_pilot_key(spec)]["neg_elbo"]
            by_lr[spec["lr0"]] = by_lr.get(spec["lr0"], 0.0) + neg_elbo
        return {m: min(by_lr, key=by_lr.__getitem__) for m, by_lr in totals.items()}

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        config, refs = self.config(args), run.results["references"]
        common = {"data_dir": args.data_dir}
        out: list[Job] = []
        if "toy" in config["parts"]:
            ref = refs[job_key("toy", "fixed")]
            for name in protocol.FIGURE_METHODS:
                spec = {"kind": "toy", "method": name, "steps": config["toy_steps"], "reference": ref}
                out.append(Job(job_key("toy", name), spec | common))
        if "splits" in config["parts"]:
            chosen = self.chosen_lr(config, run)
            for dataset in config["datasets"]:
                for k in range(config["splits"]):
                    ref = refs[job_key(dataset, _split_name(k))]
                    for name in config["methods"]:
                        spec = {
                            "kind": "split",
                            "dataset": dataset,
                            "split": k,
                            "method": name,
                            "steps": config["steps"],
                            "reference": ref,
                            "lr0": chosen.get(name),
                        }
                        out.append(Job(job_key(dataset, _split_name(k), name), spec | common))
        if "minibatch" in config["parts"]:
            ref = refs[job_key("breast_cancer", "fixed")]
            runs = [("vogn", 1)] + [("vadam", m) for m in config["batch_sizes"]]
            for name, m in runs:
                for r in range(config["restarts"]):
                    spec = {
                        "kind": "minibatch",
                        "method": name,
                        "batch_size": m,
                        "run": r,
                        "steps": config["minibatch_steps"],
                        "reference": ref,
                    }
                    out.append(Job(job_key("minibatch", f"{name}-M{m}", f"run{r:02d}"), spec | common))
        return out

    # ------------------------------------------------------------------------------------------------
    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        kind = spec["kind"]
        if kind == "reference":
            return _reference(spec)
        if kind == "pilot":
            return _pilot(spec)
        reference = _posterior(spec["reference"])
        if kind == "toy":
            x, y = toy.murphy_data()
            split = protocol.Split(x, y, x, y)
            start = torch.tensor(toy.START, dtype=torch.float64)
            rec = toy.toy_recipe(spec["method"])
            q, path, seconds = protocol.fit(
                spec["method"],
                x,
                y,
                toy.PRIOR_PREC,
                rec,
                spec["steps"],
                seed=0,
                init=start,
                record_every=max(1, spec["steps"] // 200),
            )
            result = protocol.metrics(q, split, toy.PRIOR_PREC, reference)
            return result | {
                "mean": q.mean[0].tolist(),
                "variance": q.variance[0].tolist(),
                "path": path,
                "seconds": seconds,
                "steps": spec["steps"],
            }
        if kind == "split":
            data, prior, seed = DATASETS[spec["dataset"]], DATASETS[spec["dataset"]].prior_prec, spec["split"]
            split = protocol.load_split(spec["dataset"], spec["split"], spec["data_dir"])
            batch = 1 if spec["method"] == "vogn" else data.batch_size
            extra = {"lr0": spec["lr0"]} if spec["method"] in protocol.EXTRA_METHODS else {}
            rec = protocol.recipe(spec["method"], split.data_size, batch, **extra)
        elif kind == "minibatch":
            prior, seed = DATASETS["breast_cancer"].prior_prec, spec["run"]
            split = protocol.load_split("breast_cancer", None, spec["data_dir"])
            rec = protocol.recipe(spec["method"], split.data_size, spec["batch_size"])
        else:
            raise ValueError(f"unknown job kind {kind!r}")
        q, _, seconds = protocol.fit(
            spec["method"], split.x_train, split.y_train, prior, rec, spec["steps"], seed
        )
        return protocol.metrics(q, split, prior, reference) | {
            "seconds": seconds,
            "steps": spec["steps"],
            "batch_size": rec.batch_size,
        }

    def report(self, args: argparse.Namespace, run: Run) -> None:
        config = self.config(args)
        report(config, run, self.chosen_lr(config, run))


def _reference_key(spec: dict[str, Any]) -> str:
    return job_key(spec["dataset"], _split_name(spec["split"]))


def _pilot_key(spec: dict[str, Any]) -> str:
    return job_key(spec["dataset"], spec["method"], f"{spec['lr0']:g}")


def _split_name(split: int | None) -> str:
    return "fixed" if split is None else f"split{split:02d}"


def _sizes(text: str) -> list[int]:
    """A comma-separated list of minibatch sizes (positive integers)."""
    return [types.positive_int(t.strip()) for t in text.split(",") if t.strip()] or types.positive_int("")


def _posterior(stored: dict[str, Any]) -> ngvi.DiagonalGaussian:
    """A q stored as lists (MF-Exact's, in results.json) back as a DiagonalGaussian in float64."""
    t = [torch.tensor(stored[k], dtype=torch.float64) for k in ("mean", "variance")]
    return ngvi.DiagonalGaussian([t[0]], [t[1]])


def _reference(spec: dict[str, Any]) -> dict[str, Any]:
    """MF-Exact of one split, with its own metrics (KL 0) and the largest ELBO gradient it stopped at."""
    if spec["dataset"] == "toy":
        x, y = toy.murphy_data()
        split, prior = protocol.Split(x, y, x, y), toy.PRIOR_PREC
    else:
        split = protocol.load_split(spec["dataset"], spec["split"], spec["data_dir"])
        prior = DATASETS[spec["dataset"]].prior_prec
    q, seconds = protocol.mf_exact(split, prior)
    mean = q.mean[0].clone().requires_grad_(True)
    log_std = (0.5 * q.variance[0].log()).requires_grad_(True)
    elbo = protocol.exact.logistic_regression_elbo(
        mean, (2 * log_std).exp(), split.x_train, split.y_train, prior
    )
    grads = torch.autograd.grad(elbo / split.data_size, [mean, log_std])
    gradient = max(g.abs().max().item() for g in grads)
    metrics = protocol.metrics(q, split, prior, None)
    return metrics | {
        "mean": q.mean[0].tolist(),
        "variance": q.variance[0].tolist(),
        "seconds": seconds,
        "max_gradient": gradient,
        "data_size": split.data_size,
    }


def _pilot(spec: dict[str, Any]) -> dict[str, Any]:
    """One fit of the pilot: an extra method on split 0 with one α₀ (its ELBO decides; its KL is recorded)."""
    data = DATASETS[spec["dataset"]]
    split = protocol.load_split(spec["dataset"], 0, spec["data_dir"])
    reference = _posterior(spec["reference"])
    rec = protocol.extra_recipe(spec["method"], split.data_size, data.batch_size, lr0=spec["lr0"])
    q, _, seconds = protocol.fit(
        spec["method"], split.x_train, split.y_train, data.prior_prec, rec, spec["steps"], 0
    )
    return protocol.metrics(q, split, data.prior_prec, reference) | {"seconds": seconds}


EXPERIMENT = LogReg()
