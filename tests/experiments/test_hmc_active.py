"""`ngvi hmc` (NNG Table 4) and `ngvi active` (NNG Table 3) in their reduced modes: they run through the
CLI, write their tables beside the paper's numbers and their figures, resume, pick up NNG-BlkTri when the
registry has it, and score what they claim to score (checked on constructed variances)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

from ngvi.experiments.cli import main
from ngvi.experiments.core import methods as core_methods
from ngvi.experiments.hmc import protocol
from ngvi.experiments.hmc.experiment import add_budget_arguments, budget_of
from ngvi.experiments.hmc.published import TABLE3, TABLE4
from ngvi.experiments.hmc.report import correlations, references

pytest.importorskip("pyro")
PNG = b"\x89PNG\r\n\x1a\n"


def test_hmc_quick_writes_table4_beside_the_paper_and_resumes(tmp_path, data_dir):
    out = tmp_path / "hmc"
    args = ["hmc", "--quick", "--datasets", "yacht", "--trials", "2", "--out", str(out), "--jobs", "1"]
    args += ["--data-dir", str(data_dir)]
    assert main([*args, "--methods", "noisy_adam,noisy_kfac"]) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert set(runs) == {f"{m}/yacht/{t}" for m in ("hmc", "noisy_adam", "noisy_kfac") for t in (0, 1)}
    assert len(runs["hmc/yacht/0"]["variance"]) == 100 and runs["hmc/yacht/0"]["chains"] == 2
    assert runs["hmc/yacht/0"]["mixed"] is False  # 2 chains × (10 + 10) draws cannot mix
    table = (out / "table.md").read_text()
    assert "| Yacht | 0 / 2 | no reference | no reference |" in table
    assert "0.717 ± 0.072" in table  # the paper's NNG-MVG value beside ours
    assert "worst R-hat of f(x*)" in table
    for png in ("correlations.png", "variances.png"):
        assert (out / png).read_bytes()[:8] == PNG
    # methods added later train alone against the cached NUTS runs (NNG-BlkTri with noisy K-FAC's options)
    assert main([*args, "--methods", "noisy_adam,noisy_kfac,nng_blktri,vadam"]) == 0
    again = json.loads((out / "results.json").read_text())["runs"]
    assert again["hmc/yacht/0"] == runs["hmc/yacht/0"]
    assert {"vadam/yacht/1", "nng_blktri/yacht/1"} <= set(again)


def test_active_quick_runs_both_strategies_and_reports_the_paper(tmp_path, data_dir):
    out = tmp_path / "active"
    args = ["active", "--quick", "--datasets", "boston", "--trials", "1", "--methods", "noisy_kfac"]
    assert main([*args, "--out", str(out), "--jobs", "1", "--data-dir", str(data_dir)]) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert set(runs) == {f"{m}/bostonHousing/0/{s}" for m in ("hmc", "noisy_kfac") for s in "RA"}
    for r in runs.values():
        assert len(r["rmse_curve"]) == 3 and len(r["chosen"]) == 2 and 0 < r["rmse"] < 30
        assert len(set(r["chosen"])) == 2  # a labelled point leaves the pool
    assert (
        runs["hmc/bostonHousing/0/A"]["mixed"] is False
        and runs["hmc/bostonHousing/0/A"]["output_min_ess"] > 0
    )
    table = (out / "table.md").read_text()
    assert "| Boston | not mixed | not mixed |" in table  # a quick NUTS run is no reference
    assert "Noisy K-FAC (NNG-MVG) A" in table and "5.156 ± 0.150" in table  # the paper's HMC A, Boston
    assert (out / "curves.png").read_bytes()[:8] == PNG
    assert (out / "differences.png").read_bytes()[:8] == PNG  # issue 48: A − R with its interval


def test_quick_keeps_budget_options_given_on_the_command_line():
    parser = argparse.ArgumentParser()
    add_budget_arguments(parser, protocol.Budget())
    budget = budget_of(parser.parse_args(["--quick", "--chains", "3", "--doublings", "2"]))
    assert (budget.chains, budget.doublings, budget.warmup) == (3, 2, protocol.Budget.quick().warmup)
    assert budget_of(parser.parse_args([])) == protocol.Budget()


class _FakeRun:
    """A NUTS run whose predictions' diagnostics are given."""

    def __init__(self, r_hat: float, ess: float) -> None:
        self.stats = {"r_hat": torch.tensor([1.0, r_hat]), "ess": torch.tensor([500.0, ess])}

    def output_diagnostics(self, x):
        return self.stats

    def summary(self):
        return {"chains": 4}


def test_nuts_reference_doubles_the_run_until_the_predictions_mix(monkeypatch):
    budget = protocol.Budget(warmup=50, samples=60, doublings=2)
    outcomes = iter([_FakeRun(1.30, 20.0), _FakeRun(1.04, 90.0), _FakeRun(1.04, 150.0)])
    seen = []

    def fake_nuts(data, tried, seed, init_from=None):
        seen.append((tried.warmup, tried.samples, tried.chains))
        return next(outcomes)

    monkeypatch.setattr(protocol, "nuts", fake_nuts)
    _, record = protocol.nuts_reference(None, None, budget, seed=0)
    assert seen == [(50, 60, 4), (100, 120, 4), (200, 240, 4)]
    assert record["mixed"] is True and len(record["attempts"]) == 3
    assert (record["output_max_r_hat"], record["output_min_ess"]) == (pytest.approx(1.04), 150.0)
    # one doubling too few: the last run is kept and marked as not mixed
    outcomes = iter([_FakeRun(1.30, 20.0), _FakeRun(1.04, 90.0)])
    _, record = protocol.nuts_reference(None, None, protocol.Budget(doublings=1), seed=0)
    assert record["mixed"] is False and record["attempts"][-1]["output_min_ess"] == 90.0


def test_a_reference_that_has_not_mixed_ranks_nothing():
    hmc = np.linspace(0.1, 2.0, 100)
    runs = {
        "hmc/yacht/0": {"variance": hmc.tolist(), "mixed": False},
        "noisy_kfac/yacht/0": {"variance": hmc.tolist()},
        "hmc/yacht/1": {"variance": hmc.tolist(), "output_max_r_hat": 1.02, "output_min_ess": 120.0},
        "noisy_kfac/yacht/1": {"variance": hmc.tolist()},
    }
    corr = correlations(runs, ["noisy_kfac"], ["yacht"], trials=2)
    assert corr["noisy_kfac"]["yacht"] == {1: pytest.approx(1.0)}  # an older record judged by the targets
    assert references(runs, "yacht", 2) == (1, 2)


def test_correlations_are_pearson_of_the_variances():
    hmc = np.linspace(0.1, 2.0, 100)
    runs = {
        "hmc/yacht/0": {"variance": hmc.tolist(), "mixed": True},
        "noisy_kfac/yacht/0": {"variance": (3 * hmc + 1).tolist()},  # an affine map: r = 1
        "noisy_adam/yacht/0": {"variance": (1 / hmc).tolist()},  # decreasing: r < 0
    }
    corr = correlations(runs, ["noisy_kfac", "noisy_adam"], ["yacht"], trials=1)
    assert corr["noisy_kfac"]["yacht"][0] == pytest.approx(1.0)
    assert corr["noisy_adam"]["yacht"][0] == pytest.approx(np.corrcoef(hmc, 1 / hmc)[0, 1])
    assert corr["noisy_adam"]["yacht"][0] < 0


def test_nng_blktri_joins_when_the_registry_has_it(monkeypatch):
    assert protocol.available_methods()[:3] == ["noisy_adam", "noisy_kfac", "nng_blktri"]
    missing = core_methods.Method("nng_blktri", "NNG-BlkTri", "NoSuchClass", "absent", takes_model=True)
    monkeypatch.setitem(core_methods.METHODS, "nng_blktri", missing)
    assert "nng_blktri" not in protocol.available_methods()


def test_published_tables_are_complete():
    for table in (TABLE3, TABLE4):
        for column in table.values():
            assert list(column) == list(protocol.DATASETS)
    assert TABLE4["NNG-MVG"]["bostonHousing"] == (0.891, 0.021)
    assert TABLE3["HMC A"]["yacht"] == (3.211, 0.120)
