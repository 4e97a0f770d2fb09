"""`ngvi demo` in its reduced form: runs through the CLI, writes its PNG, table and results, resumes, shows
every band whole, and refuses an unusable --out before it trains anything."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ngvi.experiments import demo
from ngvi.experiments.cli import main
from ngvi.experiments.data.toy import ToyRegression, toy_regression


def test_demo_quick_writes_png_table_and_resumes(tmp_path):
    out = tmp_path / "demo"
    args = ["demo", "--quick", "--out", str(out), "--jobs", "1"]
    assert main([*args, "--methods", "vadam,badam"]) == 0
    png = (out / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    table = (out / "table.md").read_text()
    assert "| Vadam |" in table and "| BAdam (linearised) |" in table
    # the quick NUTS run (2 chains × 5 draws) cannot converge: the table says so, not "reference"
    assert (
        "| NUTS: NOT CONVERGED (a multi-start ensemble) |" in table and "**NUTS did not converge**" in table
    )
    assert "| 95% coverage | r with NUTS variance |" in table
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert set(runs) == {"nuts", "vadam", "badam"}
    n_test = len(toy_regression().x_test)
    for name, r in runs.items():
        assert len(r["pred_mean"]) == len(r["pred_std"]) == n_test
        assert 0 <= r["coverage95"] <= 1
        if name != "nuts":  # the quick NUTS run is a few draws: only its plumbing is checked here
            assert 0 < r["train_range_rmse"] < r["test_rmse"] < 5  # the fit is better where the data is
    # coverage is the fraction of targets inside mean ± 1.96·sqrt(std² + 1/τ)
    data, r = toy_regression(), runs["vadam"]
    half = demo.Z95 * np.sqrt(np.square(r["pred_std"]) + 1 / demo.NOISE_PREC)
    inside = np.abs(data.y_test[:, 0].numpy() - np.array(r["pred_mean"])) <= half
    assert r["coverage95"] == pytest.approx(inside.mean())
    # a rerun with one more method trains only that one (NUTS comes from the cache)
    assert main([*args, "--methods", "vadam,badam,vprop"]) == 0
    again = json.loads((out / "results.json").read_text())["runs"]
    assert again["vadam"] == runs["vadam"] and again["nuts"] == runs["nuts"] and "vprop" in again


def test_nuts_counts_as_converged_only_within_both_targets():
    ok = {"output_max_r_hat": 1.04, "output_median_ess": 150.0}
    assert demo.nuts_converged(ok)
    assert not demo.nuts_converged({**ok, "output_max_r_hat": 2.18})
    assert not demo.nuts_converged({**ok, "output_median_ess": 7.0})


def test_the_correlation_with_nuts_is_pearson_of_variances():
    std = np.linspace(0.1, 1.0, 50)
    nuts = {"pred_std": std.tolist()}
    assert demo._nuts_correlation({"pred_std": (2 * std).tolist()}, nuts) == "1.00"
    assert demo._nuts_correlation({"pred_std": [0.3] * 50}, nuts) == "–"  # no variation: no correlation
    assert demo._nuts_correlation({"pred_std": std.tolist()}, None) == "–"


def test_every_method_runs(tmp_path):
    assert main(["demo", "--steps", "5", "--nuts", "no", "--out", str(tmp_path), "--jobs", "2"]) == 0
    rows = [line for line in (tmp_path / "table.md").read_text().splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(demo.OPTIONS)  # the header and one row per optimizer (no NUTS asked)


def test_the_y_range_holds_every_band_whole():
    """The figure must not hide where a method is confidently wrong (the old fixed [−1.5, 2.5] did)."""
    data = toy_regression()
    n = len(data.x_test)
    done = {
        "a": {"pred_mean": list(np.linspace(-3.0, 1.0, n)), "pred_std": [0.3] * n},
        "b": {"pred_mean": [0.0] * n, "pred_std": list(np.linspace(0.0, 2.0, n))},
    }
    truth = ToyRegression.curve(data.x_test)[:, 0].numpy()
    low, high = demo.band_limits(done, truth, data)
    noise = 1.0 / demo.NOISE_PREC
    assert low < -3.0 - 2 * np.sqrt(0.09 + noise) and high > 2 * np.sqrt(4.0 + noise)


def test_unusable_out_is_refused_before_training(tmp_path, capsys):
    file = tmp_path / "file"
    file.write_text("keep")
    assert main(["demo", "--quick", "--out", str(file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file, not a folder" in err and "Traceback" not in err
    assert file.read_text() == "keep"
    (tmp_path / "results.json").write_text("[1]")
    assert main(["demo", "--quick", "--out", str(tmp_path)]) == 2
    assert "not an ngvi results file" in capsys.readouterr().err
    assert (tmp_path / "results.json").read_text() == "[1]" and not (tmp_path / "demo.png").exists()


def test_bad_arguments_are_one_line(tmp_path, capsys):
    for argv, expected in (
        (["--methods", "sgd"], "--methods: unknown sgd"),
        (["--steps", "0"], "--steps: expected a positive integer, got 0"),
        (["--seed", "-1"], "--seed: expected an integer ≥ 0, got -1"),
    ):
        assert main(["demo", "--out", str(tmp_path), *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and expected in err, err


def test_list_names_methods_and_datasets(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("Vadam", "BBVI", "mc_dropout", "bostonHousing", "protein-tertiary-structure", "mnist"):
        assert word in out
