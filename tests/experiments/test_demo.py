"""`ngvi demo` in its reduced form: runs through the CLI and writes its PNG, table and results."""

from __future__ import annotations

import json

from ngvi.experiments.cli import main


def test_demo_quick_writes_png_table_and_resumes(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--methods", "vadam,badam"]) == 0
    png = (out / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    table = (out / "table.md").read_text()
    assert "| Vadam |" in table and "| BAdam (linearised) |" in table
    results = json.loads((out / "results.json").read_text())
    assert set(results["methods"]) == {"vadam", "badam"}
    assert all(r["test_rmse"] > 0 for r in results["methods"].values())
    # a rerun with one more method trains only that one
    before = results["methods"]["vadam"]["seconds"]
    assert main(["demo", "--quick", "--out", str(out), "--methods", "vadam,badam,vprop"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["methods"]["vadam"]["seconds"] == before and "vprop" in results["methods"]


def test_demo_full_method_list_quick(tmp_path):
    assert main(["demo", "--quick", "--steps", "10", "--out", str(tmp_path)]) == 0
    rows = [line for line in (tmp_path / "table.md").read_text().splitlines() if line.startswith("| ")]
    assert len(rows) - 1 >= 9  # header + one row per optimizer


def test_unknown_method_is_a_clear_error(tmp_path, capsys):
    assert main(["demo", "--quick", "--out", str(tmp_path), "--methods", "sgd"]) == 2
    assert "unknown demo method" in capsys.readouterr().err


def test_list_names_methods_and_datasets(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("Vadam", "BBVI", "mc_dropout", "bostonHousing", "protein-tertiary-structure", "mnist"):
        assert word in out
