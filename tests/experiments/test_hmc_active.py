"""`ngvi hmc` (NNG Table 4) and `ngvi active` (NNG Table 3) in their reduced modes: they run through the
CLI, write their tables beside the paper's numbers and their figures, resume, pick up NNG-BlkTri when the
registry has it, and score what they claim to score (checked on constructed variances)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ngvi.experiments.cli import main
from ngvi.experiments.core import methods as core_methods
from ngvi.experiments.hmc import protocol
from ngvi.experiments.hmc.published import TABLE3, TABLE4
from ngvi.experiments.hmc.report import correlations

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
    table = (out / "table.md").read_text()
    assert "| Yacht |" in table and "0.717 ± 0.072" in table  # the paper's NNG-MVG value beside ours
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
    table = (out / "table.md").read_text()
    assert "Noisy K-FAC (NNG-MVG) A" in table and "5.156 ± 0.150" in table  # the paper's HMC A, Boston
    assert (out / "curves.png").read_bytes()[:8] == PNG


def test_correlations_are_pearson_of_the_variances():
    hmc = np.linspace(0.1, 2.0, 100)
    runs = {
        "hmc/yacht/0": {"variance": hmc.tolist()},
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
