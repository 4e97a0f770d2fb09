"""`ngvi uci`: a 2-split, 2-epoch smoke run of every method (BO path included), resuming, and the report's
bolding and formatting rules on synthetic results."""

from __future__ import annotations

import json

import pytest

from conftest import data_dir
from ngvi.cli import main
from ngvi.experiments.uci.methods import METHODS
from ngvi.experiments.uci.report import _bold, _fmt, build_table

AVAILABLE = [name for name, m in METHODS.items() if m.available()]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("uci")
    args = ["uci", "--datasets", "yacht", "--methods", ",".join(AVAILABLE), "--splits", "2", "--epochs", "2"]
    args += ["--tune", "bo", "--trials", "2", "--folds", "2", "--jobs", "2", "--out", str(out)]
    args += ["--data-dir", str(data_dir())]
    assert main(args) == 0
    return out, args


def test_smoke_run_writes_a_valid_table_for_every_method(smoke_run):
    out, _ = smoke_run
    results = json.loads((out / "results.json").read_text())
    assert len(results["runs"]) == 2 * len(AVAILABLE)
    for key, run in results["runs"].items():
        assert run["rmse"] > 0 and run["loglik"] < 10, key
        assert len(run["curve"]) == 2
    table = (out / "table.md").read_text()
    for name in AVAILABLE:
        assert f"{METHODS[name].label} (ours)" in table
    assert "| yacht |" in table and "Comparison with the papers" in table
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    tuned = json.loads((out / "tuned.json").read_text())
    assert set(tuned) == {f"yacht/{m}" for m in AVAILABLE}
    assert all(v["budget"] == {"trials": 2, "folds": 2, "epochs": 2} for v in tuned.values())
    assert tuned["yacht/mc_dropout"]["dropout"] in (0.005, 0.01, 0.05, 0.1)  # Gal's grid


def test_rerun_resumes_without_refitting(smoke_run):
    out, args = smoke_run
    before = json.loads((out / "results.json").read_text())
    assert main([*args[:-2], "--data-dir", str(data_dir())]) == 0
    after = json.loads((out / "results.json").read_text())
    assert after["runs"] == before["runs"]


def test_clear_errors(tmp_path, capsys):
    assert main(["uci", "--methods", "sgd", "--out", str(tmp_path)]) == 2
    assert "unknown method" in capsys.readouterr().err
    args = ["uci", "--datasets", "yacht", "--methods", "vadam", "--tune", "none", "--epochs", "3"]
    assert main([*args, "--out", str(tmp_path), "--data-dir", str(data_dir())]) == 2
    assert "no tuned hyperparameters" in capsys.readouterr().err
    assert (
        main(["uci", "--datasets", "yacht", "--out", str(tmp_path), "--data-dir", str(tmp_path / "nope")])
        == 2
    )
    assert "NGVI_DATA" in capsys.readouterr().err


def fake_results(values: dict[str, list[float]]) -> dict:
    runs = {}
    for method, vs in values.items():
        for split, v in enumerate(vs):
            runs[f"yacht/{method}/{split}"] = {"rmse": v, "loglik": -v, "curve": [v, v]}
    return {"runs": runs, "hparams": {}}


def test_paired_t_test_bolding():
    # vadam is best; bbvi differs by a constant 0.5 on every split (significant); map by noise (not)
    base = [1.0, 1.2, 0.9, 1.1, 1.05, 0.95, 1.15, 1.0]
    noise = [0.03, -0.02, 0.01, -0.04, 0.02, 0.0, -0.01, 0.03]
    results = fake_results(
        {
            "vadam": base,
            "bbvi": [b + 0.5 for b in base],
            "map": [b + n for b, n in zip(base, noise, strict=True)],
        }
    )
    assert _bold(results, "yacht", ["vadam", "bbvi", "map"], "rmse") == {"vadam", "map"}
    assert _bold(results, "yacht", ["vadam", "bbvi", "map"], "loglik") == {"vadam", "map"}
    table = build_table(results, ["yacht"], ["vadam", "bbvi"], "# header\n")
    assert "**1.044 ± 0.036 (8)**" in table and "1.32 ± 0.10" in table  # ours bold, Khan et al.'s Vadam row


def test_number_format_follows_the_standard_error():
    assert _fmt(3.9312, 0.2634) == "3.93 ± 0.26"
    assert _fmt(0.000612, 0.0000123) == "0.00061 ± 0.00001"
    assert _fmt(4.72, 0.0) == "4.72 ± 0.00"
