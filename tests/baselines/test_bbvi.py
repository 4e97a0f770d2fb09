"""BBVI (Bayes by Backprop): the exact mean-field optimum, the two samplers, predict, and the models it
refuses. (Resume, restore, validation and the manual form, with both samplers: tests/optim/.)"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import ngvi
from ngvi.baselines import BBVI, linear_regression_mean_field

TAU, LAM, N, D = 4.0, 1.0, 100, 3


@pytest.fixture
def regression():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(N, D, generator=g, dtype=torch.float64)
    w = torch.randn(D, generator=g, dtype=torch.float64)
    y = X @ w + torch.randn(N, generator=g, dtype=torch.float64) / math.sqrt(TAU)
    return X, y


def _linear_model(seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(D, 1, bias=False).double()


def _gaussian_closure(opt, model, X, y):
    """Mean NLL of y ~ N(Xw, 1/τ), up to a constant: (τ/2)·mean (y − Xw)²."""

    def closure():
        opt.zero_grad()
        loss = 0.5 * TAU * (model(X).squeeze(-1) - y).square().mean()
        loss.backward()
        return loss

    return closure


# ----------------------------------------------------------------------------------------------------
# correctness: BBVI's ELBO optimum is the exact mean-field posterior
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("local_reparam", "mc_samples", "steps"),
    [(True, 2, 1000), (False, 4, 1500)],
    ids=["local-reparam", "weight-reparam"],
)
def test_converges_to_exact_mean_field(regression, local_reparam, mc_samples, steps):
    """Full-batch Bayesian linear regression, Adam with lr 0.1 decaying as (1 − t/T)³.

    Tolerances: mean within 0.1 posterior std, precision within 10%. Over 8 noise seeds the worst errors
    were 0.036 std / 5.7% (local reparam.) and 0.048 std / 5.0% (weight reparam.); the MC noise of the
    log σ gradient sets this floor (it shrinks with more samples and steps, e.g. 16 samples: < 2%).
    """
    X, y = regression
    model = _linear_model()
    opt = BBVI(
        model,
        N,
        lr=0.1,
        prior_prec=LAM,
        init_prec=10.0,
        mc_samples=mc_samples,
        local_reparam=local_reparam,
        seed=0,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: (1 - t / steps) ** 3)
    closure = _gaussian_closure(opt, model, X, y)
    for _ in range(steps):
        opt.step(closure)
        schedule.step()
    q = opt.posterior()
    ref = linear_regression_mean_field(X, y, TAU, LAM)
    mean_err = ((q.mean[0].flatten() - ref.mean[0]) / ref.std[0]).abs().max().item()
    prec_err = (q.precision[0].flatten() / ref.precision[0] - 1).abs().max().item()
    print(f"mean error {mean_err:.4f} std, precision error {prec_err:.4f}")
    assert mean_err < 0.1
    assert prec_err < 0.1
    assert torch.equal(model.weight.detach(), q.mean[0])  # μ lives in the model


def test_kl_divergence_and_initial_precision():
    model = _linear_model()
    opt = BBVI(model, N, prior_prec=LAM, init_prec=10.0)
    q = opt.posterior()
    prior = ngvi.DiagonalGaussian.isotropic(q.mean, LAM)
    assert opt.kl_divergence().item() == pytest.approx(q.kl(prior).item(), rel=1e-12)
    assert q.variance[0].flatten().tolist() == pytest.approx([0.1] * D, rel=1e-12)  # init_prec = 10


# ----------------------------------------------------------------------------------------------------
# the two samplers
# ----------------------------------------------------------------------------------------------------
def test_local_reparam_samples_each_example_from_the_exact_output_distribution():
    """In a training sample a Linear layer's output is N(xμ + b, x²σ² + σ_b²), independently per example."""
    torch.manual_seed(0)
    layer = nn.Linear(2, 1).double()
    opt = BBVI(layer, 10, init_prec=4.0, seed=1)
    x = torch.tensor([[1.0, -2.0]], dtype=torch.float64).expand(20000, 2)
    with opt.sampled_params(train=True):
        out = layer(x).detach().squeeze(1)
    mean = (layer(x[:1]).detach()).item()
    var = (x[0].square().sum() + 1.0).item() / 4.0
    assert abs(out.mean().item() - mean) < 4 * math.sqrt(var / out.numel())
    assert out.var().item() == pytest.approx(var, rel=0.05)
    assert not layer._forward_hooks  # the hook lives only inside the block


def test_prediction_draws_one_weight_sample_per_forward_pass():
    """predict() gives coherent functions: under each draw f(2x) = 2 f(x) for a linear model without bias."""
    model = _linear_model()
    opt = BBVI(model, N, init_prec=10.0, seed=0)
    x = torch.randn(5, D, dtype=torch.float64)
    out = ngvi.predict(model, opt, torch.cat([x, 2 * x]), samples=16).squeeze(-1)
    assert out.shape == (16, 10)
    torch.testing.assert_close(out[:, 5:], 2 * out[:, :5])
    assert out.std(0).min() > 0  # and the draws differ
    with opt.sampled_params(train=True):  # whereas the training sampler draws per example
        out = model(torch.cat([x, 2 * x])).detach().squeeze(-1)
    assert not torch.allclose(out[5:], 2 * out[:5])


def test_predict_samples_weights_from_the_posterior():
    torch.manual_seed(0)
    model = nn.Linear(50, 40).double()
    opt = BBVI(model, N, init_prec=25.0, seed=3)
    mean = [p.detach().clone() for p in model.parameters()]
    with opt.sampled_params():
        z = torch.cat([((p - m) * 5.0).flatten() for p, m in zip(model.parameters(), mean, strict=True)])
    assert abs(z.mean().item()) < 4 / math.sqrt(z.numel())
    assert z.std().item() == pytest.approx(1.0, abs=0.05)
    for p, m in zip(model.parameters(), mean, strict=True):
        assert torch.equal(p.detach(), m)  # restored


def test_other_parameterised_modules_are_sampled_by_weight_reparam():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.LayerNorm(8), nn.Tanh(), nn.Linear(8, 1))
    opt = BBVI(model, 64, lr=1e-2, init_prec=100.0, seed=0)
    x, y = torch.randn(64, 3), torch.randn(64, 1)
    before = opt.posterior()

    def closure():
        opt.zero_grad()
        loss = (model(x) - y).square().mean()
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    after = opt.posterior()
    assert [m.shape for m in after.mean] == [p.shape for p in model.parameters()]
    for v0, v1 in zip(before.variance, after.variance, strict=True):  # every log σ was trained
        assert not torch.equal(v0, v1)
    with opt.sampled_params():
        assert not torch.equal(model[1].weight.detach(), after.mean[2])


# ----------------------------------------------------------------------------------------------------
# the models it takes
# ----------------------------------------------------------------------------------------------------
def test_model_must_be_a_module():
    with pytest.raises(TypeError, match=r"BBVI takes the model \(an nn\.Module\)"):
        BBVI(list(_linear_model().parameters()), N)
    frozen = _linear_model().requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        BBVI(frozen, N)


def test_tied_linear_weight_needs_weight_reparam():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(4, 4)
            self.out = nn.Linear(4, 4, bias=False)
            self.out.weight = self.embed.weight

        def forward(self, idx):
            return self.out(self.embed(idx))

    with pytest.raises(ValueError, match=r"embed\.weight.*local_reparam=False"):
        BBVI(Tied(), N)
    BBVI(Tied(), N, local_reparam=False)


def test_linear_weight_used_outside_its_forward_is_refused():
    """nn.MultiheadAttention reads out_proj.weight without calling out_proj: the hook cannot see it."""
    torch.manual_seed(0)
    model = nn.MultiheadAttention(4, 1, batch_first=True)
    x = torch.randn(2, 3, 4)
    opt = BBVI(model, 8)

    def closure():
        opt.zero_grad()
        loss = model(x, x, x)[0].square().mean()
        loss.backward()
        return loss

    weight = model.out_proj.weight.detach().clone()
    with pytest.raises(RuntimeError, match=r"out_proj.*local_reparam=False"):
        opt.step(closure)
    assert torch.equal(model.out_proj.weight.detach(), weight)
    opt = BBVI(model, 8, local_reparam=False)
    opt.step(closure)


def test_frozen_parameters_stay_fixed():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    model[0].bias.requires_grad_(False)
    opt = BBVI(model, 16, lr=0.1, seed=0)
    assert len(opt.posterior().mean) == 3  # the trainable parameters, in model order
    bias = model[0].bias.detach().clone()
    x = torch.zeros(16, 3)  # the first layer's output is its bias alone, so it shows any bias noise
    with opt.sampled_params(train=True):
        hidden = model[0](x)
    assert torch.equal(hidden.detach(), bias.expand(16, 4))
    with opt.sampled_params():
        assert torch.equal(model[0](x).detach(), bias.expand(16, 4))
