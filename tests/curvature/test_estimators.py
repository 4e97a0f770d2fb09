"""The curvature estimators as components, against analytic truths.

Tolerances: Monte Carlo means are held to 5 standard errors of the estimator's own (analytic) spread, so a
correct estimator fails with probability < 1e-6 per check; deterministic identities to float64 round-off.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

import ngvi
from ngvi._tensorlist import TensorList
from ngvi.curvature.estimators import CurvatureInput, GradientSquares, Hutchinson, Price, estimator_for
from ngvi.curvature.layer import KroneckerFactors, PerExampleGGN


def sample_input(params, grads, noise=None, sqrt_prec=None, seed=0, group=None):
    gen = torch.Generator().manual_seed(seed)
    return CurvatureInput(
        group or {"params": params},
        params,
        TensorList(grads),
        None if noise is None else TensorList(noise),
        [{} for _ in params],
        lambda: TensorList(sqrt_prec),
        lambda device: gen,
        0,
    )


def test_gradient_squares_is_the_squared_gradient():
    g = torch.randn(5, dtype=torch.float64)
    (h,) = GradientSquares().estimate(sample_input([torch.zeros(5)], [g]))
    assert torch.equal(h, g * g)


def test_price_estimator_is_unbiased_for_a_quadratic():
    """f(θ) = ½ Σ aᵢθᵢ²: ĝ = a⊙θ with θ = μ + σε, and E[ĝ⊙ε/σ] = a, with variance a²(μ²/σ² + 2)."""
    n = 200_000
    a, mu, sigma = (
        torch.tensor([0.5, 2.0, 7.0]),
        torch.tensor([1.0, -0.3, 0.2]),
        torch.tensor([0.1, 0.5, 1.0]),
    )
    gen = torch.Generator().manual_seed(0)
    eps = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    theta = mu + sigma * eps
    (h,) = Price().estimate(sample_input([theta], [a * theta], [eps], [(1 / sigma).expand(n, 3)]))
    stderr = (a.double() ** 2 * (mu.double() ** 2 / sigma.double() ** 2 + 2)).sqrt() / math.sqrt(n)
    assert ((h.mean(0) - a) / stderr).abs().max() < 5


def test_hutchinson_is_exact_for_a_diagonal_hessian_and_unbiased_otherwise():
    """z⊙(Hz) with Rademacher z: for diagonal H it is diag(H) at every draw; in general
    E[zᵢ(Hz)ᵢ] = Hᵢᵢ with variance Σⱼ≠ᵢ Hᵢⱼ²."""
    torch.manual_seed(0)
    root = torch.randn(4, 4, dtype=torch.float64)
    full = root @ root.T + torch.eye(4, dtype=torch.float64)
    for hessian, draws in (
        (torch.diag(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)), 3),
        (full, 3000),
    ):
        theta = nn.Parameter(torch.randn(4, dtype=torch.float64))
        estimates = []
        for seed in range(draws):
            theta.grad = None
            (0.5 * theta @ hessian @ theta).backward(create_graph=True)
            (h,) = Hutchinson().estimate(sample_input([theta], [theta.grad.detach()], seed=seed))
            estimates.append(h)
            assert theta.grad.grad_fn is None  # the graph is released after the product
        mean = torch.stack(estimates).mean(0)
        spread = ((hessian**2).sum(1) - hessian.diagonal() ** 2).sqrt() / math.sqrt(draws)
        assert ((mean - hessian.diagonal()).abs() <= 5 * spread + 1e-12).all()


def test_hutchinson_without_a_graph_says_how_to_get_one():
    theta = nn.Parameter(torch.ones(2))
    (theta**2).sum().backward()
    with pytest.raises(RuntimeError, match="create_graph=True"):
        Hutchinson().estimate(sample_input([theta], [theta.grad]))


def _mlp() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()


def _per_example_grads(model, x, y):
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        return 0.5 * (functional_call(model, p, (xi[None],)) - yi[None]).square().sum()

    return vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)


def test_per_example_ggn_is_the_mean_of_squared_per_example_gradients():
    model = _mlp()
    x, y = torch.randn(7, 3, dtype=torch.float64), torch.randn(7, 2, dtype=torch.float64)
    estimator = PerExampleGGN(model)
    params = list(model.parameters())
    with estimator.scope(train=True):
        estimator.backward(0.5 * (model(x) - y).square().sum(1).mean(), None, lambda d: None)
        h = estimator.estimate(sample_input(params, [p.grad for p in params]))
    brute = _per_example_grads(model, x, y)
    for (name, _), hi in zip(model.named_parameters(), h, strict=True):
        torch.testing.assert_close(hi, brute[name].square().mean(0), rtol=1e-12, atol=1e-14)


def test_kronecker_factors_are_the_layer_input_and_output_gradient_moments():
    """Â = (1/M)Σᵢ āᵢāᵢᵀ with ā = [a, 1]; Ŝ = (1/M)Σᵢ δᵢδᵢᵀ with δᵢ = ∂fᵢ/∂sᵢ (per-example loss)."""
    model = _mlp()
    x, y = torch.randn(6, 3, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
    estimator = KroneckerFactors(model)
    params = list(model.parameters())
    with estimator.scope(train=True):
        out = model(x)
        estimator.backward(0.5 * (out - y).square().sum(1).mean(), None, lambda d: None)
        flat = estimator.estimate(sample_input(params, [p.grad for p in params], group={"stats_every": 1}))
    last = flat[2]  # the second Linear layer's factors travel with its weight
    hidden = torch.tanh(model[0](x))
    a_bar = torch.cat([hidden, torch.ones(6, 1, dtype=torch.float64)], 1)
    delta = (out - y).detach()  # ∂fᵢ/∂sᵢ of the per-example loss ½‖sᵢ − yᵢ‖²
    a_exact, s_exact = a_bar.T @ a_bar / 6, delta.T @ delta / 6
    torch.testing.assert_close(last[:25].view(5, 5), a_exact, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(last[25:].view(2, 2), s_exact, rtol=1e-12, atol=1e-14)
    assert flat[3].numel() == 1  # the bias carries a placeholder


def test_each_rule_accepts_only_estimators_that_keep_its_state_valid():
    model = nn.Linear(2, 1)
    with pytest.raises(ValueError, match=r"curvature must be one of \('price', 'hutchinson'\)"):
        ngvi.VON(model.parameters(), 8, curvature="ef")
    with pytest.raises(ValueError, match=r"curvature must be one of \('ef', 'fisher'\)"):
        ngvi.VOGN(model, 8, curvature="price")
    assert isinstance(estimator_for(Price(), ("price",)), Price)
    assert ngvi.VON(model.parameters(), 8, curvature=Hutchinson()).curvature == "hutchinson"
    for opt, name in [(ngvi.Vadam(model.parameters(), 8), "grad2"),
                      (ngvi.IVON(model.parameters(), 8), "price"),
                      (ngvi.VOGN(model, 8, curvature="fisher", likelihood="gaussian"), "fisher"),
                      (ngvi.BAdam(model.parameters(), 8), None)]:  # fmt: skip
        assert opt.curvature == name
