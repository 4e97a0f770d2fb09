"""Bayesian optimisation of an experiment's hyperparameters (optuna's GP sampler), resumable.

Trials go to an optuna journal file in the results folder, so a killed tuning run resumes. A study is named
after what it optimises (the data set, method and objective), so a resumed study continues only trials of
the same objective, and a larger trial budget extends it. A fresh study first evaluates ``starts``: good
guesses, such as the optima already found for other methods of the same model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LogUniform:
    """A positive hyperparameter searched as its natural log in [low, high] (optuna name ``log_<name>``)."""

    low: float
    high: float


@dataclass(frozen=True)
class Choice:
    """A hyperparameter taken from a list of values."""

    values: tuple[Any, ...]


Space = dict[str, LogUniform | Choice]


def maximise(
    objective: Callable[[dict[str, Any]], float],
    space: Space,
    trials: int,
    journal: Path,
    study_name: str,
    *,
    seed: int = 0,
    startup_trials: int = 5,
    starts: Sequence[dict[str, Any]] = (),
    fixed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Maximise ``objective(hyperparameters)`` over ``space`` (plus the ``fixed`` values) in ``trials``
    evaluations in all (the first ``startup_trials`` random); returns the best hyperparameters with
    ``value``, ``trials``, ``tuning_seconds`` and, if any, ``diverged_trials``.

    An objective that raises FloatingPointError (a diverged fit) or returns a non-finite value is scored
    as the worst value seen so far: a failed trial would teach the GP nothing, and it would propose the
    same point again."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    study = optuna.create_study(
        study_name=study_name,
        storage=storage,
        sampler=optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup_trials),
        direction="maximize",
        load_if_exists=True,
    )
    if not study.trials:
        for hp in starts:
            study.enqueue_trial(_to_params(hp, space))

    def hyperparameters(params: dict[str, Any]) -> dict[str, Any]:
        hp = dict(fixed or {})
        for name, dim in space.items():
            hp[name] = math.exp(params[f"log_{name}"]) if isinstance(dim, LogUniform) else params[name]
        return hp

    def run(trial: optuna.Trial) -> float:
        params = {}
        for name, dim in space.items():
            if isinstance(dim, LogUniform):
                params[f"log_{name}"] = trial.suggest_float(f"log_{name}", dim.low, dim.high)
            else:
                params[name] = trial.suggest_categorical(name, list(dim.values))
        try:
            value = objective(hyperparameters(params))
        except FloatingPointError:  # ngvi.NonFiniteGradientError: this fit diverged
            value = float("nan")
        if math.isfinite(value):
            return value
        trial.set_user_attr("diverged", True)
        seen = [t.value for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        return min(seen) if seen else float("nan")

    start = time.perf_counter()
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    if done < trials:
        study.optimize(run, n_trials=trials - done)
    best = study.best_trial
    out = {**hyperparameters(best.params), "value": best.value, "trials": trials}
    out["tuning_seconds"] = time.perf_counter() - start
    diverged = sum(bool(t.user_attrs.get("diverged")) for t in study.trials)
    if diverged:
        out["diverged_trials"] = diverged
    return out


def _to_params(hp: dict[str, Any], space: Space) -> dict[str, Any]:
    """optuna parameters of a known point, clipped to the space (dimensions it lacks are left to sample)."""
    params = {}
    for name, dim in space.items():
        if name not in hp:
            continue
        if isinstance(dim, LogUniform):
            params[f"log_{name}"] = min(max(math.log(hp[name]), dim.low), dim.high)
        elif hp[name] in dim.values:
            params[name] = hp[name]
    return params
