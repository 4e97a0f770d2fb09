r"""``ngvi calibration``: every posterior rule of ngvi, with its defaults, against a deep ensemble (issue 32,
item 2: "calibrated by default").

**Protocol.** On each problem of :mod:`.problems` (two regressions with a known Gaussian noise s.d. σ, two
classifications) every method trains the problem's MLP for ``--steps`` steps (default 2,000) of minibatches
of 50 from a fresh permutation each epoch, on the mean negative log-likelihood: the Gaussian NLL
mse/(2σ²) (up to a constant) or the cross-entropy. Each method is built by the registry
(:data:`..core.methods.METHODS`) with ``data_size`` = N and **nothing else** (its defaults; ``seed`` where it
takes one), except what a rule cannot default: the likelihood of the true-Fisher variant of noisy Adam. The
predictive is ``ngvi.predict`` over 64 draws (BAdam's the linearised one, its natural predictive;
MAP's its one network; the ensemble's its 5 members, exactly). The references are MAP (``baselines.MAP``,
Adam with weight decay λ/N, λ = 1) and a deep ensemble of 5 such nets from independent inits
(``baselines.DeepEnsemble``), each trained the same way. Each (problem, method, seed) is one job; ``--seeds``
seeds (default 3) draw the data, the initialisation, the minibatch order and the noise.

**Metrics** (:mod:`.measure`): test NLL, its difference to the ensemble's (paired by seed), 95% coverage
(regression), ECE (classification), accuracy or RMSE, the predictive s.d. on the probes moved away from the
data and its far/near ratio, and the CPU seconds of training (one thread) relative to MAP's on the same draw.
The criteria of the issue are stated per cell as met or missed (:func:`.measure.criteria`).

A step that raises :class:`ngvi.NonFiniteGradientError` (the default ``skip_nonfinite=False``), or a
predictive that is not finite, records the job as diverged, with the step.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

import ngvi

from ..core import args as types
from ..core import training
from ..core.methods import METHODS, RECORDED_WITHOUT_REGION
from ..core.runner import Experiment, Job, Run, job_key
from . import measure
from .problems import PROBLEMS, Problem

#: the methods, in the table's order: the references, then every posterior rule of the registry
METHOD_NAMES = (
    "map", "deep_ensemble",
    "vadam", "vprop", "von", "vadagrad", "ivon",
    "noisy_adam", "noisy_adam_pe", "noisy_adam_fisher",
    "vogn", "badam", "bbvi",
    "noisy_kfac", "nng_blktri", "nng_full",
)  # fmt: skip
REFERENCES = ("map", "deep_ensemble")
MEMBERS = 5
BATCH_SIZE = 50
DEFAULTS = {"steps": 2000, "seeds": 3, "samples": 64}
QUICK = {"steps": 40, "seeds": 1, "samples": 8}


def nng_full_limit() -> int:
    """NNGFull's default ``max_params``: beyond it the full covariance is refused (it does not apply)."""
    import inspect

    return inspect.signature(ngvi.NNGFull.__init__).parameters["max_params"].default


def applies(method: str, problem: Problem) -> bool:
    """Whether ``method`` runs on ``problem`` with its defaults (NNG-full only up to its ``max_params``)."""
    return method != "nng_full" or problem.weights() <= nng_full_limit()


def required_options(method: str, problem: Problem) -> dict[str, Any]:
    """What a rule cannot default: the likelihood its true Fisher samples targets from."""
    if method != "noisy_adam_fisher":
        return {}
    if problem.task == "classification":
        return {"likelihood": "categorical"}
    return {"likelihood": "gaussian", "noise_prec": problem.noise_std**-2}


def build(method: str, model: nn.Module, problem: Problem, seed: int) -> Any:
    """The trainer of ``method`` with its defaults (see the module docstring)."""
    options = required_options(method, problem)
    if method == "deep_ensemble":
        options |= {"members": MEMBERS, "seed": seed}
    elif method != "map":  # MAP draws no noise
        options["seed"] = seed
    if METHODS[method].trainer_class().__name__ in RECORDED_WITHOUT_REGION:
        options["kl_clip"] = "auto"  # the defaults are what this study measures
    return METHODS[method].build(model, problem.n_train, **options)


def loss_function(problem: Problem):
    """The mean NLL of a minibatch (the Gaussian one up to its constant)."""
    if problem.task == "classification":
        return nn.functional.cross_entropy
    scale = 1.0 / (2.0 * problem.noise_std**2)
    return lambda output, y: scale * (output - y).square().mean()


def predictive_samples(method: str, model: nn.Module, trainer: Any, x: Tensor, samples: int) -> Tensor:
    """[S, n, outputs]: the ensemble's members, MAP's one network, else ``samples`` draws (BAdam's
    linearised)."""
    if method == "deep_ensemble":
        samples = MEMBERS  # each member once: the ensemble's exact predictive
    elif method == "map":
        samples = 1
    return ngvi.predict(model, trainer, x, samples=samples, linearized=METHODS[method].linearized)


class Calibration(Experiment):
    name = "calibration"
    requires = ("tqdm", "matplotlib", "scipy")
    help = "every posterior rule with its defaults against a 5-member deep ensemble: NLL, coverage, ECE, s.d."
    examples = (
        "ngvi calibration --jobs 2                  # the committed docs/results/calibration (~20 CPU-min)",
        "ngvi calibration --quick --problems moons  # a smoke run",
    )
    result_fields: ClassVar[dict[str, str]] = {
        "nll": "number",
        "coverage95?": "number",
        "ece?": "number",
        "train_seconds": "seconds",
    }

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        types.add_subset(parser, "--problems", PROBLEMS)
        types.add_subset(parser, "--methods", METHOD_NAMES)
        types.add_count(parser, "--steps", None, "minibatch steps per fit (default 2000; --quick: 40)")
        types.add_count(parser, "--seeds", None, "seeds per (problem, method) (default 3; --quick: 1)")
        types.add_count(
            parser, "--samples", None, "posterior draws of the predictive (default 64; --quick: 8)"
        )
        types.add_quick(parser, "40 steps, 1 seed, 8 draws: a smoke run (options given explicitly win)")

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        values = types.with_quick(args, DEFAULTS, QUICK)
        return {
            "steps": values["steps"],
            "samples": values["samples"],
            "batch_size": BATCH_SIZE,
            "members": MEMBERS,
        }

    def seeds(self, args: argparse.Namespace) -> int:
        return types.with_quick(args, DEFAULTS, QUICK)["seeds"]

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        config = self.config(args)
        methods = list(dict.fromkeys([*REFERENCES, *args.methods]))  # the references are always needed
        jobs = [
            Job(job_key(p, m, f"seed{s}"), {"problem": p, "method": m, "seed": s, **config})
            for p in args.problems
            for m in methods
            if applies(m, PROBLEMS[p])
            for s in range(self.seeds(args))
        ]
        return sorted(jobs, key=lambda j: j.spec["method"] != "deep_ensemble")  # the longest jobs first

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        problem, method, seed = PROBLEMS[spec["problem"]], spec["method"], spec["seed"]
        draw = problem.data(seed)
        torch.manual_seed(seed)
        model = problem.net()
        trainer = build(method, model, problem, seed)
        steps_done = 0

        def count(step: int) -> None:
            nonlocal steps_done
            steps_done = step

        start = time.process_time()
        try:
            training.train_steps(
                model,
                trainer,
                draw.x_train,
                draw.y_train,
                loss_function(problem),
                steps=spec["steps"],
                batch_size=spec["batch_size"],
                generator=torch.Generator().manual_seed(seed),
                before_step=count,
            )
        except ngvi.NonFiniteGradientError as err:
            first_line = str(err).splitlines()[0][:160]
            return {
                "diverged": f"NonFiniteGradientError at step {steps_done}: {first_line}",
                "train_seconds": time.process_time() - start,
            }
        seconds = time.process_time() - start
        names = ["test", *draw.probes]
        inputs = [draw.x_test, *draw.probes.values()]
        samples = predictive_samples(method, model, trainer, torch.cat(inputs), spec["samples"])
        if not bool(torch.isfinite(samples).all()):
            return {"diverged": "non-finite predictive after training", "train_seconds": seconds}
        parts = dict(zip(names, samples.split([len(x) for x in inputs], dim=1), strict=True))
        if problem.task == "regression":
            result = measure.regression_metrics(parts["test"], draw.y_test, problem.noise_std)
        else:
            result = measure.classifier_metrics(parts["test"], draw.y_test)
        sd = {name: measure.spread(parts[name], problem.task) for name in draw.probes}
        return {**result, "sd": sd, "train_seconds": seconds, "draws": int(samples.shape[0])}

    def report(self, args: argparse.Namespace, run: Run) -> None:
        from .report import report

        report(run, args.problems, [m for m in METHOD_NAMES if m in {*REFERENCES, *args.methods}],
               self.seeds(args), self.config(args))  # fmt: skip


EXPERIMENT = Calibration()
