"""Bayesian optimisation of λ and τ by K-fold cross-validation on one training split (optuna).

As in Khan et al. 2018 (App. J.1, and the authors' code): a GP-based BO over log τ ∈ [0, 5] and
log λ ∈ [−4, 4] (natural logs; [1, 5] and [−3, 4] for naval and power), 30 evaluations of which the
first 5 are random, each the mean validation log-likelihood over 5 folds of the training part. The paper
tunes every split; on two cores we tune split 0 per data set and method and reuse the result for all
splits (the output says so).
MC dropout keeps Gal's fixed λ and tunes τ and its dropout rate over Gal's grid (``dropout_rates.txt``).

Trials are logged to an optuna journal file in the results folder, so a killed tuning run resumes.
A fresh study first evaluates ``starts``, the optima already found for other methods on the same data set
(clipped to the search space): they fit the same model, so their λ, τ are strong first guesses and a small
budget then refines them rather than searching from scratch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna

from ngvi.experiments.data import uci_info

from .methods import UCIMethod

STARTUP_TRIALS = 5


def search_space(dataset: str) -> dict[str, tuple[float, float]]:
    if dataset in ("naval-propulsion-plant", "power-plant"):
        return {"log_noise_prec": (1.0, 5.0), "log_prior_prec": (-3.0, 4.0)}
    return {"log_noise_prec": (0.0, 5.0), "log_prior_prec": (-4.0, 4.0)}


def tune(
    method: UCIMethod,
    dataset: str,
    cv_loglik: Callable[[dict[str, float]], float],
    trials: int,
    journal: Path,
    objective_id: str,
    seed: int = 0,
    data_dir: str | None = None,
    starts: Sequence[dict[str, float]] = (),
) -> dict[str, Any]:
    """Maximise ``cv_loglik(hyperparameters)``; returns the best hyperparameters and the budget used.

    ``objective_id`` names the objective (folds, epochs): a resumed study continues only trials of the same
    objective, and a larger trial budget extends it."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    sampler = optuna.samplers.GPSampler(seed=seed, n_startup_trials=STARTUP_TRIALS)
    study = optuna.create_study(
        study_name=f"{dataset}/{method.name}/{objective_id}",
        storage=storage,
        sampler=sampler,
        direction="maximize",
        load_if_exists=True,
    )
    space = search_space(dataset)
    if not study.trials:
        for hp in starts:
            params = {
                "log_noise_prec": math.log(hp["noise_prec"]),
                "log_prior_prec": math.log(hp["prior_prec"]),
            }
            study.enqueue_trial({k: min(max(v, space[k][0]), space[k][1]) for k, v in params.items()})
    rates = sorted(uci_info(dataset, data_dir).dropout_rates) if method.tunes_dropout else []

    def objective(trial: optuna.Trial) -> float:
        hp = {"noise_prec": math.exp(trial.suggest_float("log_noise_prec", *space["log_noise_prec"]))}
        if "prior_prec" in method.fixed:
            hp["prior_prec"] = method.fixed["prior_prec"]
        else:
            hp["prior_prec"] = math.exp(trial.suggest_float("log_prior_prec", *space["log_prior_prec"]))
        if rates:
            hp["dropout"] = trial.suggest_categorical("dropout", rates)
        try:
            value = cv_loglik(hp)
        except FloatingPointError:  # a fit diverged (ngvi.NonFiniteGradientError)
            value = float("nan")
        if math.isfinite(value):
            return value
        # A failed trial teaches the GP nothing, so it proposes the same point again: score a divergence as
        # the worst value seen so far instead (NaN, i.e. failed, while there is none yet).
        trial.set_user_attr("diverged", True)
        seen = [t.value for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        return min(seen) if seen else float("nan")

    start = time.perf_counter()
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    if done < trials:
        study.optimize(objective, n_trials=trials - done)
    best = study.best_trial
    out = {
        "noise_prec": math.exp(best.params["log_noise_prec"]),
        "prior_prec": method.fixed.get("prior_prec") or math.exp(best.params["log_prior_prec"]),
        "cv_loglik": best.value,
        "trials": trials,
        "tuning_seconds": time.perf_counter() - start,
    }
    if rates:
        out["dropout"] = best.params["dropout"]
    diverged = sum(bool(t.user_attrs.get("diverged")) for t in study.trials)
    if diverged:
        out["diverged_trials"] = diverged
    return out
