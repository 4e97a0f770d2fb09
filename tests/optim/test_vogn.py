"""VOGN: the update rule (eqs. 7, 9, 10; App. E momentum), exactness on Bayesian linear regression, the
closure contracts and the hooks. (The guarantees every trainer gives, for both curvatures, restore, NaN,
resume, copying, validation: tests/optim/test_guarantees.py and test_contract.py.)"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ngvi
from conftest import bayesian_linear_regression, fit_full_batch_regression


def small_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 5 * 5, 4))


def batch(seed: int = 1, m: int = 8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, 1, 5, 5, generator=g), torch.randint(0, 4, (m,), generator=g)


def ef_closure(opt, model, x, y, reduction="mean"):
    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y, reduction=reduction)
        loss.backward()
        return loss

    return closure


def fisher_closure(opt, model, x, y):
    def closure():
        opt.zero_grad()
        out = model(x)
        return F.cross_entropy(out, y), out

    return closure


def per_example_mean_sq(model, x, y) -> list[torch.Tensor]:
    """(1/M) Σᵢ (∇fᵢ)² by a loop over single examples, at the model's current weights (on a copy, so that
    the optimizer's hooks do not record the loop)."""
    model = copy.deepcopy(model)
    acc = [torch.zeros_like(p) for p in model.parameters()]
    for i in range(x.shape[0]):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for a, p in zip(acc, model.parameters(), strict=True):
            a += p.grad.square()
    return [a / x.shape[0] for a in acc]


# ------------------------------------------------------------------------------------------------------------
# The rule
# ------------------------------------------------------------------------------------------------------------
def test_one_step_is_eqs_7_9_10():
    """s ← (1−β)s + βĥ with ĥ the per-example mean square at the sample; μ ← μ − α(ĝ + λ̃μ)/(s + λ̃)."""
    model = small_net().double()
    x, y = batch()
    x = x.double()
    n, lr, beta, prior, init = 100, 0.05, 0.3, 2.0, 50.0
    # the equations alone: no trust region (kl_clip="auto" caps a numeric start too, issue 42)
    opt = ngvi.VOGN(model, n, lr=lr, beta=beta, prior_prec=prior, init_prec=init, seed=0, kl_clip=None)
    mu = [p.detach().clone() for p in model.parameters()]
    with opt.sampled_params(train=True):
        h_hat = per_example_mean_sq(model, x, y)  # at the sample θ
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        g_hat = [p.grad.clone() for p in model.parameters()]
    opt.step()
    s0, prior_tilde = (init - prior) / n, prior / n
    for p, m, g, h in zip(model.parameters(), mu, g_hat, h_hat, strict=True):
        s1 = (1 - beta) * s0 + beta * h
        torch.testing.assert_close(opt.state[p]["hess"], s1, rtol=1e-12, atol=0)
        torch.testing.assert_close(p.detach(), m - lr * (g + prior_tilde * m) / (s1 + prior_tilde))


def test_natural_momentum_is_eqs_82_83():
    """μ_{t+1} = μ_t − α(ĝ + λ̃μ_t)/(s_{t+1}+λ̃) + γ (s_t+λ̃)/(s_{t+1}+λ̃) (μ_t − μ_{t−1}), over three steps."""
    model = small_net().double()
    x, y = batch()
    x = x.double()
    n, lr, beta, gamma, prior = 50, 0.02, 0.2, 0.7, 1.0
    opt = ngvi.VOGN(model, n, lr=lr, beta=beta, momentum=gamma, prior_prec=prior, init_prec=30.0, seed=1)
    prior_tilde = prior / n
    params = list(model.parameters())
    prev = [p.detach().clone() for p in params]
    for _ in range(3):
        mu = [p.detach().clone() for p in params]
        s_old = [opt.state[p]["hess"].clone() if p in opt.state else None for p in params]
        with opt.sampled_params(train=True):
            h_hat = per_example_mean_sq(model, x, y)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            g_hat = [p.grad.clone() for p in params]
        opt.step()
        for i, p in enumerate(params):
            s0 = s_old[i] if s_old[i] is not None else torch.full_like(p, (30.0 - prior) / n)
            s1 = (1 - beta) * s0 + beta * h_hat[i]
            expected = (
                mu[i]
                - lr * (g_hat[i] + prior_tilde * mu[i]) / (s1 + prior_tilde)
                + gamma * (s0 + prior_tilde) / (s1 + prior_tilde) * (mu[i] - prev[i])
            )
            torch.testing.assert_close(p.detach(), expected, rtol=1e-10, atol=1e-13)
        prev = mu


def test_sum_reduction_takes_the_same_step_as_mean():
    x, y = batch()
    results = []
    for reduction in ("mean", "sum"):
        model = small_net().double()
        opt = ngvi.VOGN(model, 64, lr=0.1, beta=0.1, init_prec=10.0, loss_reduction=reduction, seed=3)
        for _ in range(3):
            opt.step(ef_closure(opt, model, x.double(), y, reduction))
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("curvature", ["ef", "fisher"])
def test_mc_samples_average_curvature(curvature):
    """With mc_samples=3, s moves towards the mean of three per-sample ĥ (checked via the manual form)."""
    x, y = batch()
    kw = dict(curvature=curvature, likelihood="categorical") if curvature == "fisher" else {}
    model = small_net().double()
    a = ngvi.VOGN(model, 64, lr=0.1, beta=0.5, init_prec=10.0, mc_samples=3, seed=5, **kw)
    closure = fisher_closure if curvature == "fisher" else ef_closure
    a.step(closure(a, model, x.double(), y))
    twin = small_net().double()
    b = ngvi.VOGN(twin, 64, lr=0.1, beta=0.5, init_prec=10.0, seed=5, **kw)
    for _ in range(3):
        with b.sampled_params(train=True):
            b.zero_grad()
            out = twin(x.double())
            b.backward(F.cross_entropy(out, y), out)
    b.step()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(a.state[p]["hess"], b.state[q]["hess"], rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------------------------------------------------
# Exactness: Bayesian linear regression
# ------------------------------------------------------------------------------------------------------------
def test_fisher_vogn_reaches_the_exact_mean_field_posterior():
    """Full batch, sampled targets: mean within 0.1 MF std, precision = diag(τXᵀX + λI) within 10%."""
    tau, prior = 2.0, 1.0
    x, y, _, precision, exact_mean = bayesian_linear_regression(tau=tau, prior=prior)

    def make(model, **true_fisher):
        return ngvi.VOGN(
            model, x.shape[0], lr=0.2, beta=0.05, prior_prec=prior, init_prec=100.0,
            mc_samples=2,  # halves the variance of the mean's random walk
            **true_fisher,
        )  # fmt: skip

    post = fit_full_batch_regression(make, x, y, tau, steps=1200, decay=0.992)
    mean = torch.cat([m.reshape(-1) for m in post.mean])
    prec = torch.cat([1 / v.reshape(-1) for v in post.variance])
    mf_prec = precision.diagonal()
    mf_std = mf_prec.rsqrt()
    assert ((mean - exact_mean).abs() / mf_std).max() < 0.1
    assert ((prec - mf_prec).abs() / mf_prec).max() < 0.1


# ------------------------------------------------------------------------------------------------------------
# Closure contracts and hooks
# ------------------------------------------------------------------------------------------------------------
def test_fisher_closure_that_calls_backward_is_refused():
    model = small_net()
    x, y = batch()
    opt = ngvi.VOGN(model, 64, curvature="fisher", likelihood="categorical")

    def closure():
        opt.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        return loss, out

    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="must not call backward"):
        opt.step(closure)
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)
    with pytest.raises(TypeError, match=r"\(loss, output\)"):
        opt.step(ef_closure(opt, model, x, y))
    out = model(x)
    with pytest.raises(RuntimeError, match="inside"):
        opt.backward(F.cross_entropy(out, y), out)  # outside sampled_params(train=True)


def test_curvature_options_are_validated():
    with pytest.raises(ValueError, match="likelihood"):
        ngvi.VOGN(small_net(), 10, curvature="fisher")
    with pytest.raises(ValueError, match="curvature='fisher'"):
        ngvi.VOGN(small_net(), 10, likelihood="categorical")
    with pytest.raises(ValueError, match="curvature"):
        ngvi.VOGN(small_net(), 10, curvature="hessian")
    with pytest.raises(ValueError, match="likelihood"):
        ngvi.VOGN(small_net(), 10, curvature="fisher", likelihood="poisson")
    with pytest.raises(ValueError, match="noise_prec"):
        ngvi.VOGN(small_net(), 10, curvature="fisher", likelihood="gaussian", noise_prec=0.0)
    with pytest.raises(ValueError, match="loss_reduction"):
        ngvi.VOGN(small_net(), 10, loss_reduction="none")
    with pytest.raises(TypeError, match="takes the model"):
        ngvi.VOGN(small_net().parameters(), 10)


def test_unsupported_layers_are_named():
    model = nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 4), nn.LayerNorm(4), nn.Linear(4, 2)
    )
    prelu = nn.Sequential(nn.Linear(3, 4), nn.PReLU(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"'1' \(nn.PReLU: weight\)"):
        ngvi.VOGN(prelu, 10)
    emb = nn.ModuleDict({"table": nn.Embedding(5, 3), "head": nn.Linear(3, 2)})
    with pytest.raises(ValueError, match=r"'table' \(nn.Embedding: weight\)"):
        ngvi.VOGN(emb, 10)
    model[1].requires_grad_(False)  # a frozen BatchNorm is accepted (LayerNorm is supported) ...
    opt = ngvi.VOGN(model, 10, init_prec=10.0)
    x, y = torch.randn(4, 1, 4, 4), torch.randint(0, 2, (4,))
    with pytest.warns(
        UserWarning, match="BatchNorm layers in training mode"
    ):  # ... with a warning in train mode
        opt.step(ef_closure(opt, model, x, y))


def test_weights_used_outside_the_layer_forward_are_reported():
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x):
            return F.linear(x, self.lin.weight, self.lin.bias)  # bypasses the module, so its hooks

    model = Functional()
    opt = ngvi.VOGN(model, 10)
    x, y = torch.randn(4, 3), torch.randint(0, 2, (4,))
    with pytest.raises(RuntimeError, match="no output gradient"):
        opt.step(ef_closure(opt, model, x, y))


def test_hooks_exist_only_during_a_training_sample():
    model = small_net()
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(1))  # the user's own hook stays
    opt = ngvi.VOGN(model, 64, init_prec=10.0)
    x, y = batch()
    opt.step(ef_closure(opt, model, x, y))
    ngvi.predict(model, opt, x, samples=2)
    assert [len(m._forward_hooks) for m in model.modules()] == [0, 1, 0, 0, 0]
    assert len(seen) == 3
    with opt.sampled_params(train=True):
        assert len(model[0]._forward_hooks) == 2 and len(model[3]._forward_hooks) == 1
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
    assert len(model[0]._forward_hooks) == 1 and not model[3]._forward_hooks
    opt.step()
