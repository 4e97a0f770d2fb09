"""BAdam's default prior keeps σ finite where the data does not constrain a weight (issue 32, item 5)."""

from __future__ import annotations

import math

import torch
from torch import nn

import ngvi

N = 200


def _train(prior_prec: float | None, steps: int = 200):
    """A 1-50-1 ReLU net on y = sin(3x), x ∈ [−1, 1] (units whose kink lies outside the data are dead or
    linear there), plus an input column that is always 0: its weights never get a gradient."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(N, 1, generator=g) * 2 - 1
    y = torch.sin(3 * x) + 0.1 * torch.randn(N, 1, generator=g)
    x = torch.cat([x, torch.zeros_like(x)], 1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 50), nn.ReLU(), nn.Linear(50, 1))
    kwargs = {} if prior_prec is None else {"prior_prec": prior_prec}
    opt = ngvi.BAdam(model.parameters(), N, lr=1e-2, seed=0, **kwargs)
    for _ in range(steps):
        opt.zero_grad()
        out = model(x)
        loss = 0.5 * (out - y).square().mean()
        opt.backward(loss, out)
        opt.step()
    return model, opt, x


def test_default_prior_bounds_sigma_of_weights_without_data():
    _, opt, _ = _train(None)
    std = opt.posterior().std
    # the weights of the always-zero input see only the prior's gradient (λ/N)θ: precision ≈ λ(1 + |θ|)
    unconstrained = std[0][:, 1]
    assert float(unconstrained.min()) > 0.5 and float(unconstrained.max()) <= 1.0
    assert max(float(s.max()) for s in std) <= 1.0  # σ ≤ 1/√λ everywhere
    _, published, _ = _train(0.0, steps=1)  # BADAM as published: σ = 1/√(Nε) ≈ 707 for those weights
    torch.testing.assert_close(
        published.posterior().std[0][:, 1], torch.full((50,), 1 / math.sqrt(N * 1e-8)), rtol=1e-4, atol=0
    )


def test_default_predictive_bands_are_finite_and_of_the_data_scale():
    """The sampled predictive s.d. on the training inputs stays below 10 (y has s.d. ≈ 0.7), the linearised
    one below 2; with λ = 0 the sampled one is ~10⁵ or more (measured)."""
    model, opt, x = _train(None)
    torch.manual_seed(1)
    sampled = ngvi.predict(model, opt, x, samples=64).std(0).median()
    linearised = ngvi.predict(model, opt, x, samples=64, linearized=True).std(0).median()
    assert float(sampled) < 10.0 and float(linearised) < 2.0, (sampled, linearised)
