"""`ngvi uci-nng` (NNG's regression protocol) and `ngvi nng-precision` (NNG's Fig. 1): the learned noise
posterior against its closed-form optimum, a 2-split 1-epoch smoke run with its table beside NNG's Table 1,
merging, and the structure of the four precision matrices."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from ngvi.experiments.cli import main
from ngvi.experiments.uci_nng.noise import GammaNoise

pytestmark = pytest.mark.data("uci")


def test_noise_gradient_is_the_elbo_gradient_and_vanishes_at_the_conjugate_optimum():
    """J's closed-form gradient matches finite differences, and is zero at q*(τ) = Gamma(a₀ + N/2,
    b₀ + N r̄²/2), the exact optimum of the ELBO over q(τ) for fixed residuals (conjugacy)."""
    noise = GammaNoise(300)
    noise.log_params = [1.3, 0.2]
    h = 1e-6

    def objective(log_a: float, log_b: float) -> float:
        noise.log_params = [log_a, log_b]
        return noise.objective(0.7)

    noise.log_params = [1.3, 0.2]
    grad = noise.gradient(0.7)
    numeric = (
        (objective(1.3 + h, 0.2) - objective(1.3 - h, 0.2)) / (2 * h),
        (objective(1.3, 0.2 + h) - objective(1.3, 0.2 - h)) / (2 * h),
    )
    assert grad == pytest.approx(numeric, rel=1e-6)
    noise.log_params = [math.log(6 + 150), math.log(6 + 150 * 0.7)]
    assert noise.gradient(0.7) == pytest.approx((0.0, 0.0), abs=1e-12)
    for _ in range(3000):  # Adam on J from the prior walks there
        noise.update(0.05)
    assert noise.mean() == pytest.approx((6 + 150) / (6 + 150 * 0.05), rel=0.05)


def test_smoke_run_writes_the_table_beside_nngs_and_merges(tmp_path, capsys, data_dir):
    out = tmp_path / "a"
    args = [
        "uci-nng",
        "--datasets",
        "yacht",
        "--methods",
        "noisy_kfac,bbvi",
        "--splits",
        "2",
        "--epochs",
        "1",
    ]
    args += ["--train-samples", "2", "--jobs", "1", "--out", str(out), "--data-dir", str(data_dir)]
    assert main(args) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert set(runs) == {f"yacht/{m}/{s}" for m in ("noisy_kfac", "bbvi") for s in (0, 1)}
    for r in runs.values():
        assert r["settings"] == {"epochs": 1, "batch_size": 10, "train_samples": 2}
        assert r["steps"] == 28 and math.isfinite(r["rmse"]) and math.isfinite(r["loglik"])
    table = (out / "table.md").read_text()
    assert "| yacht |" in table and "0.979 ± 0.077" in table and "1.174 ± 0.086" in table  # NNG-MVG, BBB
    assert "Noisy K-FAC against NNG-MVG" in table and "1 epochs × batch 10, 2 particles: yacht (2)" in table
    assert (out / "rmse.png").read_bytes()[:4] == b"\x89PNG"
    merged = tmp_path / "b"
    assert main(["uci-nng", "--datasets", "yacht", "--merge-from", str(out), "--report-only", "--out",
                 str(merged), "--data-dir", str(data_dir)]) == 0  # fmt: skip
    assert json.loads((merged / "results.json").read_text())["runs"] == runs
    ours = re.findall(r"-?[0-9.]+ ± [0-9.]+ \(2\)", (out / "table.md").read_text())
    assert ours and all(cell in (merged / "table.md").read_text() for cell in ours)  # report-only shows them


def test_precision_figure_shows_what_each_family_can_represent(tmp_path, data_dir):
    """FFG: a diagonal precision; MVG: no precision between layers; BlkTri: its inverse (the covariance)
    is zero between layers 1 and 3; full: all of them."""
    out = tmp_path / "fig"
    args = ["nng-precision", "--quick", "--jobs", "1", "--out", str(out), "--data-dir", str(data_dir)]
    assert main(args) == 0
    assert (out / "precision.png").read_bytes()[:4] == b"\x89PNG"
    assert "| NNG-BlkTri |" in (out / "table.md").read_text()
    precision = {m: np.load(out / f"precision-{m}.npy").astype(np.float64) for m in
                 ("nng_full", "noisy_adam", "noisy_kfac", "nng_blktri")}  # fmt: skip
    layer1, layer2, layer3 = slice(0, 210), slice(210, 450), slice(450, 466)  # 13·15+15, 15·15+15, 15+1
    p = precision["noisy_adam"]
    assert np.count_nonzero(p - np.diag(np.diag(p))) == 0
    assert np.abs(precision["noisy_kfac"][layer1, layer2]).max() == 0
    cov = np.linalg.inv(precision["nng_blktri"])
    assert np.abs(cov[layer1, layer3]).max() < 1e-4 * np.abs(cov).max()
    assert np.abs(precision["nng_blktri"][layer1, layer3]).max() > 0
    assert np.abs(precision["nng_full"][layer1, layer3]).max() > 0


def test_table_shows_every_column_of_nngs_table_1_once_with_the_best_in_italics():
    from ngvi.experiments.uci_nng.report import table

    runs = {f"{d}/noisy_kfac/{s}": {"rmse": 1.0 + s, "loglik": -2.0 - s, "noise_std": 1.0, "seconds": 1.0}
            for d in ("yacht", "wine-quality-red") for s in (0, 1)}  # fmt: skip
    text = table({"runs": runs}, ["wine-quality-red", "yacht"], ["noisy_kfac"], "")
    header = "| Dataset | Noisy K-FAC (ours) | BBB [Z18] | PBP [Z18] | NNG-FFG [Z18] | NNG-MVG [Z18] |"
    assert text.count(header) == 2  # RMSE and log-likelihood, each published column once
    # PBP holds the best published wine RMSE and yacht log-likelihood; NNG-MVG the best yacht RMSE
    assert "| 0.643 ± 0.012 | _0.635 ± 0.008_ | 0.644 ± 0.011 | 0.637 ± 0.011 |" in text
    assert "| -2.408 ± 0.007 | _-1.634 ± 0.016_ | -2.412 ± 0.006 | -2.316 ± 0.006 |" in text
    assert "| 1.174 ± 0.086 | 1.015 ± 0.054 | 1.289 ± 0.069 | _0.979 ± 0.077_ |" in text


def test_damping_reaches_the_kfac_methods_only_and_is_recorded(tmp_path, data_dir, monkeypatch):
    """--damping (γ_ex, NNG §3.2) goes to noisy K-FAC's trainer and its record; BBVI has none; at its
    default 0 the configuration is the one folders made before the option had."""
    from ngvi.experiments.core import methods as core_methods
    from ngvi.experiments.uci_nng.protocol import Protocol

    assert "damping" not in Protocol().asdict() and Protocol(damping=0.01).asdict()["damping"] == 0.01
    built = {}
    build = core_methods.Method.build

    def spy(self, model, n, **options):
        built[self.name] = options
        return build(self, model, n, **options)

    monkeypatch.setattr(core_methods.Method, "build", spy)
    out = tmp_path / "d"
    args = ["uci-nng", "--datasets", "yacht", "--methods", "noisy_kfac,bbvi", "--splits", "1",
            "--epochs", "1", "--train-samples", "2", "--damping", "0.01", "--jobs", "1", "--out", str(out),
            "--data-dir", str(data_dir)]  # fmt: skip
    assert main(args) == 0
    assert built["noisy_kfac"]["damping"] == 0.01 and "damping" not in built["bbvi"]
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["protocol"]["damping"] == 0.01
    assert results["runs"]["yacht/noisy_kfac/0"]["settings"]["damping"] == 0.01
    assert "damping" not in results["runs"]["yacht/bbvi/0"]["settings"]
    assert "2 particles, damping γ_ex = 0.01: yacht (1)" in (out / "table.md").read_text()
