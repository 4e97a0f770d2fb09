"""`ngvi demo` in its reduced form: runs through the CLI, writes its PNG, table and results, resumes, shows
every band whole, and refuses an unusable --out before it trains anything; and its reference is the exact
posterior of the demo's own network and loss, whose draws meet the convergence targets."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ngvi.baselines.nuts import effective_sample_size, split_r_hat
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
    # the reference is exact even in --quick: its row is there and its draws met the targets
    assert "| Exact posterior (reference) |" in table and "MISSED" not in table
    assert "| 95% coverage | r with exact variance |" in table
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert set(runs) == {"exact", "exact_mf", "vadam", "badam"}
    n_test = len(toy_regression().x_test)
    for r in runs.values():
        assert len(r["pred_mean"]) == len(r["pred_std"]) == n_test
        assert 0 <= r["coverage95"] <= 1
        assert 0 < r["train_range_rmse"] < r["test_rmse"] < 5  # the fit is better where the data is
    # coverage is the fraction of targets inside mean ± 1.96·sqrt(std² + 1/τ)
    data, r = toy_regression(), runs["vadam"]
    half = demo.Z95 * np.sqrt(np.square(r["pred_std"]) + 1 / demo.NOISE_PREC)
    inside = np.abs(data.y_test[:, 0].numpy() - np.array(r["pred_mean"])) <= half
    assert r["coverage95"] == pytest.approx(inside.mean())
    # a rerun with one more method trains only that one (the others come from the cache)
    assert main([*args, "--methods", "vadam,badam,vprop"]) == 0
    again = json.loads((out / "results.json").read_text())["runs"]
    assert again["vadam"] == runs["vadam"] and again["exact"] == runs["exact"] and "vprop" in again


def test_the_reference_is_the_exact_posterior_of_the_demos_network_and_loss():
    """Checked against the model itself, not the closed form: the posterior's log-density, −N·(the demo's
    mean NLL) − (λ/2)‖θ‖², through the demo's network in float64, has zero gradient at the reference's mean
    and a Hessian equal to minus the inverse of its covariance (the log-density is quadratic: the network is
    linear in its parameters). Tolerances: round-off of float64 solves at condition number ~10⁶."""
    seed = 0
    mean, cov = demo.exact_posterior(seed)
    model = demo.network(seed).double()
    assert sum(p.numel() for p in model.parameters()) == len(mean) == demo.HIDDEN + 1  # the output layer only
    data = toy_regression(seed=seed)  # the float32 data the optimizers train on, in float64 below
    x, y = data.x_train.double(), data.y_train.double()
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]

    def log_posterior(theta: torch.Tensor) -> torch.Tensor:
        params = dict(zip(names, theta.split([s.numel() for s in shapes]), strict=True))
        params = {n: v.reshape(s) for (n, v), s in zip(params.items(), shapes, strict=True)}
        out = torch.func.functional_call(model, params, (x,))
        return -demo.DATA_SIZE * demo._mean_nll(out, y) - 0.5 * demo.PRIOR_PREC * (theta**2).sum()

    grad = torch.func.grad(log_posterior)(mean)
    scale = torch.func.grad(log_posterior)(torch.zeros_like(mean)).abs().max()
    assert float(grad.abs().max()) < 1e-9 * float(scale)  # the mode (= the mean for a Gaussian)
    hessian = torch.func.hessian(log_posterior)(mean)
    precision = torch.linalg.inv(cov)
    assert torch.allclose(-hessian, precision, rtol=1e-6, atol=1e-6 * float(precision.abs().max()))
    theta = mean + torch.randn(len(mean), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(torch.func.hessian(log_posterior)(theta), hessian)  # the same anywhere: Gaussian


def test_the_reference_draws_meet_the_targets_and_match_the_exact_moments():
    """Split R-hat ≤ 1.05 and ESS ≥ 100 for every f(x), computed from the draws; the draws' mean and variance
    of f agree with the closed form within Monte-Carlo error (4 standard errors each, 1000 independent draws:
    for the variance, se = σ²·√(2/(n−1)))."""
    seed = 0
    mean, cov = demo.exact_posterior(seed)
    draws = demo.reference_draws(seed, mean, cov)  # [chains, samples, n_test]
    chains, samples = demo.REFERENCE_DRAWS["chains"], demo.REFERENCE_DRAWS["samples"]
    assert draws.shape == (chains, samples, len(toy_regression().x_test))
    r_hat, ess = split_r_hat(draws), effective_sample_size(draws)
    assert float(r_hat.max()) <= demo.TARGET_R_HAT and float(ess.min()) >= demo.TARGET_ESS
    r = demo.exact_reference(seed)
    assert r["output_max_r_hat"] == pytest.approx(float(r_hat.max()))
    assert r["output_min_ess"] == pytest.approx(float(ess.min())) and demo.reference_ok(r)
    flat = draws.reshape(chains * samples, -1)
    f_mean, f_std = torch.tensor(r["pred_mean"], dtype=torch.float64), torch.tensor(r["pred_std"])
    n = flat.shape[0]
    assert ((flat.mean(0) - f_mean).abs() <= 4 * f_std / n**0.5).all()
    assert ((flat.var(0) - f_std**2).abs() <= 4 * f_std**2 * (2 / (n - 1)) ** 0.5).all()
    # the band grows away from the data: the exact posterior is widest at the ends of the test range
    inside = (toy_regression().x_test[:, 0] > 0) & (toy_regression().x_test[:, 0] < 0.5)
    assert float(f_std[~inside].max()) > 20 * float(f_std[inside].max())


def test_the_fixed_layer_is_seeded_within_its_range_and_has_no_parameters():
    a, b = demo.network(3), demo.network(3)
    features = a[0]
    assert list(features.parameters()) == [] and torch.equal(features.kink, b[0].kink)
    assert torch.equal(a[1].weight, b[1].weight)  # the output layer's start is seeded too
    low, high = demo.KINKS
    assert float(features.kink.min()) >= low and float(features.kink.max()) <= high
    assert set(features.slope.abs().tolist()) == {demo.SLOPE} and {-1.0, 1.0} <= set(
        features.slope.sign().tolist()
    )
    x = torch.tensor([[float(features.kink[0])]])
    assert float(features(x)[0, 0]) == 0.0  # each unit's kink is where it switches on


def test_the_reference_counts_as_converged_only_within_both_targets():
    ok = {"output_max_r_hat": 1.04, "output_min_ess": 150.0}
    assert demo.reference_ok(ok)
    assert not demo.reference_ok({**ok, "output_max_r_hat": 2.18})
    assert not demo.reference_ok({**ok, "output_min_ess": 7.0})


def test_the_correlation_with_the_exact_variance_is_pearson_of_variances():
    std = np.linspace(0.1, 1.0, 50)
    exact = {"pred_std": std.tolist()}
    assert demo._exact_correlation({"pred_std": (2 * std).tolist()}, exact) == "1.00"
    assert demo._exact_correlation({"pred_std": [0.3] * 50}, exact) == "–"  # no variation: no correlation
    assert demo._exact_correlation({"pred_std": std.tolist()}, None) == "–"


def test_every_method_runs(tmp_path):
    assert main(["demo", "--steps", "5", "--out", str(tmp_path), "--jobs", "2"]) == 0
    rows = [line for line in (tmp_path / "table.md").read_text().splitlines() if line.startswith("| ")]
    assert len(rows) == 3 + len(demo.OPTIONS)  # the header, the two references and one row per optimizer


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
