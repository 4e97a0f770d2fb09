"""``ngvi continual``: permuted and split MNIST with the posterior as the next prior (VCL's protocol).

Each task t is trained under the prior that task t − 1 left behind (``opt.set_prior``,
:mod:`ngvi.optim.engine.posterior_prior`), starting from it (``init_prec=None``: q₀ is the prior, so the
means and the variances start where the last task ended), as variational continual learning does
(Nguyen et al. 2018). After each task the test accuracy on every task seen so far is recorded; the table
and figure give their average, mean ± s.e. over seeds.

* **permuted MNIST**: 10 tasks, each a fixed random permutation of the 784 pixels; one shared 10-way head;
  MLP 784-100-100-10 (ReLU). Coreset: 200 random training points per task.
* **split MNIST**: 5 binary tasks (0/1, 2/3, 4/5, 6/7, 8/9); multi-head (task t reads outputs 2t, 2t+1 of
  the last layer, so each task has its own head weights); MLP 784-256-256-(5×2). Coreset: 40 per task.

Arms: ``adam`` (fine-tuned task after task: the forgetting baseline), ``ewc`` (Adam plus Kirkpatrick et al.'s
penalty (λ/2) Σₖ Fₖ⊙(θ − θₖ)² with a diagonal Fisher Fₖ from labels sampled from the model, our own
implementation), and ``vadam``, ``vogn``, ``ivon`` with the posterior as the next prior; ``+coreset`` arms
keep a random coreset out of each task's training data and, before predicting, fine-tune a copy of the
posterior on all the coresets so far under that posterior as prior (VCL's coreset: the fine-tuned copy
predicts, the propagated posterior is the one without it). Predictions of the Bayesian arms average the
softmax over ``--test-samples`` posterior draws.

Deviations from VCL's protocol (also in the results README): far fewer epochs than VCL's 100 (permuted) and
120 (split) and, by default, a subset of each task's training images, so that the whole run fits two cores
in an hour; minibatches of 256 for split MNIST too (VCL used full batches); the first task's prior is
N(0, I) for every rule (VCL's), the rules' own step sizes (not tuned for this protocol); noisy K-FAC is not
an arm (a Kronecker posterior cannot yet be a prior: set_prior covers the diagonal rules and NNG-full).
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

import ngvi

from .core import args as types
from .core.report import figure, fmt_mean_se, markdown_table, mean_se, save_figure
from .core.runner import Experiment, Job, Run

#: each benchmark's tasks, network and coreset size per task (VCL §5.1)
BENCHMARKS: dict[str, dict[str, Any]] = {
    "permuted": {"tasks": 10, "hidden": (100, 100), "outputs": 10, "coreset": 200},
    "split": {"tasks": 5, "hidden": (256, 256), "outputs": 10, "coreset": 40},
}
ARMS = ("adam", "ewc", "vadam", "vogn", "ivon")
BAYESIAN = ("vadam", "vogn", "ivon")
LABELS = {"adam": "Adam (fine-tuned)", "ewc": "EWC", "vadam": "Vadam", "vogn": "VOGN", "ivon": "IVON"}
#: the first task's prior precision (N(0, I), VCL's) and each arm's settings. The Bayesian rules' were
#: picked from a handful of trials on the first 3 tasks of permuted MNIST (seed 0, 20,000 images, 5 epochs;
#: the results README lists them): what matters is that the curvature EMA forgets its start within a task
#: (Vadam's and IVON's β₂ = 0.99, VOGN's β = 0.01), else the start's precision is passed on as if it were
#: the data's and the next task cannot move. EWC's λ is not tuned.
PRIOR_PREC = 1.0
EWC_LAMBDA = 100.0
FISHER_SAMPLES = 600
OPTIONS: dict[str, dict[str, Any]] = {
    "adam": {"lr": 1e-3},
    "ewc": {"lr": 1e-3},
    "vadam": {"lr": 3e-3, "betas": (0.9, 0.99)},
    "vogn": {"lr": 1e-2, "beta": 1e-2, "momentum": 0.9, "kl_clip": None},
    "ivon": {"lr": 0.5, "betas": (0.9, 0.99), "hess_init": 0.1, "clip_radius": 1e-2, "kl_clip": None},
}
#: task t > 1 starts at its prior, the last posterior (as VCL does), not at the rule's own start
START_AT_PRIOR = {"vadam": True, "vogn": True, "ivon": True}
#: the options --quick sets (when not given) and their defaults (train_size/test_size None: all images)
DEFAULTS = {"epochs": 5, "train_size": 20000, "test_size": 2000, "tasks": None, "test_samples": 10}
QUICK = {"epochs": 1, "train_size": 300, "test_size": 200, "tasks": 2, "test_samples": 2}
#: published average accuracies [%] after all tasks, as given in issue 45 (see the module docstring of
#: the results README for where each comes from)
PUBLISHED = {
    "permuted": {
        "VCL": 90.0,
        "VCL + coreset": 93.0,
        "EWC": 84.0,
        "SI": 86.0,
        "FROMP": 94.9,
    },
    "split": {"VCL": 97.0, "VCL + coreset": 98.4, "EWC": 63.1, "SI": 98.9, "FROMP": 99.3},
}


# ------------------------------------------------------------------------------------------------------------
# the tasks
# ------------------------------------------------------------------------------------------------------------
def make_tasks(
    benchmark: str, data_dir: Any, seed: int, tasks: int, train_size: int | None, test_size: int | None
) -> list[dict[str, torch.Tensor]]:
    """Each task's training and test images, labels and head columns. Permutations (permuted MNIST) and
    subsets are drawn from ``seed``."""
    from .data.mnist import load_mnist

    x, y = load_mnist("train", data_dir, flatten=True, normalize="unit")
    x_test, y_test = load_mnist("test", data_dir, flatten=True, normalize="unit")
    gen = torch.Generator().manual_seed(10_000 + seed)
    out = []
    for t in range(tasks):
        if benchmark == "permuted":
            perm = torch.randperm(784, generator=gen)
            xs, ys, xt, yt = x[:, perm], y, x_test[:, perm], y_test
            head = list(range(10))
        else:
            pair = (2 * t, 2 * t + 1)
            keep, keep_test = (y == pair[0]) | (y == pair[1]), (y_test == pair[0]) | (y_test == pair[1])
            xs, ys, xt, yt = x[keep], y[keep] - pair[0], x_test[keep_test], y_test[keep_test] - pair[0]
            head = list(pair)
        if train_size is not None and train_size < len(xs):
            pick = torch.randperm(len(xs), generator=gen)[:train_size]
            xs, ys = xs[pick], ys[pick]
        if test_size is not None and test_size < len(xt):
            xt, yt = xt[:test_size], yt[:test_size]
        out.append({"x": xs, "y": ys, "x_test": xt, "y_test": yt, "head": torch.tensor(head)})
    return out


def network(benchmark: str) -> nn.Sequential:
    spec = BENCHMARKS[benchmark]
    layers: list[nn.Module] = []
    width = 784
    for h in spec["hidden"]:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, spec["outputs"]))


# ------------------------------------------------------------------------------------------------------------
# training
# ------------------------------------------------------------------------------------------------------------
def _batches(n: int, batch_size: int, gen: torch.Generator) -> list[torch.Tensor]:
    return list(torch.randperm(n, generator=gen).split(batch_size))


def _bayesian(arm: str, model: nn.Module, n: int, seed: int, prior: Any) -> Any:
    """The arm's optimizer over ``model`` for a task of ``n`` examples, under ``prior`` (None: N(0, I))."""
    options = dict(OPTIONS[arm])
    if prior is not None and START_AT_PRIOR[arm]:  # q₀ is the prior: the last task's posterior
        options.update({"hess_init": 1e-3} if arm == "ivon" else {"init_prec": None})
    if arm == "vadam":
        opt = ngvi.Vadam(model.parameters(), n, prior_prec=PRIOR_PREC, seed=seed, **options)
    elif arm == "vogn":
        opt = ngvi.VOGN(model, n, prior_prec=PRIOR_PREC, seed=seed, **options)
    else:
        opt = ngvi.IVON(model.parameters(), n, prior_prec=PRIOR_PREC, seed=seed, **options)
    if prior is not None:
        opt.set_prior(prior)
    return opt


def _fit(model, opt, x, y, head, epochs: int, batch_size: int, gen, penalty=None) -> None:
    backward = getattr(opt, "backward", None)
    for _ in range(epochs):
        model.train()
        for idx in _batches(len(x), batch_size, gen):
            xb, yb = x[idx], y[idx]

            def closure(xb=xb, yb=yb):
                opt.zero_grad()
                out = model(xb)[:, head]
                loss = F.cross_entropy(out, yb)
                total = loss if penalty is None else loss + penalty()
                if backward is None:
                    total.backward()
                else:
                    backward(total, out)
                return loss

            opt.step(closure)


@torch.no_grad()
def _accuracy(model: nn.Module, opt: Any, task: dict[str, torch.Tensor], samples: int) -> float:
    model.eval()
    x, y, head = task["x_test"], task["y_test"], task["head"]
    if opt is None:
        probs = model(x)[:, head].softmax(-1)
    else:
        probs = torch.zeros(len(x), len(head))
        for _ in range(samples):
            with opt.sampled_params():
                probs += model(x)[:, head].softmax(-1)
    return float((probs.argmax(1) == y).double().mean())


class _EWC:
    """Σₖ (λ/2) Fₖ⊙(θ − θₖ)², kept as Σ Fₖ and Σ Fₖθₖ (one pass per step, whatever the number of tasks)."""

    def __init__(self, model: nn.Module, lam: float):
        self.params = list(model.parameters())
        self.lam = lam
        self.fisher = [torch.zeros_like(p) for p in self.params]
        self.anchor = [torch.zeros_like(p) for p in self.params]  # Σ Fₖθₖ

    def __call__(self) -> torch.Tensor:
        total = sum(
            (f * p * p - 2 * a * p).sum()
            for f, a, p in zip(self.fisher, self.anchor, self.params, strict=True)
        )
        return 0.5 * self.lam * total

    @torch.no_grad()
    def add_task(self, model: nn.Module, task: dict[str, torch.Tensor], gen: torch.Generator) -> None:
        """Fₖ: the mean over ``FISHER_SAMPLES`` training points of the squared gradient of log p(ŷ|x, θ)
        with ŷ sampled from the model (the true Fisher's diagonal), by per-example gradients."""
        from torch.func import functional_call, grad, vmap

        pick = torch.randperm(len(task["x"]), generator=gen)[:FISHER_SAMPLES]
        x, head = task["x"][pick], task["head"]
        names = [n for n, _ in model.named_parameters()]
        values = {n: p.detach() for n, p in model.named_parameters()}
        probs = model(x)[:, head].softmax(-1)
        labels = torch.multinomial(probs, 1, generator=gen)[:, 0]

        def nll(params, xi, yi):
            out = functional_call(model, params, (xi[None],))[:, head]
            return F.cross_entropy(out, yi[None])

        with torch.enable_grad():
            grads = vmap(grad(nll), in_dims=(None, 0, 0))(values, x, labels)
        for i, n in enumerate(names):
            f = grads[n].square().mean(0)
            self.fisher[i] += f
            self.anchor[i] += f * self.params[i].detach()


def run_arm(spec: dict[str, Any]) -> dict[str, Any]:
    """One (benchmark, arm, coreset, seed): accuracy on every seen task after each task."""
    benchmark, arm, seed = spec["benchmark"], spec["arm"], spec["seed"]
    tasks = make_tasks(
        benchmark, spec["data_dir"], seed, spec["tasks"], spec["train_size"], spec["test_size"]
    )
    torch.manual_seed(seed)
    model = network(benchmark)
    gen = torch.Generator().manual_seed(seed)
    ewc = _EWC(model, EWC_LAMBDA) if arm == "ewc" else None
    coreset_size = BENCHMARKS[benchmark]["coreset"] if spec["coreset"] else 0
    coresets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    prior, accuracy = None, []
    start = time.perf_counter()
    for t, task in enumerate(tasks):
        x, y = task["x"], task["y"]
        if coreset_size:
            order = torch.randperm(len(x), generator=gen)
            core, rest = order[:coreset_size], order[coreset_size:]
            coresets.append((x[core], y[core], task["head"]))
            x, y = x[rest], y[rest]
        if arm in BAYESIAN:
            opt = _bayesian(arm, model, len(x), seed + 1000 * t, prior)
        else:
            opt = torch.optim.Adam(model.parameters(), **OPTIONS[arm])
        penalty = ewc if ewc is not None and t > 0 else None
        _fit(model, opt, x, y, task["head"], spec["epochs"], spec["batch_size"], gen, penalty)
        if ewc is not None:
            ewc.add_task(model, task, gen)
        if arm not in BAYESIAN:
            accuracy.append([_accuracy(model, None, s, 1) for s in tasks[: t + 1]])
            continue
        prior = opt.posterior()
        predictor, predictor_opt = model, opt
        if coresets:  # fine-tune a copy on all the coresets so far, under q̃_t as the prior
            predictor = copy.deepcopy(model)
            n_core = sum(len(c[0]) for c in coresets)
            predictor_opt = _bayesian(arm, predictor, n_core, seed + 1000 * t + 500, prior)
            for _ in range(spec["epochs"]):
                for cx, cy, head in coresets:
                    _fit(predictor, predictor_opt, cx, cy, head, 1, spec["batch_size"], gen)
        accuracy.append(
            [_accuracy(predictor, predictor_opt, s, spec["test_samples"]) for s in tasks[: t + 1]]
        )
    return {
        "accuracy": accuracy,
        "average": [float(np.mean(a)) for a in accuracy],
        "seconds": time.perf_counter() - start,
    }


# ------------------------------------------------------------------------------------------------------------
# the command
# ------------------------------------------------------------------------------------------------------------
def arm_names(arms: Sequence[str], coreset: Sequence[str]) -> list[tuple[str, bool]]:
    """(arm, with coreset) pairs: the Bayesian arms with and without a coreset as ``coreset`` says."""
    out = []
    for arm in arms:
        for c in coreset:
            if c == "with" and arm not in BAYESIAN:
                continue
            out.append((arm, c == "with"))
    return out


def _arm_key(arm: str, coreset: bool) -> str:
    return f"{arm}+coreset" if coreset else arm


class Continual(Experiment):
    name = "continual"
    help = "permuted and split MNIST, the posterior as the next prior (VCL's protocol), beside Adam and EWC"
    examples = (
        "ngvi continual --quick --arms adam,vadam   # a smoke run in seconds",
        "ngvi continual --jobs 2                    # the committed run (under an hour on two cores)",
    )
    result_fields: ClassVar[dict[str, str]] = {"average": "numbers", "seconds": "seconds"}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        types.add_subset(parser, "--benchmarks", BENCHMARKS)
        types.add_subset(parser, "--arms", ARMS)
        parser.add_argument(
            "--coreset",
            type=types.names(["with", "without"]),
            default=["without", "with"],
            help="comma-separated: without, with (a random coreset for the Bayesian arms; default: both)",
        )
        types.add_count(parser, "--seeds", 3, "runs per arm (default 3)")
        types.add_count(parser, "--epochs", None, "epochs per task (default 5; --quick: 1)")
        types.add_count(parser, "--tasks", None, "the first K tasks only (default: all; --quick: 2)")
        types.add_count(
            parser, "--train-size", None, "training images per task (default 20000; --quick: 300)"
        )
        types.add_count(parser, "--test-size", None, "test images per task (default 2000; --quick: 200)")
        types.add_count(parser, "--test-samples", None, "posterior draws per prediction (default 10)")
        parser.add_argument("--batch-size", type=types.positive_int, default=256)
        types.add_quick(parser, "a smoke run: 2 tasks of 300 images, 1 epoch (options given explicitly win)")
        types.add_data_dir(parser, "data folder holding mnist/")

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        sizes = types.with_quick(args, DEFAULTS, QUICK)
        return {**sizes, "batch_size": args.batch_size, "options": OPTIONS, "ewc_lambda": EWC_LAMBDA}

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        from .data.mnist import load_mnist

        load_mnist("test", args.data_dir)  # a missing data folder fails here, before any worker starts
        config = self.config(args)
        out = []
        for bench in args.benchmarks:
            tasks = min(config["tasks"] or BENCHMARKS[bench]["tasks"], BENCHMARKS[bench]["tasks"])
            for arm, coreset in arm_names(args.arms, args.coreset):
                for s in range(args.seeds):
                    spec = {**config, "benchmark": bench, "arm": arm, "coreset": coreset, "seed": s}
                    spec.update(tasks=tasks, data_dir=args.data_dir)
                    out.append(Job(f"{bench}/{_arm_key(arm, coreset)}/seed{s}", spec))
        return out

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        return run_arm(spec)

    def report(self, args: argparse.Namespace, run: Run) -> None:
        runs = run.results["runs"]
        config = run.results["config"]
        done: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for bench in args.benchmarks:
            for arm, coreset in arm_names(args.arms, args.coreset):
                key = _arm_key(arm, coreset)
                found = [runs[k] for s in range(args.seeds) if (k := f"{bench}/{key}/seed{s}") in runs]
                if found:
                    done.setdefault(bench, {})[key] = found
        (run.out / "table.md").write_text(table(done, config, args.seeds))
        plot(done, run.out / "continual.png")
        print((run.out / "table.md").read_text())
        print(f"wrote {run.out / 'continual.png'}, {run.out / 'table.md'} and {run.out / 'results.json'}")


def _label(key: str) -> str:
    arm, _, coreset = key.partition("+")
    return LABELS[arm] + (" + coreset" if coreset else "")


def table(done: dict[str, dict[str, list[dict[str, Any]]]], config: dict[str, Any], seeds: int) -> str:
    lines = [
        "# ngvi continual: average test accuracy [%] over the tasks seen\n",
        f"{config['epochs']} epoch(s) per task, {config['train_size'] or 'all'} training and "
        f"{config['test_size'] or 'all'} test images per task, minibatches of {config['batch_size']}, "
        f"{config['test_samples']} posterior draws per prediction; mean ± s.e. over up to {seeds} seed(s). "
        "See the module docstring of ngvi.experiments.continual for the protocol and its deviations from "
        "VCL's.\n",
    ]
    for bench, arms in done.items():
        n_tasks = len(next(iter(arms.values()))[0]["average"])
        header = ["arm", *(f"after {t + 1}" for t in range(n_tasks)), "seeds", "time/run [s]"]
        rows = []
        for key, results in arms.items():
            cells = [
                fmt_mean_se(*mean_se(100 * r["average"][t] for r in results)[:2]) for t in range(n_tasks)
            ]
            rows.append(
                [_label(key), *cells, len(results), f"{np.mean([r['seconds'] for r in results]):.0f}"]
            )
        lines.append(f"\n## {bench} MNIST ({n_tasks} tasks)\n")
        lines.append(markdown_table(header, rows))
        published = ", ".join(f"{k} {v:g}" for k, v in PUBLISHED[bench].items())
        lines.append(
            f"\nPublished after all {BENCHMARKS[bench]['tasks']} tasks (full protocol): {published}.\n"
        )
    return "\n".join(lines)


def plot(done: dict[str, dict[str, list[dict[str, Any]]]], path) -> None:
    fig, axes = figure(max(1, len(done)), cols=2, size=(4.6, 3.4))
    for ax, (bench, arms) in zip(axes, done.items(), strict=False):
        for key, results in arms.items():
            avg = 100 * np.array([r["average"] for r in results])
            ts = np.arange(1, avg.shape[1] + 1)
            style = "--" if key.endswith("coreset") else "-"
            color = f"C{ARMS.index(key.partition('+')[0])}"  # one colour per arm, dashed with a coreset
            ax.plot(ts, avg.mean(0), style, color=color, marker="o", ms=3, label=_label(key))
            if len(results) > 1:
                se = avg.std(0, ddof=1) / np.sqrt(len(results))
                ax.fill_between(ts, avg.mean(0) - se, avg.mean(0) + se, color=color, alpha=0.15, lw=0)
            ax.set_xticks(ts)
        for name, value in PUBLISHED[bench].items():
            if name.startswith("VCL"):
                ax.axhline(value, color="0.6", lw=0.8, ls=":" if "coreset" in name else "-.")
        title = f"{bench} MNIST; dashed: with coreset\n(grey: VCL published, dotted its coreset run)"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("tasks seen", fontsize=8)
        ax.set_ylabel("average test accuracy [%]", fontsize=8)
        ax.tick_params(labelsize=7)
    save_figure(fig, path, legend_from=axes[0], dpi=120)


EXPERIMENT = Continual()
