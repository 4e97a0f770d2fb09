"""ngvi.optim.sample_preactivations: per-example pre-activation sampling for the diagonal rules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ngvi
from ngvi.baselines import BBVI


def test_preactivations_have_the_diagonal_posteriors_moments():
    """s = Wa + b under W ~ N(M, σ²): mean Ma + m, variance a²σ²ᵀ + σ_b² per example and unit (20000
    rows, each its own draw: within 3% of the variance, 0.03 std of the mean); training and prediction
    work."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    opt = ngvi.VOGN(model, 20, lr=0.05, init_prec=30.0, seed=0)

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    ngvi.optim.sample_preactivations(opt, model)
    for _ in range(3):
        opt.step(closure)
    post = opt.posterior()
    n = 20000
    with torch.no_grad(), opt.plugins[-1].scope(train=True):
        out = model[0](x[:2].repeat(n, 1)).reshape(n, 2, 4)
    mean = x[:2] @ post.mean[0].T + post.mean[1]
    var = x[:2].square() @ post.variance[0].T + post.variance[1]
    assert ((out.mean(0) - mean).abs() / var.sqrt()).max() < 0.03
    assert ((out.var(0) - var) / var).abs().max() < 0.03
    assert ngvi.predict(model, opt, x, samples=3).std(0).min() > 0  # whole-weight draws


def test_refuses_rules_without_a_plain_diagonal_posterior():
    model = nn.Linear(3, 2)
    for opt in (ngvi.NoisyKFAC(model, 10), BBVI(model, 10)):
        with pytest.raises(ValueError, match="needs an ngvi optimizer with a diagonal posterior"):
            ngvi.optim.sample_preactivations(opt, model)
    with pytest.raises(ValueError, match="reads the weight noise"):
        ngvi.optim.sample_preactivations(ngvi.VON(model.parameters(), 10), model)
