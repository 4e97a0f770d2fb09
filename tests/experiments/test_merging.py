"""`ngvi merging` in its reduced form: runs through the CLI on real MNIST (400 images), writes its PNG,
table and results, and resumes."""

from __future__ import annotations

import json

import pytest

from ngvi.experiments.cli import main

pytestmark = [pytest.mark.data("mnist"), pytest.mark.usefixtures("data_dir")]  # found through $NGVI_DATA


def test_merging_quick_writes_png_table_and_resumes(tmp_path):
    out = tmp_path / "merging"
    args = ["merging", "--quick", "--rules", "vadam", "--seeds", "1", "--out", str(out), "--jobs", "1"]
    assert main(args) == 0
    png = (out / "merging.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    table = (out / "table.md").read_text()
    assert (
        "| halves | Vadam | merged by precision |" in table and "| digits | Vadam | plain average |" in table
    )
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert set(runs) == {"halves/vadam/seed0", "digits/vadam/seed0"}
    for r in runs.values():
        s = r["scores"]
        assert set(s) == {"joint", "part0", "part1", "part", "precision", "average"}
        for m in ("accuracy", "nll", "ece"):
            assert s["part"][m] == pytest.approx((s["part0"][m] + s["part1"][m]) / 2)
            assert all(s[v][m] >= 0 for v in s) and all(s[v]["accuracy"] <= 1 for v in s)
    assert main(args) == 0  # everything cached
    assert json.loads((out / "results.json").read_text())["runs"] == runs
