"""MAP (Adam with the prior as weight decay) and MC dropout (Gal's weight decay, dropout at prediction)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ngvi
from ngvi.baselines import MAP, MCDropout, mc_dropout_mlp, mc_dropout_weight_decay

N = 64


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 3, generator=g, dtype=torch.float64)
    return x, torch.randn(N, 1, generator=g, dtype=torch.float64)


def _mlp(seed: int = 0, p: float = 0.1) -> nn.Sequential:
    torch.manual_seed(seed)
    return mc_dropout_mlp(3, 1, hidden=16, p=p).double()


def _closure(opt, model, x, y):
    def closure():
        opt.zero_grad()
        loss = 0.5 * (model(x) - y).square().mean()
        loss.backward()
        return loss

    return closure


# ----------------------------------------------------------------------------------------------------
# MAP
# ----------------------------------------------------------------------------------------------------
def test_map_is_adam_with_weight_decay_prior_over_n(data):
    x, y = data
    model, ref_model = _mlp().eval(), _mlp().eval()
    opt = MAP(model, N, lr=1e-2, betas=(0.8, 0.99), prior_prec=3.0)
    ref = torch.optim.Adam(ref_model.parameters(), lr=1e-2, betas=(0.8, 0.99), weight_decay=3.0 / N)
    for _ in range(20):
        loss = opt.step(_closure(opt, model, x, y))
        ref_loss = ref.step(_closure(ref, ref_model, x, y))
        assert torch.equal(loss, ref_loss)
    for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert all(g["weight_decay"] == 3.0 / N for g in opt.param_groups)


def test_map_gradient_is_mean_loss_plus_prior(data):
    """One SGD-like check of the objective: Adam's first step moves along −sign(ĝ + (λ/N)θ)."""
    x, y = data
    model = _mlp().eval()
    opt = MAP(model, N, lr=1e-3, prior_prec=N * 1e3)  # a prior that dominates the gradient
    before = [p.detach().clone() for p in model.parameters()]
    opt.step(_closure(opt, model, x, y))
    for p, p0 in zip(model.parameters(), before, strict=True):
        moved = (p.detach() - p0)[p0.abs() > 1e-2]
        assert torch.equal(moved.sign(), -p0[p0.abs() > 1e-2].sign())


@pytest.mark.parametrize(
    "make", [lambda m: MAP(m, N), lambda m: MCDropout(m, N, mc_samples=2)], ids=["map", "mc2"]
)
def test_nonfinite_or_missing_gradients_are_refused_in_every_form(data, make):
    """The manual form (backward, then step()) and MC dropout's averaged masks refuse what the closure form
    does: a NaN gradient (named by its parameter) and a step without any gradient; Adam's state stays
    empty."""
    x, y = data
    model = _mlp()
    opt = make(model)
    before = [p.detach().clone() for p in model.parameters()]
    bad_y = y.clone()
    bad_y[3] = float("nan")
    closure = _closure(opt, model, x, bad_y)
    if opt.mc_samples == 1:  # the manual form
        closure()
        closure = None
    with pytest.raises(
        ngvi.NonFiniteGradientError, match=r"param_groups\[\d\]\['params'\]\[\d\] \(shape .*unchanged"
    ):
        opt.step(closure)
    opt.zero_grad()
    with pytest.raises(RuntimeError, match=r"\.step\(\): no parameter has a gradient"):
        opt.step()
    assert all(torch.equal(p, p0) for p, p0 in zip(model.parameters(), before, strict=True))
    assert not opt.state


def test_map_predicts_its_point_estimate(data):
    x, _ = data
    model = _mlp().eval()
    opt = MAP(model.parameters(), N)
    out = ngvi.predict(model, opt, x, samples=5)
    assert out.shape == (5, N, 1)
    assert all(torch.equal(o, out[0]) for o in out)
    torch.testing.assert_close(out[0], model(x))


# ----------------------------------------------------------------------------------------------------
# MC dropout
# ----------------------------------------------------------------------------------------------------
def test_mlp_helper_is_gals_uci_network():
    model = mc_dropout_mlp(8, p=0.05)
    kinds = [type(m) for m in model]
    assert kinds == [nn.Dropout, nn.Linear, nn.ReLU, nn.Dropout, nn.Linear]
    assert (model[1].in_features, model[1].out_features, model[4].out_features) == (8, 50, 1)
    assert all(m.p == 0.05 for m in model if isinstance(m, nn.Dropout))
    assert [type(m) for m in mc_dropout_mlp(8, 2, hidden=(4, 4), input_dropout=False)] == [
        nn.Linear, nn.ReLU, nn.Dropout, nn.Linear, nn.ReLU, nn.Dropout, nn.Linear,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="p"):
        mc_dropout_mlp(8, p=1.0)
    with pytest.raises(ValueError, match=r"hidden\[1\]"):
        mc_dropout_mlp(8, hidden=(4, 0))


def test_weight_decay_follows_the_prior_and_the_keep_probability():
    """Weights after dropout rate p: λ(1−p)/N; biases and undropped weights: λ/N."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(3, 4), nn.ReLU(), nn.Dropout(0.2), nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 1)
    )
    opt = MCDropout(model, 100, prior_prec=2.0)
    decay = {p: g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert decay[model[0].weight] == pytest.approx(2.0 / 100)
    assert decay[model[3].weight] == pytest.approx(2.0 * 0.8 / 100)
    assert decay[model[5].weight] == pytest.approx(2.0 * 0.5 / 100)
    assert all(decay[m.bias] == pytest.approx(2.0 / 100) for m in (model[0], model[3], model[5]))
    assert len(decay) == 6
    assert mc_dropout_weight_decay(2.0, 100, 0.2) == pytest.approx(0.016)


def test_weight_decay_is_gals_objective_in_ngvi_units(data):
    """With λ = l² and a Gaussian NLL of precision τ, our gradient is τ times that of Gal's objective
    ½·mean (y − ŷ)² + reg‖M‖², reg = l²(1−p)/(2Nτ), for the same dropout mask."""
    x, y = data
    tau, length_scale, p = 3.0, 0.7, 0.1
    model = _mlp(p=p)
    opt = MCDropout(model, N, prior_prec=length_scale**2)
    reg = length_scale**2 * (1 - p) / (2 * N * tau)
    weights = [model[1].weight, model[4].weight]

    def grads(loss):
        return torch.autograd.grad(loss, weights)

    torch.manual_seed(1)
    ngvi_loss = 0.5 * tau * (model(x) - y).square().mean()  # mean NLL (+ const)
    decay = {q: g["weight_decay"] for g in opt.param_groups for q in g["params"]}
    ours = [g + decay[w] * w for g, w in zip(grads(ngvi_loss), weights, strict=True)]
    torch.manual_seed(1)
    gal_loss = 0.5 * (model(x) - y).square().mean() + reg * sum(w.square().sum() for w in weights)
    for a, b in zip(ours, grads(gal_loss), strict=True):
        torch.testing.assert_close(a, tau * b)


def test_predict_draws_dropout_masks(data):
    x, _ = data
    model = _mlp()
    opt = MCDropout(model, N)
    model.eval()
    out = ngvi.predict(model, opt, x, samples=8)
    assert out.shape == (8, N, 1)
    assert all(not torch.equal(out[0], o) for o in out[1:])  # a fresh mask per draw
    torch.manual_seed(3)
    a = ngvi.predict(model, opt, x, samples=4)
    torch.manual_seed(3)
    b = ngvi.predict(model, opt, x, samples=4)
    assert torch.equal(a, b)  # masks come from torch's global generator
    assert not model.training and not any(m.training for m in model)  # modes restored
    torch.testing.assert_close(model(x), model(x))  # dropout off outside sampled_params in eval mode
    assert torch.equal(ngvi.predict(model, opt, x, samples=0)[0], model(x))


def test_dropout_modes_restored_when_the_block_raises():
    model = _mlp().eval()
    opt = MCDropout(model, N)
    with pytest.raises(KeyError), opt.sampled_params():
        assert all(m.training for m in model if isinstance(m, nn.Dropout))
        raise KeyError("boom")
    assert not any(m.training for m in model)
    model.train()
    with opt.sampled_params():
        pass
    assert all(m.training for m in model)


def test_mc_dropout_needs_a_model_with_dropout():
    with pytest.raises(ValueError, match="no dropout"):
        MCDropout(nn.Linear(3, 1), N)
    with pytest.raises(TypeError, match=r"MCDropout takes the model \(an nn\.Module\)"):
        MCDropout(list(nn.Linear(3, 1).parameters()), N)


def test_map_and_dropout_follow_a_changed_data_size(data):
    """A data set that grows (a bandit's replay buffer): a new data_size takes effect at the next step."""
    x, y = data
    torch.manual_seed(0)
    model = nn.Linear(3, 1).double()
    ref = nn.Linear(3, 1).double()
    ref.load_state_dict(model.state_dict())
    opt = MAP(model, 10, lr=1e-2, prior_prec=2.0)
    adam = torch.optim.Adam(ref.parameters(), lr=1e-2, weight_decay=2.0 / 40)
    opt.param_groups[0]["data_size"] = 40
    for _ in range(3):
        opt.step(_closure(opt, model, x, y))
        adam.step(_closure(adam, ref, x, y))
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    dropout = _mlp(p=0.2)
    opt = MCDropout(dropout, 10, prior_prec=2.0)
    for group in opt.param_groups:
        group["data_size"] = 40
    opt.step(_closure(opt, dropout, x, y))
    assert sorted(g["weight_decay"] for g in opt.param_groups) == pytest.approx([2.0 * 0.8 / 40, 2.0 / 40])
