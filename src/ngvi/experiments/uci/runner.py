"""Run the UCI benchmark: tune (or load) λ and τ, fit every (data set, method, split), and save as it goes.

Fits run in worker processes (one torch thread each; ``jobs`` of them), and every finished fit is written
to ``results.json`` at once, so a killed run restarts from the fits it had finished.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ngvi.experiments.data import load_uci, uci_info, uci_name

from .._io import load_json, save_json, show_progress
from .methods import METHODS, UCIMethod, get_methods
from .protocol import Protocol, fit
from .tuning import tune

#: the eight data sets of Khan et al. 2018, Table 1 (protein is available but not in the default list)
STANDARD_SETS = (
    "bostonHousing",
    "concrete",
    "energy",
    "kin8nm",
    "naval-propulsion-plant",
    "power-plant",
    "wine-quality-red",
    "yacht",
)
SHIPPED_HPARAMS = "hparams.json"


def _key(*parts: Any) -> str:
    return "/".join(str(p) for p in parts)


def _fit_job(job: dict[str, Any]) -> dict[str, Any]:
    """Worker: one fit on one split (or one CV fold of split 0's training part)."""
    torch.set_num_threads(1)
    split = load_uci(job["dataset"], job["split"], job["data_dir"])
    if job.get("fold") is not None:
        split = split.cv_folds(n_folds=job["folds"], seed=job["seed"])[job["fold"]]
    method = METHODS[job["method"]]
    hp = job["hp"]
    try:
        return fit(
            method,
            job["dataset"],
            split,
            hp["prior_prec"],
            hp["noise_prec"],
            Protocol(**job["protocol"]),
            seed=job["seed"] + job["split"],
            dropout=hp.get("dropout", 0.05),
        )
    except FloatingPointError as err:  # ngvi.NonFiniteGradientError: this fit diverged; the others go on
        return {"diverged": str(err)}


class _Executor:
    """A process pool for jobs > 1, or the calling process for jobs == 1 (easier to debug and profile)."""

    def __init__(self, jobs: int):
        self.pool = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None

    def map(self, jobs: list[dict[str, Any]]):
        if self.pool is None:
            torch_threads = torch.get_num_threads()
            try:
                yield from (_fit_job(j) for j in jobs)
            finally:
                torch.set_num_threads(torch_threads)
        else:
            yield from self.pool.map(_fit_job, jobs)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def shipped_hparams() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath(SHIPPED_HPARAMS).read_text())


def hyperparameters(
    method: UCIMethod,
    dataset: str,
    tune_mode: str,
    out: Path,
    executor: _Executor,
    trials: int,
    folds: int,
    protocol: Protocol,
    seed: int,
    data_dir: str | None,
) -> dict[str, Any]:
    """The tuned λ, τ (and dropout) for one data set and method: from the run's cache, or the shipped
    table, or a fresh BO (``tune_mode == "bo"``)."""
    key = _key(dataset, method.name)
    cache_path = out / "tuned.json"
    cache = load_json(cache_path)
    budget = {"trials": trials, "folds": folds, "epochs": protocol.epochs}
    if key in cache and (tune_mode == "none" or cache[key].get("budget") == budget):
        return cache[key]
    if tune_mode == "none":
        shipped = shipped_hparams().get(key)
        if shipped is None:
            raise ValueError(
                f"no tuned hyperparameters for {method.name} on {dataset}: run with --tune bo to tune them "
                f"(they are then cached in {cache_path})"
            )
        return {**shipped, "source": "shipped"}

    def cv_loglik(hp: dict[str, float]) -> float:
        jobs = [
            {
                "dataset": dataset,
                "split": 0,
                "fold": k,
                "folds": folds,
                "method": method.name,
                "hp": hp,
                "protocol": {**asdict(protocol), "curve": False},
                "seed": seed,
                "data_dir": data_dir,
            }
            for k in range(folds)
        ]
        folds_done = list(executor.map(jobs))
        if any("diverged" in r for r in folds_done):
            return float("nan")  # scored by the tuner as a divergence
        return float(np.mean([r["loglik"] for r in folds_done]))

    objective_id = f"{folds}folds-{protocol.epochs}epochs"
    journal = out / "optuna-journal.log"
    warm = _warm_starts(cache, dataset, method)
    best = tune(
        method,
        dataset,
        cv_loglik,
        trials,
        journal,
        objective_id,
        seed=seed,
        data_dir=data_dir,
        starts=list(warm.values()),
    )
    entry = {**best, "budget": budget, "tuned_on_split": 0, "source": "bo", "warm_start": sorted(warm)}
    cache[key] = entry
    save_json(cache_path, cache)
    return entry


def _tunes_only_prior_and_noise(method: UCIMethod) -> bool:
    return not method.fixed and not method.tunes_dropout


def _warm_starts(cache: dict[str, Any], dataset: str, method: UCIMethod) -> dict[str, dict[str, Any]]:
    """The optima already tuned for other methods on ``dataset`` over the same (λ, τ) search space."""
    if not _tunes_only_prior_and_noise(method):
        return {}
    starts = {}
    for key, entry in cache.items():
        data, name = key.split("/")[:2]
        other = METHODS.get(name)
        if (
            data == dataset
            and other is not None
            and other is not method
            and _tunes_only_prior_and_noise(other)
        ):
            starts[name] = entry
    return starts


def merge(out: Path, sources: list[Path], datasets: list[str], methods: list[str], config: dict) -> None:
    """Copy the fits and tuned values of ``methods`` on ``datasets`` from other results folders into ``out``
    (for a benchmark run in pieces, e.g. one method per machine); entries already in ``out`` are kept."""
    results, tuned = load_json(out / "results.json"), load_json(out / "tuned.json")
    results.setdefault("config", config)

    def wanted(key: str) -> bool:
        dataset, method = key.split("/")[:2]
        return dataset in datasets and method in methods

    for src in sources:
        other = load_json(src / "results.json")
        if not other:
            raise ValueError(f"{src} holds no results.json to merge")
        if other.get("config") != results["config"]:
            raise ValueError(
                f"{src} was run with {other.get('config')}, {out} with {results['config']}; merge only "
                "results of the same protocol and seed"
            )
        for section in ("runs", "hparams"):
            for k, v in other.get(section, {}).items():
                if wanted(k):
                    results.setdefault(section, {}).setdefault(k, v)
        for k, v in load_json(src / "tuned.json").items():
            if wanted(k):
                tuned.setdefault(k, v)
    save_json(out / "results.json", results)
    save_json(out / "tuned.json", tuned)


def run(
    datasets: list[str],
    methods: list[str],
    splits: int | None,
    tune_mode: str,
    out: Path,
    *,
    trials: int = 30,
    folds: int = 5,
    epochs: int = 40,
    jobs: int = 2,
    seed: int = 0,
    data_dir: str | None = None,
    merge_from: Sequence[Path] = (),
) -> dict[str, Any]:
    """Fit every (data set, method, split) not yet in ``out/results.json``; returns the results dict.

    ``merge_from``: results folders whose fits and tuned values for these data sets and methods are taken
    over first (see :func:`merge`)."""
    datasets = [uci_name(d) for d in datasets]
    chosen = get_methods(methods)
    n_splits = {d: uci_info(d, data_dir).n_splits for d in datasets}  # fails early if the data is missing
    protocol = Protocol(epochs=epochs)
    out.mkdir(parents=True, exist_ok=True)
    config = {"protocol": asdict(protocol), "seed": seed}
    if merge_from:
        merge(out, list(merge_from), datasets, [m.name for m in chosen], config)
    results = load_json(out / "results.json")
    if results.get("config", config) != config:
        raise ValueError(
            f"{out} holds results of another configuration {results['config']}; use a new --out folder"
        )
    results.setdefault("config", config)
    results.setdefault("runs", {})
    results.setdefault("hparams", {})
    executor = _Executor(jobs)
    try:
        for dataset in datasets:
            for method in chosen:
                hp = hyperparameters(
                    method, dataset, tune_mode, out, executor, trials, folds, protocol, seed, data_dir
                )
                results["hparams"][_key(dataset, method.name)] = hp
        save_json(out / "results.json", results)
        todo = []
        for dataset in datasets:
            for split in range(min(splits or n_splits[dataset], n_splits[dataset])):
                for method in chosen:
                    if _key(dataset, method.name, split) not in results["runs"]:
                        hp = results["hparams"][_key(dataset, method.name)]
                        todo.append(
                            {
                                "dataset": dataset,
                                "split": split,
                                "method": method.name,
                                "hp": hp,
                                "protocol": asdict(protocol),
                                "seed": seed,
                                "data_dir": data_dir,
                            }
                        )
        start = time.perf_counter()
        with tqdm(total=len(todo), desc="ngvi uci", unit="fit", disable=not show_progress()) as bar:
            for job, res in zip(todo, executor.map(todo), strict=True):
                results["runs"][_key(job["dataset"], job["method"], job["split"])] = res
                save_json(out / "results.json", results)
                bar.set_postfix_str(f"{job['dataset']} {job['method']} split {job['split']}")
                bar.update()
        results["wall_seconds"] = results.get("wall_seconds", 0.0) + time.perf_counter() - start
        save_json(out / "results.json", results)
    finally:
        executor.close()
    return results


def fit_seconds(results: dict[str, Any], datasets: list[str], method: str) -> float:
    """Seconds spent fitting ``method`` on ``datasets`` (all splits), summed over fits."""
    keys = {f"{d}/{method}" for d in datasets}
    return sum(v.get("seconds", 0.0) for k, v in results["runs"].items() if k.rsplit("/", 1)[0] in keys)


def default_jobs() -> int:
    return max(1, min(2, os.cpu_count() or 1))
