"""Batch norm under VOGN and noisy K-FAC: its parameters are point estimates (no noise, variance 0 in the
posterior) trained by the rule's mean update (docs: ngvi.curvature.layers)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ngvi


def bn_net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1, bias=False),
        nn.BatchNorm2d(3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(48, 4),
    )


def data(m: int = 8):
    g = torch.Generator().manual_seed(1)
    return torch.randn(m, 1, 4, 4, generator=g), torch.randint(0, 4, (m,), generator=g)


def closure(opt, model, x, y):
    def run():
        opt.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out, y)
        opt.backward(loss, out)
        return loss

    return run


MAKERS = {
    "vogn": lambda m: ngvi.VOGN(m, 100, lr=1e-2, init_prec=50.0, seed=0),
    "vogn-fisher": lambda m: ngvi.VOGN(m, 100, lr=1e-2, init_prec=50.0, curvature="fisher",
                                       likelihood="categorical", seed=0),
    "noisy_kfac": lambda m: ngvi.NoisyKFAC(m, 100, lr=1e-2, prior_prec=10.0, seed=0),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_batchnorm_parameters_are_point_estimates(name):
    model = bn_net()
    opt = MAKERS[name](model)
    bn = [model[1].weight, model[1].bias]
    x, y = data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one-time note that batch statistics couple the examples
        before = [p.detach().clone() for p in bn]
        for _ in range(3):
            opt.step(closure(opt, model, x, y))
        with opt.sampled_params():
            for p in model.parameters():
                same = torch.equal(p, opt.mean_of(p))
                assert same == any(p is q for q in bn)  # batch norm at μ, every other weight perturbed
    assert all(not torch.equal(p, b) for p, b in zip(bn, before, strict=True))  # ... but trained
    post = opt.posterior()
    names = [n for n, _ in model.named_parameters()]
    assert [names[i] for i in post.point] == ["1.weight", "1.bias"]
    for i in post.point:
        assert torch.equal(post.variance[i], torch.zeros_like(post.variance[i]))
        draws = post.sample(3)
        assert torch.equal(draws[i], post.mean[i].expand_as(draws[i]))
    others = [i for i in range(len(names)) if i not in post.point]
    assert all(bool((post.variance[i] > 0).all()) for i in others)
    prior = ngvi.DiagonalGaussian.isotropic(post.mean, 10.0)
    assert torch.isfinite(post.log_prob(post.sample())) and torch.isfinite(post.kl(prior))
    assert torch.isfinite(post.entropy())


def test_vogn_updates_batchnorm_by_its_mean_step():
    """Only the batch norm trainable: no noise anywhere, so one step is eq. (7) with eq. (10) exactly,
    s ← (1−β)s + βĥ and μ ← μ − α(ĝ + λ̃μ)/(s + λ̃), with ĝ and ĥ = (1/M)Σᵢ gᵢ² by brute force (the
    batch's statistics: fᵢ depends on the scale and shift through example i's output only)."""
    model = bn_net().double()
    for p in model.parameters():
        p.requires_grad_(False)
    bn = [model[1].weight, model[1].bias]
    for p in bn:
        p.requires_grad_(True)
    lr, beta, prior, n, init = 0.05, 0.1, 2.0, 100, 30.0
    opt = ngvi.VOGN(model, n, lr=lr, beta=beta, prior_prec=prior, init_prec=init, seed=0)
    x, y = data()
    x = x.double()
    mu = [p.detach().clone() for p in bn]
    grads = torch.autograd.grad(F.cross_entropy(model(x), y), bn)
    h = [torch.zeros_like(p) for p in bn]
    for i in range(x.shape[0]):  # per-example gradients through the whole batch's forward
        for acc, g in zip(
            h, torch.autograd.grad(F.cross_entropy(model(x), y, reduction="none")[i], bn), strict=True
        ):
            acc += g.square() / x.shape[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt.step(closure(opt, model, x, y))
    lam = prior / n
    for p, m, g, hh in zip(bn, mu, grads, h, strict=True):
        s = (1 - beta) * (init - prior) / n + beta * hh
        torch.testing.assert_close(p.detach(), m - lr * (g + lam * m) / (s + lam))


def test_resnet_and_batchnorm_vgg_train_under_vogn_and_noisy_kfac():
    from ngvi.experiments.vision.models import resnet20, vgg16_half

    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    for make, cls in ((resnet20, ngvi.NoisyKFAC), (lambda: vgg16_half(batch_norm=True), ngvi.VOGN)):
        torch.manual_seed(0)
        model = make()
        opt = cls(model, 50, lr=1e-3, prior_prec=10.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            losses = [float(opt.step(closure(opt, model, x, y))) for _ in range(2)]
        assert all(map(torch.isfinite, map(torch.tensor, losses)))
        assert len(opt.posterior().point) == sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) * 2


SKIPPING = {
    "vadam": lambda m: ngvi.Vadam(m.parameters(), 100, init_prec=50.0, seed=0, skip_nonfinite=True),
    "ivon": lambda m: ngvi.IVON(m.parameters(), 100, lr=0.05, seed=0, skip_nonfinite=True),
    "vogn": lambda m: ngvi.VOGN(m, 100, lr=1e-2, init_prec=50.0, seed=0, skip_nonfinite=True),
    "noisy_kfac": lambda m: ngvi.NoisyKFAC(m, 100, lr=1e-2, seed=0, skip_nonfinite=True),
}


@pytest.mark.parametrize("name", list(SKIPPING))
@pytest.mark.parametrize("form", ["closure", "manual"])
def test_a_skipped_step_puts_the_running_statistics_back(name, form):
    """One NaN example: the step is skipped, and batch norm's running mean and variance are those before it
    (they would be NaN for good otherwise), so later predictions stay finite (issue 20, item 3.3)."""
    model = bn_net()
    opt = SKIPPING[name](model)
    x, y = data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the batch-norm approximation note of the hook-based rules
        opt.step(closure(opt, model, x, y))
        before = {k: v.clone() for k, v in model.state_dict().items()}
        bad = x.clone()
        bad[3] = float("nan")
        if form == "closure":
            opt.step(closure(opt, model, bad, y))
        else:
            for batch in (x, bad):  # a good sample, then the bad one: both are dropped
                with opt.sampled_params(train=True):
                    closure(opt, model, batch, y)()
            opt.step()
    assert opt.skipped_steps == 1
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    model.eval()
    assert bool(torch.isfinite(model(x)).all())
