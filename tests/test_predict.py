"""ngvi.predict: MC samples, the mean, the linearised predictive, and module modes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ngvi


def setup(dropout=False):
    torch.manual_seed(0)
    layers = [nn.Linear(2, 16), nn.Tanh()] + ([nn.Dropout(0.5)] if dropout else []) + [nn.Linear(16, 1)]
    model = nn.Sequential(*layers).double()
    opt = ngvi.Vadam(model.parameters(), data_size=20, init_prec=400.0, seed=0)
    return model, opt, torch.randn(5, 2, dtype=torch.float64)


def test_mc_samples_shape_restore_and_spread():
    model, opt, x = setup()
    before = [p.detach().clone() for p in model.parameters()]
    out = ngvi.predict(model, opt, x, samples=6)
    assert out.shape == (6, 5, 1)
    assert out.std(0).min() > 0  # the samples differ
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)
    mean_out = ngvi.predict(model, opt, x, samples=0)
    assert mean_out.shape == (1, 5, 1)
    torch.testing.assert_close(mean_out[0], model(x))


def test_predict_uses_eval_mode_and_restores_modes():
    model, opt, x = setup(dropout=True)
    model.train()
    a = ngvi.predict(model, opt, x, samples=0)
    b = ngvi.predict(model, opt, x, samples=0)
    assert torch.equal(a, b)  # dropout off inside predict
    assert all(m.training for m in model.modules())  # modes restored


def test_linearized_predictive_is_exact_for_a_linear_model():
    torch.manual_seed(1)
    model = nn.Linear(3, 2).double()
    opt = ngvi.Vadam(model.parameters(), data_size=10, init_prec=5.0, seed=0)
    x = torch.randn(4, 3, dtype=torch.float64)
    lin = ngvi.predict(model, opt, x, samples=4000, linearized=True)
    # for f(x) = Wx + b the linearisation is exact: Var f_k(x) = Σ_j x_j² σ²_kj + σ²_b
    post = opt.posterior()
    expected_var = (x**2) @ post.variance[0].T + post.variance[1]
    assert ((lin.var(0) / expected_var - 1).abs() < 0.1).all()
    torch.testing.assert_close(lin.mean(0), model(x), atol=0.05, rtol=0)


def test_linearized_matches_mc_for_small_variance():
    model, opt, x = setup()
    torch.manual_seed(0)
    lin = ngvi.predict(model, opt, x, samples=2000, linearized=True)
    mc = ngvi.predict(model, opt, x, samples=2000)
    assert ((lin.std(0) / mc.std(0) - 1).abs() < 0.15).all()


def test_bad_arguments():
    model, opt, x = setup()
    with pytest.raises(ValueError, match="samples"):
        ngvi.predict(model, opt, x, samples=-1)
    with pytest.raises(TypeError, match="sampled_params"):
        ngvi.predict(model, object(), x, samples=2)
    other = nn.Linear(2, 1).double()
    opt_other = ngvi.Vadam(other.parameters(), 10)
    with pytest.raises(ValueError, match="not parameters of the model"):
        ngvi.predict(model, opt_other, x, samples=2, linearized=True)
