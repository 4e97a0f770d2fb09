"""`ngvi logreg`: the registry's trainers on a bare nn.Linear with a bias column, the protocol's pieces
against their definitions, and the reduced run through the CLI (files, the claims' lines, USPS's rows)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from ngvi.experiments.cli import main
from ngvi.experiments.core import training
from ngvi.experiments.core.methods import METHODS
from ngvi.experiments.logreg import protocol, toy
from ngvi.experiments.logreg.protocol import ALL_METHODS


def _logistic_data(n: int = 40, d: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.cat(
        [torch.ones(n, 1, dtype=torch.float64), torch.randn(n, d, generator=g, dtype=torch.float64)], 1
    )
    y = (
        torch.rand(n, generator=g, dtype=torch.float64)
        < torch.sigmoid(x @ torch.tensor([0.5, 1.0, -1.0, 2.0]).double())
    ).double()
    return x, y


@pytest.mark.parametrize("name", ALL_METHODS)
def test_every_trainer_fits_a_bare_linear_model_with_a_bias_column(name):
    """Logistic regression has no hidden layer: each registry trainer runs on nn.Linear(D + 1, 1, bias=False)
    (the bias is the column of ones), keeps its posterior shaped like the weight, and lowers the loss."""
    x, y = _logistic_data()
    rec = protocol.recipe(name, len(x), 8)
    before = protocol.bce_loss(protocol.linear_model(x.shape[1])(x), y).item()
    q, _, _ = protocol.fit(name, x, y, 1.0, rec, steps=150, seed=0)
    assert q.mean[0].shape == (x.shape[1],) and bool(torch.isfinite(q.variance[0]).all())
    after = protocol.bce_loss(x @ q.mean[0].unsqueeze(1), y).item()
    assert after < before


def test_vogn_curvature_of_the_bias_column_is_the_per_example_square():
    """VOGN's hooks on the bare Linear give every weight, the bias column's included, the mean of the squared
    per-example gradients ((sigmoid(xᵢᵀθ) − yᵢ) xᵢⱼ)² (here at θ ≈ μ: q is narrow, β = 1 so s = ĥ)."""
    x, y = _logistic_data()
    n, lam = len(x), 1.0
    model = protocol.linear_model(x.shape[1], torch.tensor([0.2, -0.3, 0.4, 0.1]).double())
    trainer = METHODS["vogn"].build(model, n, lr=0.0, beta=1.0, prior_prec=lam, init_prec=1e16, seed=0)
    training.train(model, trainer, x, y, protocol.bce_loss, epochs=1)
    mu = model.weight.detach()[0]
    per_example = (torch.sigmoid(x @ mu) - y).unsqueeze(1) * x  # [N, D]
    expected = per_example.square().mean(0)
    s = 1.0 / (n * trainer.posterior().variance[0][0]) - lam / n
    torch.testing.assert_close(s, expected, rtol=1e-6, atol=1e-12)


def test_schedule_and_step_size_mapping():
    """Eq. 104's decay, and Vadam's α₀ in ngvi units (√N times the authors'), VOGN-1's heavy-ball form."""
    assert protocol.decay(1) == 0.5 and protocol.decay(100) == pytest.approx(1 / (1 + 100**0.55))
    rec = protocol.vadam_recipe(341, 32)
    assert rec.options["lr"] == pytest.approx(0.01 * math.sqrt(341)) and rec.batch_size == 32
    assert rec.schedule(10) == {
        "lr": pytest.approx(0.01 * math.sqrt(341) / (1 + 10**0.55)),
        "betas": (0.9, pytest.approx(1 - 0.01 / (1 + 10**0.55))),
    }
    vogn = protocol.vogn1_recipe()
    assert vogn.batch_size == 1 and vogn.schedule is None
    assert vogn.options == {"lr": pytest.approx(5e-5), "beta": 5e-4, "momentum": pytest.approx(0.9)}


def test_toy_data_and_true_posterior_grid():
    """Murphy's two classes as the authors draw them; the grid posterior is normalised, and with no data it
    is the prior N(0, I/λ) (its moments on a wide grid)."""
    x, y = toy.murphy_data()
    assert (
        x.shape == (60, 2)
        and y.sum() == 30
        and bool((x[:30].mean(0) - torch.tensor([1.0, 5.0])).abs().max() < 0.5)
    )
    grid = np.linspace(-60, 60, 601)
    prior = toy.true_posterior(x[:0], y[:0], grid, grid, prior_prec=0.01)
    assert prior.density.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(prior.mean, 0.0, atol=1e-9)
    np.testing.assert_allclose(np.diag(prior.cov), 100.0, rtol=1e-3)


def test_quick_run_writes_figures_table_and_the_claims(tmp_path, data_dir):
    out = tmp_path / "logreg"
    args = ["logreg", "--quick", "--methods", "vogn,vadam,ivon", "--batch-sizes", "1,64"]
    args += ["--out", str(out), "--jobs", "1", "--data-dir", str(data_dir)]
    assert main(args) == 0
    for png in ("fig2a_toy.png", "fig2b_breast_cancer.png", "fig2b_usps_3vs5.png", "fig2c_minibatch.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    table = (out / "table.md").read_text()
    assert "1540 rows" in table and "1781" in table  # our USPS 3-vs-5 is the authors' code's, and says so
    assert "falls as M falls" in table and "below Vadam's at M = 64" in table
    results = json.loads((out / "results.json").read_text())
    assert len(results["references"]) == 1 + 2 * 2 + 1  # toy, 2 splits of 2 data sets, Fig. 2c's split
    for ref in results["references"].values():
        assert ref["max_gradient"] < 1e-6  # MF-Exact converged
    # the pilot ran IVON with 3 step sizes on split 0 of each data set, and its choice was used
    assert len(results["pilot"]) == 2 * 3 and "(chosen)" in table
    runs = results["runs"]
    assert len(runs) == 2 + 2 * 2 * 3 + 3 * 2
    assert all(r["sym_kl"] > 0 for r in runs.values())
    # rerunning resumes: nothing is trained again, the same table comes out
    assert main(args) == 0
    assert (out / "table.md").read_text() == table
