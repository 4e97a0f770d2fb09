"""The small-data BNN setting of NNG §5.3 (Table 3 and 4), shared by ``ngvi hmc`` and ``ngvi active``.

One hidden layer of 10 ReLU units (the network Hernández-Lobato & Adams 2015 used for their active-learning
study, which NNG §5.3 follows), inputs and targets standardised with the statistics of the labelled points,
prior N(0, I/λ) with λ = 1 and a Gaussian likelihood with a fixed noise precision τ = 4 (noise standard
deviation 0.5 in standardised units). Every method, HMC included, targets this one posterior, so their
predictive variances are comparable. (PBP and the NNG paper put priors on τ and λ instead; see the results
README.)

Every variational method trains full-batch (20 to 30 points) with the UCI protocol's settings
(:mod:`ngvi.experiments.uci.methods`: step size 0.01, Adam-style moments (0.9, 0.99), the true Fisher for
VOGN and noisy K-FAC, BBVI starting at precision 10) for ``steps`` steps with ``TRAIN_SAMPLES`` MC samples.
Predictive variances are those of f(x) over ``PREDICT_SAMPLES`` posterior draws (the noise 1/τ adds the same
constant to every method's, which a correlation ignores).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

import ngvi

from ..core import models, training
from ..core.methods import METHODS as REGISTRY
from ..data.uci import Standardizer, load_uci_data
from ..uci.experiment import STANDARD_SETS
from ..uci.methods import METHODS as UCI_METHODS
from ..uci.methods import Setting

HIDDEN = 10
PRIOR_PREC = 1.0
NOISE_PREC = 4.0
#: the model as a run's config records it
MODEL = {"hidden": HIDDEN, "prior_prec": PRIOR_PREC, "noise_prec": NOISE_PREC}
TRAIN_SAMPLES = 4
PREDICT_SAMPLES = 200
#: NNG Table 3 and 4: the eight UCI sets (protein and year are left out)
DATASETS = STANDARD_SETS
#: NNG Table 4's methods and ours beside them, in table order; "nng_blktri" joins when this build has it
METHOD_ORDER = ("noisy_adam", "noisy_kfac", "nng_blktri", "vogn", "vadam", "ivon", "bbvi")


def available_methods() -> list[str]:
    """The methods of :data:`METHOD_ORDER` that this build of ngvi has (``METHODS[name].available()``)."""
    return [m for m in METHOD_ORDER if m in REGISTRY and REGISTRY[m].available()]


@dataclass(frozen=True)
class Budget:
    """How long each method runs: VI steps (and steps after adding one point in active learning), and
    NUTS's chains, warm-up, draws per chain and tree depth. The defaults are ``ngvi hmc``'s full run
    (docs/results/hmc/README.md says what they buy); :data:`ACTIVE_BUDGET` is ``ngvi active``'s.

    A NUTS reference counts as mixed when every prediction it is used for has split R-hat ≤ ``target_r_hat``
    and effective sample size ≥ ``target_ess``; one that has not is rerun with twice the warm-up and draws,
    up to ``doublings`` times (see :func:`nuts_reference`)."""

    steps: int = 1000
    refit_steps: int = 100
    chains: int = 4
    warmup: int = 200
    samples: int = 200
    tree_depth: int = 7
    target_r_hat: float = 1.05
    target_ess: float = 100.0
    doublings: int = 1

    @classmethod
    def quick(cls) -> Budget:
        return cls(steps=30, refit_steps=10, chains=2, warmup=10, samples=10, tree_depth=3, doublings=0)


#: NUTS runs 6 to 11 times per active-learning job, each from the last round's draws: a shorter run
ACTIVE_BUDGET = Budget(chains=2, warmup=40, samples=60, tree_depth=5, doublings=0)


def trainer_options(name: str, data_size: int) -> dict[str, Any]:
    """The UCI protocol's keywords for ``name`` at this data size (NNG-BlkTri takes noisy K-FAC's, less the
    choice of sampling: it always draws the weights)."""
    if name != "nng_blktri":
        return UCI_METHODS[name].trainer_options(Setting(data_size, PRIOR_PREC, NOISE_PREC, TRAIN_SAMPLES))
    options = trainer_options("noisy_kfac", data_size)
    options.pop("sampling")
    return options


def load(dataset: str, data_dir: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    return load_uci_data(dataset, data_dir)


def subset_indices(n_rows: int, sizes: tuple[int, ...], seed: int) -> list[np.ndarray]:
    """Disjoint random index sets of the given sizes (the last may be -1: all the remaining rows)."""
    order = np.random.default_rng(seed).permutation(n_rows)
    out, start = [], 0
    for size in sizes:
        stop = n_rows if size < 0 else start + size
        if stop > n_rows:
            raise ValueError(f"a data set of {n_rows} rows cannot give disjoint subsets of sizes {sizes}")
        out.append(order[start:stop])
        start = stop
    return out


@dataclass(frozen=True)
class Standardised:
    """Labelled points (x, y) and other inputs, in the labelled points' standardised units (float32)."""

    x: Tensor
    y: Tensor
    scaler: Standardizer

    @classmethod
    def of(cls, x: np.ndarray, y: np.ndarray) -> Standardised:
        scaler = Standardizer.fit(x, y)
        return cls(_f32(scaler.transform_x(x)), _f32(scaler.transform_y(y)).unsqueeze(1), scaler)

    def inputs(self, x: np.ndarray) -> Tensor:
        return _f32(self.scaler.transform_x(x))


def _f32(a: np.ndarray) -> Tensor:
    return torch.as_tensor(np.asarray(a), dtype=torch.float32)


def mean_nll(output: Tensor, y: Tensor) -> Tensor:
    """(τ/2)·mean((y − f)²): the mean Gaussian NLL in standardised units, constant dropped."""
    return 0.5 * NOISE_PREC * ((output - y) ** 2).mean()


def build(name: str, n_inputs: int, data_size: int, seed: int) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(seed)
    model = models.mlp(n_inputs, HIDDEN, 1)
    trainer = REGISTRY[name].build(model, data_size, seed=seed, **trainer_options(name, data_size))
    return model, trainer


def train_vi(model: torch.nn.Module, trainer: Any, data: Standardised, steps: int) -> float:
    """``steps`` full-batch steps; returns the seconds taken."""
    start = time.perf_counter()
    training.train(model, trainer, data.x, data.y, mean_nll, epochs=steps)
    return time.perf_counter() - start


def vi_predictions(model: torch.nn.Module, trainer: Any, name: str, x: Tensor, samples: int) -> Tensor:
    """f(x) under ``samples`` posterior draws: [samples, n]."""
    linearized = REGISTRY[name].linearized
    with torch.no_grad():
        return ngvi.predict(model, trainer, x, samples=samples, linearized=linearized)[..., 0]


def nuts(data: Standardised, budget: Budget, seed: int, init_from: Tensor | None = None) -> Any:
    """pyro's NUTS on the same model and posterior (:func:`ngvi.baselines.nuts.nuts_posterior`)."""
    from ngvi.baselines.nuts import nuts_posterior

    model = models.mlp(data.x.shape[1], HIDDEN, 1)
    return nuts_posterior(
        model,
        data.x,
        data.y,
        prior_prec=PRIOR_PREC,
        noise_prec=NOISE_PREC,
        num_samples=budget.samples,
        warmup=budget.warmup,
        chains=budget.chains,
        seed=seed,
        max_tree_depth=budget.tree_depth,
        init_params=init_from,
    )


def mixed(diagnostics: dict[str, float], budget: Budget) -> bool:
    """Whether a run's worst prediction meets the budget's R-hat and ESS targets."""
    return diagnostics["output_max_r_hat"] <= budget.target_r_hat and (
        diagnostics["output_min_ess"] >= budget.target_ess
    )


def nuts_reference(
    data: Standardised, x_eval: Tensor, budget: Budget, seed: int
) -> tuple[Any, dict[str, Any]]:
    """NUTS until its predictions f(x_eval) mix: a run from over-dispersed prior draws; while the worst
    prediction's split R-hat or ESS misses the budget's target, a fresh run with twice the warm-up and draws
    (at most ``budget.doublings`` times). Returns the last run and a record: the last run's diagnostics,
    ``mixed`` (whether it met the target) and every attempt's budget, diagnostics and seconds."""
    attempts: list[dict[str, Any]] = []
    for doubling in range(budget.doublings + 1):
        scale = 2**doubling
        tried = replace(budget, warmup=budget.warmup * scale, samples=budget.samples * scale)
        start = time.perf_counter()
        post = nuts(data, tried, seed)
        stats = post.output_diagnostics(x_eval)
        diagnostics = {
            "output_max_r_hat": float(stats["r_hat"].max()),
            "output_min_ess": float(stats["ess"].min()),
            "output_median_ess": float(stats["ess"].median()),
        }
        seconds = time.perf_counter() - start
        attempts.append({"warmup": tried.warmup, "samples": tried.samples, "seconds": seconds, **diagnostics})
        if mixed(diagnostics, budget):
            break
    return post, {**post.summary(), **diagnostics, "mixed": mixed(diagnostics, budget), "attempts": attempts}


def pearson(a: Tensor | np.ndarray, b: Tensor | np.ndarray) -> float:
    a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    return float(np.corrcoef(a, b)[0, 1])
