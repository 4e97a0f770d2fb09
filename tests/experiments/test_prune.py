"""`ngvi prune` in its reduced form: runs through the CLI on real MNIST (1,000 images), writes its PNG, table
and results, resumes, and its pruning curve starts at the unpruned accuracy and ends at chance."""

from __future__ import annotations

import json

import pytest

from ngvi.experiments import prune
from ngvi.experiments.cli import main

pytestmark = [pytest.mark.data("mnist"), pytest.mark.usefixtures("data_dir")]  # found through $NGVI_DATA


def test_prune_quick_writes_png_table_and_resumes(tmp_path):
    out = tmp_path / "prune"
    args = ["prune", "--quick", "--methods", "badam,vogn", "--out", str(out), "--jobs", "1"]
    assert main(args) == 0
    png = (out / "prune.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    table = (out / "table.md").read_text()
    assert "| BAdam | |μ|/σ |" in table and "| VOGN | |μ| |" in table and "BADAM's notebook" in table
    results = json.loads((out / "results.json").read_text())
    runs = results["runs"]
    assert set(runs) == {"badam/seed0", "vogn/seed0"}
    for r in runs.values():
        assert r["fractions"] == list(prune.FRACTIONS)
        for curve in r["accuracy"].values():
            assert len(curve) == len(prune.FRACTIONS)
            assert curve[0] == pytest.approx(r["test_accuracy_per_epoch"][-1])  # p = 0 prunes nothing
            assert curve[-1] < 0.35  # 99.9% of the weights gone: about chance
        assert r["test_accuracy_per_epoch"][-1] > 0.5  # 1,000 images, 2 epochs: it learns something
    assert main(args) == 0  # everything cached: nothing is trained again
    assert json.loads((out / "results.json").read_text())["runs"] == runs
