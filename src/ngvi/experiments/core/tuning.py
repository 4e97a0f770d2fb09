"""Bayesian optimisation of an experiment's hyperparameters (optuna's GP sampler), resumable.

Trials go to an optuna journal file in the results folder, so a killed tuning run resumes. A study is keyed
by everything its result depends on (:func:`study_config`): the caller's name and objective (e.g. the data
set, method, data split, folds, epochs and the jobs' seed), the search box, the fixed values, the trial
budget, the sampler's seed and startup trials, the warm starts, and :data:`PROTOCOL`. Its name is the
caller's name plus a digest of that config, and the config itself is kept in the study's user attributes and
compared on resume: a study resumes only where the config matches exactly, and anything else gets a study of
its own (a study under the same name whose recorded config differs is refused). So two runs with other seeds
or other budgets may share one ``--tune-storage`` without taking each other's trials. A larger budget starts
a new study rather than extending the old one: a study extended by a resumed sampler is not the one a single
run with that budget makes, and the tuned values must not depend on the history of earlier commands. A
fresh study first evaluates ``starts``: good guesses, such as the optima already found for other methods of
the same model.

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
import hashlib
import json
import math
import re
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

#: the version of how a study is made and scored (the trial parameters, the divergence rule, the config
#: below); bumped when that changes, so that no study of an older protocol is resumed
PROTOCOL = 2
#: the study's user attribute that holds its config
CONFIG_ATTR = "ngvi_config"


def add_tuning_arguments(parser: argparse.ArgumentParser) -> None:
    """``--tune-storage`` and ``--tune-parallel``, for an experiment that tunes with :func:`maximise`."""
    parser.add_argument(
        "--tune-storage",
        type=_storage_argument,
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


def shown(where: str | Path) -> str:
    """``where`` as an error message may print it: a database URL's password masked."""
    return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", str(where))


def check_storage(where: str | Path) -> str:
    """``where`` if a study can be stored there, else a ValueError in one line that says why and what to do:
    a database URL of a kind SQLAlchemy knows, whose driver is installed (an sqlite file in a folder that
    exists), or a journal file path in a folder that exists. Nothing is created or connected to."""
    text = str(where)
    if "://" not in text:
        return _check_file(text, "a journal file")
    from sqlalchemy import exc
    from sqlalchemy.engine import make_url

    try:
        url = make_url(text)
        dialect = url.get_dialect()
    except exc.NoSuchModuleError:
        kind = text.partition("://")[0]
        raise ValueError(
            f"{shown(text)}: unknown database kind {kind!r}; give a journal file path, or a database URL "
            "such as sqlite:///path/study.db or postgresql://user@host/db"
        ) from None
    except exc.ArgumentError:
        raise ValueError(
            f"{shown(text)}: not a database URL; give a journal file path, or a URL such as "
            "sqlite:///path/study.db or postgresql://user@host/db"
        ) from None
    try:
        dialect.import_dbapi()
    except ImportError as err:
        driver, kind = getattr(err, "name", None) or url.get_driver_name(), url.get_backend_name()
        raise ValueError(
            f"{shown(text)}: the {kind} driver is not installed (missing module: {driver}); "
            f"pip install it, or name an installed driver: {kind}+<driver>://..."
        ) from None
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        _check_file(url.database, "an sqlite database file", shown(text), "study.db")
    return text


def _check_file(path: str, what: str, given: str | None = None, example: str = "study.log") -> str:
    """``path`` as a file to open or create: its folder exists and it is not a folder itself."""
    file = Path(path)  # as it will be opened: no ~ expansion
    prefix = f"{given}: " if given is not None else ""
    if file.is_dir():
        raise ValueError(f"{prefix}{path} is a folder; give {what} in it, e.g. {file / example}")
    if not file.parent.is_dir():
        raise ValueError(f"{prefix}the folder {file.parent} of {path} does not exist; create it first")
    return path


def _storage_argument(text: str) -> str:
    """``--tune-storage`` checked at parse time, so a typo fails before any fit."""
    try:
        return check_storage(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def storage(where: str | Path) -> Any:
    """An optuna storage: a database URL (``scheme://...``), or else a journal file at that path. A bad URL,
    a missing driver or a database that cannot be opened is a ValueError in one line that names
    ``--tune-storage``; a journal that cannot be opened is the OSError that names its path."""
    import optuna

    text = check_storage(where)
    if "://" not in text:
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(text))
    from sqlalchemy import exc

    try:
        return optuna.storages.RDBStorage(text)
    except exc.SQLAlchemyError as err:  # no server there, refused, not a database file, ...
        reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        raise ValueError(
            f"--tune-storage {shown(text)}: cannot open the database ({reason}); check the URL (and that its "
            "server runs)"
        ) from None


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
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Maximise ``objective(hyperparameters)`` over ``space`` (plus the ``fixed`` values) in ``trials``
    evaluations in all (the first ``startup_trials`` random); returns the best hyperparameters with
    ``value``, ``trials``, ``tuning_seconds`` and, if any, ``diverged_trials``. ``journal`` is the study's
    storage (see :func:`storage`); ``parallel`` trials are evaluated at once (threads of this process).

    The study is ``study_name`` plus a digest of :func:`study_config` (``config`` is what else the
    objective depends on, JSON: e.g. the data split, the folds, the jobs' seed); it resumes only a study of
    exactly that config (see the module's docstring). ``parallel`` is not part of it: a study may be joined
    by processes with other thread counts.

    An objective that raises FloatingPointError (a diverged fit) or returns a non-finite value is scored
    as the worst value seen so far: a failed trial would teach the GP nothing, and it would propose the
    same point again."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    first = [_to_params(hp, space) for hp in starts]
    key = study_config(study_name, space, trials, seed, startup_trials, first, fixed, config)
    name = f"{study_name}/{config_digest(key)}"
    study = optuna.create_study(
        study_name=name,
        storage=storage(journal),
        sampler=optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup_trials),
        direction="maximize",
        load_if_exists=True,
    )
    _check_config(study, key, journal)
    if not study.trials:
        for params in first:
            study.enqueue_trial(params)

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


def study_config(
    study_name: str,
    space: Space,
    trials: int,
    seed: int,
    startup_trials: int,
    starts: Sequence[dict[str, Any]],
    fixed: dict[str, Any] | None,
    config: dict[str, Any] | None,
) -> dict[str, Any]:
    """Everything a study's result depends on, as JSON (``starts`` as the optuna parameters enqueued)."""
    box = {
        k: {"log_uniform": [d.low, d.high]} if isinstance(d, LogUniform) else {"choice": list(d.values)}
        for k, d in space.items()
    }
    return {
        "protocol": PROTOCOL,
        "name": study_name,
        "objective": config or {},
        "space": box,
        "fixed": fixed or {},
        "trials": trials,
        "seed": seed,
        "startup_trials": startup_trials,
        "starts": list(starts),
    }


def _canonical(config: dict[str, Any]) -> str:
    try:
        return json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"a tuning study's config must be finite JSON values ({err})") from None


def config_digest(config: dict[str, Any]) -> str:
    """The 16 hex digits of the SHA-256 of ``config``'s canonical JSON that end its study's name."""
    return hashlib.sha256(_canonical(config).encode()).hexdigest()[:16]


def _check_config(study: Any, config: dict[str, Any], where: str | Path) -> None:
    """Record ``config`` in a new study; refuse a study that holds another config, or none but trials."""
    recorded = study.user_attrs.get(CONFIG_ATTR)
    if recorded is None and not study.trials:  # new (or made at this moment by a process beside us)
        study.set_user_attr(CONFIG_ATTR, config)
        return
    if recorded is None or _canonical(recorded) != _canonical(config):
        differ = sorted(k for k in config if not isinstance(recorded, dict) or recorded.get(k) != config[k])
        raise ValueError(
            f"the tuning study {study.study_name!r} in {shown(where)} was made with another config "
            f"({', '.join(differ) or 'none recorded'} differ); use another --tune-storage, or delete that "
            "study"
        )


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
