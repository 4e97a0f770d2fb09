"""`ngvi bench --quick`: runs through the CLI on tiny models and writes its table, JSON and plot."""

from __future__ import annotations

import json

import ngvi
from ngvi.experiments.cli import main


def test_bench_quick_writes_table_json_and_plot(tmp_path):
    out = tmp_path / "bench"
    argv = ["bench", "--quick", "--out", str(out), "--methods", "adam,vadam,ivon,vogn", "--models", "mlp"]
    argv += ["--sweep", "8,16"]
    assert main(argv) == 0
    png = (out / "scaling.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "results.json").read_text())
    mlp = results["problems"]["mlp"]["methods"]
    assert set(mlp) >= {"adam", "vadam", "ivon"}
    assert all(r["seconds"] > 0 and r["peak_bytes"] > 0 for r in mlp.values())
    assert set(results["sweep"]) == {"8", "16"}
    table = (out / "table.md").read_text()
    assert "| ngvi.Vadam |" in table and "× Adam" in table and "vadam time ≤ 1.5× Adam" in table
    if not hasattr(ngvi, "VOGN"):
        assert "vogn: not available in this build" in table


def test_bench_rejects_unknown_methods(tmp_path, capsys):
    assert main(["bench", "--quick", "--out", str(tmp_path), "--methods", "sgd"]) == 2
    assert "unknown bench method" in capsys.readouterr().err
