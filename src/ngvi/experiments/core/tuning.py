"""Bayesian optimisation of an experiment's hyperparameters (optuna's GP sampler), resumable.

Trials go to an optuna journal file in the results folder, so a killed tuning run resumes. A study is named
after what it optimises (the data set, method and objective), so a resumed study continues only trials of
the same objective, and a larger trial budget extends it. A fresh study first evaluates ``starts``: good
guesses, such as the optima already found for other methods of the same model.

Trials in parallel (``--tune-parallel N``): N trials of one study are in flight at once, each evaluating its
objective on the run's backend (its folds are jobs there, so on Ray they spread over the cluster's workers).
The study's storage (``--tune-storage``: a journal file, or a database URL such as ``sqlite:///tune.db``
or ``postgresql://...``) is what every process that joins the study must reach: on a cluster, a journal on a
shared filesystem or a database server.

Reproducibility: the jobs are seeded from their specs, and the sampler from ``seed``; with trials one after
another (the default) a tuned run is reproducible bitwise, on either backend. With parallel trials the
sampler proposes each trial from the trials completed *so far*, which depends on the order in which the
running ones finish: the trials, and so the tuned values, can differ from run to run (and the study may end
a few trials over the budget, the ones still running when it was reached). The tuned values are kept (the
experiment's ``tuned.json``), so the fits that use them stay reproducible.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .args import int_range


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


def add_tuning_arguments(parser: argparse.ArgumentParser) -> None:
    """``--tune-storage`` and ``--tune-parallel``, for an experiment that tunes with :func:`maximise`."""
    parser.add_argument(
        "--tune-storage",
        default=None,
        help="the optuna study's storage: a journal file, or a database URL (sqlite:///x.db, "
        "postgresql://...); on a cluster, one that every process reaches (default: a journal in --out)",
    )
    parser.add_argument(
        "--tune-parallel",
        type=int_range(1, 1024),
        default=1,
        help="trials in flight at once, each on the backend's workers (default 1: reproducible; more: "
        "faster, but the trials depend on the order they finish in, see docs/PROTOCOLS.md)",
    )


def storage(where: str | Path) -> Any:
    """An optuna storage: a database URL (``scheme://...``), or else a journal file at that path."""
    import optuna

    if "://" in str(where):
        return optuna.storages.RDBStorage(str(where))
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(where)))


def maximise(
    objective: Callable[[dict[str, Any]], float],
    space: Space,
    trials: int,
    journal: str | Path,
    study_name: str,
    *,
    parallel: int = 1,
    seed: int = 0,
    startup_trials: int = 5,
    starts: Sequence[dict[str, Any]] = (),
    fixed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Maximise ``objective(hyperparameters)`` over ``space`` (plus the ``fixed`` values) in ``trials``
    evaluations in all (the first ``startup_trials`` random); returns the best hyperparameters with
    ``value``, ``trials``, ``tuning_seconds`` and, if any, ``diverged_trials``. ``journal`` is the study's
    storage (see :func:`storage`); ``parallel`` trials are evaluated at once (threads of this process).

    An objective that raises FloatingPointError (a diverged fit) or returns a non-finite value is scored
    as the worst value seen so far: a failed trial would teach the GP nothing, and it would propose the
    same point again."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=study_name,
        storage=storage(journal),
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
        # other processes may share the study: stop once it holds `trials` completed trials in all
        stop = optuna.study.MaxTrialsCallback(trials, states=(optuna.trial.TrialState.COMPLETE,))
        study.optimize(run, n_trials=trials - done, n_jobs=parallel, callbacks=[stop])
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
