"""Bayesian optimisation of λ and τ by K-fold cross-validation on one training split (optuna).

As in Khan et al. 2018 (App. J.1, and the authors' code): a GP-based BO over log τ ∈ [0, 5] and
log λ ∈ [−4, 4] (natural logs; [1, 5] and [−3, 4] for naval and power), 30 evaluations of which the
first 5 are random, each the mean validation log-likelihood over 5 folds of the training part. The paper
tunes every split; on two cores we tune split 0 per data set and method and reuse the result for all
splits (the output says so).
MC dropout keeps Gal's fixed λ and tunes τ and its dropout rate over Gal's grid (``dropout_rates.txt``).

The optimiser is the harness's (:func:`ngvi.experiments.core.tuning.maximise`: resumable from its journal).
A fresh study first evaluates the optima already found for other methods on the same data set (clipped to
the search space): they fit the same model, so their λ, τ are strong first guesses and a small budget then
refines them rather than searching from scratch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..core.tuning import Choice, LogUniform, Space, maximise
from ..data import uci_info
from .methods import UCIMethod

STARTUP_TRIALS = 5


def search_space(dataset: str, method: UCIMethod, data_dir: str | None = None) -> Space:
    """log τ and log λ (natural logs), or τ and Gal's dropout rates for MC dropout (λ fixed)."""
    wide = dataset not in ("naval-propulsion-plant", "power-plant")
    space: Space = {"noise_prec": LogUniform(0.0, 5.0) if wide else LogUniform(1.0, 5.0)}
    if "prior_prec" not in method.fixed:
        space["prior_prec"] = LogUniform(-4.0, 4.0) if wide else LogUniform(-3.0, 4.0)
    if method.tunes_dropout:
        space["dropout"] = Choice(tuple(sorted(uci_info(dataset, data_dir).dropout_rates)))
    return space


def tune(
    method: UCIMethod,
    dataset: str,
    cv_loglik: Callable[[dict[str, float]], float],
    trials: int,
    journal: str | Path,
    objective_id: str,
    seed: int = 0,
    parallel: int = 1,
    data_dir: str | None = None,
    starts: Sequence[dict[str, float]] = (),
) -> dict[str, Any]:
    """Maximise ``cv_loglik(hyperparameters)``; returns λ, τ (and the dropout rate), ``cv_loglik`` and the
    budget used. ``objective_id`` names the objective (folds, epochs)."""
    best = maximise(
        cv_loglik,
        search_space(dataset, method, data_dir),
        trials,
        journal,
        f"{dataset}/{method.name}/{objective_id}",
        seed=seed,
        parallel=parallel,
        startup_trials=STARTUP_TRIALS,
        starts=starts,
        fixed=method.fixed,
    )
    best["cv_loglik"] = best.pop("value")
    return best
