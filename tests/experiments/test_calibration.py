"""`ngvi calibration`: its metrics against predictives whose calibration is known exactly, its problems, its
criteria, and a reduced run through the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ngvi.experiments.calibration import measure, problems
from ngvi.experiments.calibration.experiment import METHOD_NAMES, applies, nng_full_limit
from ngvi.experiments.calibration.report import cell, label, problem_table, summary_cell, verdicts
from ngvi.experiments.cli import main
from ngvi.experiments.core.report import markdown_table

N = 40_000


def _normal_quantiles(s: int) -> torch.Tensor:
    """Φ⁻¹((k + ½)/S), k < S: S draws whose empirical distribution is N(0, 1) up to O(1/S)."""
    p = (torch.arange(s, dtype=torch.float64) + 0.5) / s
    return math.sqrt(2) * torch.special.erfinv(2 * p - 1)


def _binomial_tolerance(p: float, n: int) -> float:
    return 4 * math.sqrt(p * (1 - p) / n)  # 4 s.e.: fails by chance about once in 16,000 runs


def test_coverage_and_nll_of_an_exactly_known_gaussian_predictive():
    """y ~ N(f, σ² + τ²) and a predictive whose draws f + τ·zₛ (zₛ normal quantiles) with noise σ form
    N(f, σ² + τ²): the 95% interval covers 0.95 of the points (binomial tolerance) and the NLL is that
    Gaussian's, ½log(2π(σ² + τ²)) + ½ on average (CLT tolerance)."""
    g = torch.Generator().manual_seed(0)
    sigma, tau = 0.3, 0.4
    f = torch.randn(N, 1, generator=g, dtype=torch.float64)
    y = f + math.hypot(sigma, tau) * torch.randn(N, 1, generator=g, dtype=torch.float64)
    samples = f.unsqueeze(0) + tau * _normal_quantiles(400).view(-1, 1, 1)
    r = measure.regression_metrics(samples, y, sigma)
    assert r["coverage95"] == pytest.approx(0.95, abs=_binomial_tolerance(0.95, N))
    var = sigma**2 + tau**2
    expected = 0.5 * math.log(2 * math.pi * var) + 0.5  # E[−log N(y; f, var)]
    assert r["nll"] == pytest.approx(expected, abs=4 * math.sqrt(0.5 / N))  # Var[½z²] = ½
    assert r["rmse"] == pytest.approx(math.sqrt(var), rel=0.02)
    assert r["calibration_error"] < 0.01


def test_coverage_of_a_band_half_as_wide_as_the_noise():
    """A point predictor at the truth that claims noise σ/2 when it is σ covers P(|Z| ≤ 1.96/2), and its
    NLL is ½log(2π(σ/2)²) + ½·E[y − f]²/(σ/2)² = ½log(πσ²/2) + 2."""
    g = torch.Generator().manual_seed(1)
    sigma = 0.5
    f = torch.randn(N, 1, generator=g, dtype=torch.float64)
    y = f + sigma * torch.randn(N, 1, generator=g, dtype=torch.float64)
    r = measure.regression_metrics(f.unsqueeze(0), y, sigma / 2)
    truth = math.erf(1.959964 / 2 / math.sqrt(2))
    assert r["coverage95"] == pytest.approx(truth, abs=_binomial_tolerance(truth, N))
    assert r["nll"] == pytest.approx(0.5 * math.log(math.pi * sigma**2 / 2) + 2, abs=4 * math.sqrt(8 / N))


def _logits(confidence: torch.Tensor) -> torch.Tensor:
    """Logit samples [1, N, 2] whose class 0 has probability ``confidence``."""
    return torch.stack([confidence, 1 - confidence], -1).log().unsqueeze(0)


def test_ece_of_a_calibrated_and_of_an_overconfident_classifier():
    """Labels drawn so that the top class is right with probability equal to its confidence: ECE ≈ 0 (what
    is left is the bins' sampling noise); always 0.9 confident but right 70% of the time: ECE = 0.2."""
    g = torch.Generator().manual_seed(2)
    confidence = 0.5 + 0.5 * torch.rand(N, generator=g, dtype=torch.float64)
    y = (torch.rand(N, generator=g, dtype=torch.float64) >= confidence).long()  # class 0 w.p. confidence
    calibrated = measure.classifier_metrics(_logits(confidence), y)
    assert calibrated["ece"] < 0.01
    assert calibrated["accuracy"] == pytest.approx(0.75, abs=_binomial_tolerance(0.75, N))
    y = (torch.rand(N, generator=g, dtype=torch.float64) >= 0.7).long()
    over = measure.classifier_metrics(_logits(torch.full((N,), 0.9, dtype=torch.float64)), y)
    assert over["ece"] == pytest.approx(0.2, abs=_binomial_tolerance(0.7, N))
    nll = -(0.7 * math.log(0.9) + 0.3 * math.log(0.1))
    assert over["nll"] == pytest.approx(nll, abs=4 * math.sqrt(0.21 / N) * math.log(9))


def test_spread_and_its_far_near_ratio():
    """The s.d. across draws: a·z (z two values ±1) has s.d. a·√(S/(S−1)) at every point; three times the
    spread far out is a ratio of 3; one draw (a point estimate) has none, and no ratio."""
    z = torch.tensor([1.0, -1.0] * 4, dtype=torch.float64).view(-1, 1, 1)
    near, far = 0.2 * z.expand(8, 5, 1), 0.6 * z.expand(8, 5, 1)
    assert measure.spread(near, "regression") == pytest.approx(0.2 * math.sqrt(8 / 7), rel=1e-12)
    sd = {"x1": measure.spread(near, "regression"), "x3": measure.spread(far, "regression")}
    assert measure.far_near(sd, "x3") == pytest.approx(3.0, rel=1e-12)
    assert measure.spread(near[:1], "regression") == 0.0
    assert measure.far_near({"x1": 0.0, "x3": 0.0}, "x3") is None
    # classification: the s.d. of the class probabilities; two draws at p = 0.5 ± d give d·√2 per class
    logits = torch.stack([_logits(torch.full((3,), 0.6))[0], _logits(torch.full((3,), 0.4))[0]])
    assert measure.spread(logits, "classification") == pytest.approx(0.1 * math.sqrt(2), rel=1e-6)


def test_criteria_at_their_boundaries_and_a_diverged_seed_misses_all():
    ensemble = {"nll": 0.4, "ece": 0.05}
    inside = {"nll": 0.55, "coverage95": 0.90, "far_near": 1.01}
    assert measure.criteria("regression", inside, ensemble) == {
        "nll": True,
        "calibration": True,
        "growing": True,
    }
    outside = {"nll": 0.56, "coverage95": 0.995, "far_near": 0.99}
    assert measure.criteria("regression", outside, ensemble) == {
        "nll": False,
        "calibration": False,
        "growing": False,
    }
    assert measure.criteria("classification", {"nll": 0.3, "ece": 0.07, "far_near": None}, ensemble) == {
        "nll": True,
        "calibration": True,
        "growing": None,
    }
    assert not measure.criteria("classification", {"nll": 0.3, "ece": 0.0701}, ensemble)["calibration"]
    cell = {"paired": {"nll": 0.3, "ece": 0.0}, "ensemble": ensemble, "far_near": (2.0, 0.1, 2)}
    assert verdicts("classification", {**cell, "diverged": {}}) == {
        "nll": True,
        "calibration": True,
        "growing": True,
    }
    missed = verdicts("classification", {**cell, "diverged": {2: "NonFiniteGradientError at step 5"}})
    assert missed == {"nll": False, "calibration": False, "growing": False}


@pytest.mark.parametrize("name", list(problems.PROBLEMS))
def test_problems_draw_what_they_say(name):
    p = problems.PROBLEMS[name]
    draw = p.data(0, n_test=50)
    assert draw.x_train.shape == (p.n_train, p.inputs) and draw.x_test.shape == (50, p.inputs)
    assert p.weights() == sum(w.numel() for w in p.net().parameters())
    assert torch.allclose(draw.probes["x1"], draw.x_test, atol=1e-6)  # c = 1 is the test set
    centre = draw.x_train.mean(0)
    assert torch.allclose(draw.probes["x3"] - centre, 3 * (draw.x_test - centre), atol=1e-5)
    if p.task == "classification":
        assert set(draw.y_train.tolist()) == set(range(p.outputs))
    else:
        assert draw.y_train.shape == (p.n_train, 1)
    assert torch.equal(p.data(0, n_test=50).x_train, draw.x_train)  # seeded
    assert not torch.equal(p.data(1, n_test=50).x_train, draw.x_train)
    assert applies("nng_full", p) == (p.weights() <= nng_full_limit())


def test_quick_run_writes_results_table_and_figures(tmp_path):
    """Two problems, two rules and the references through the CLI: a result per (problem, method) with the
    task's metrics, a table with the criteria and both figures; a rerun resumes (no job reruns)."""
    out = tmp_path / "cal"
    argv = ["calibration", "--quick", "--problems", "regression_gap,moons", "--methods", "vadam,nng_full"]
    argv += ["--steps", "15", "--samples", "4", "--out", str(out), "--jobs", "1"]
    assert main(argv) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    expected = {
        f"{p}/{m}/seed0" for p in ("regression_gap", "moons") for m in ("map", "deep_ensemble", "vadam")
    }
    expected |= {f"{p}/nng_full/seed0" for p in ("regression_gap", "moons")}  # both nets are small enough
    assert set(runs) == expected
    for key, r in runs.items():
        if "diverged" in r:
            continue
        assert ("coverage95" in r) == key.startswith("regression") and ("ece" in r) == key.startswith("moons")
        assert r["draws"] == {"map": 1, "deep_ensemble": 5}.get(key.split("/")[1], 4)
        assert set(r["sd"]) == {"x1", "x2", "x3", "x4"} | ({"gap"} if key.startswith("regression") else set())
        assert (r["sd"]["x1"] == 0.0) == key.endswith("map/seed0")
    table = (out / "table.md").read_text()
    assert "## Summary: criteria met (✓) or missed (✗)" in table and "| Vadam |" in table
    assert "s.d. gap/near" in table
    for png in ("calibration.png", "spread.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    before = (out / "results.json").read_text()
    assert main(argv) == 0
    assert json.loads((out / "results.json").read_text())["runs"] == json.loads(before)["runs"]


def test_every_posterior_rule_of_the_registry_is_measured():
    """The registry's posterior methods, less MC dropout (its rate is part of the network, not a default)
    and the K-FAC point estimate."""
    from ngvi.experiments.core.methods import METHODS

    assert set(METHODS) - set(METHOD_NAMES) == {"mc_dropout", "kfac"}


def test_the_committed_tables_are_the_reports_of_the_committed_results():
    """docs/results/calibration: table.md's per-problem tables and its summary (the criteria met and the mean
    cost) are what the report computes from the committed results.json, and the README's summary is table.md's
    (the README's prose is checked by tests/test_results_claims.py)."""
    folder = Path(__file__).resolve().parents[2] / "docs" / "results" / "calibration"
    if not (folder / "results.json").is_file():
        pytest.skip("docs/results/calibration/results.json is absent")
    runs = json.loads((folder / "results.json").read_text())["runs"]
    names = list(problems.PROBLEMS)
    cells = {p: {m: cell(runs, p, m, 3) for m in METHOD_NAMES} for p in names}
    rows = []
    for m in METHOD_NAMES:
        costs = [cells[p][m]["cost"] for p in names if cells[p][m] is not None and "cost" in cells[p][m]]
        summary = [summary_cell(problems.PROBLEMS[p].task, m, cells[p][m]) for p in names]
        rows.append([label(m), f"{np.mean(costs):.1f}", *summary])
    body = markdown_table(["method", "train cost × MAP (mean)", *names], rows)
    table = (folder / "table.md").read_text()
    assert body in table
    assert body in (folder / "README.md").read_text()
    for p in names:
        assert problem_table(p, list(METHOD_NAMES), cells[p]) in table
