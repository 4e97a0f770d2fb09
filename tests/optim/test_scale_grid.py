"""Every posterior rule's defaults against the likelihood's scale and the data size (issue 32, item 1).

Before the trust region (``kl_clip``, docs/CHOOSING.md) VON, IVON and VadaGrad left the data without any
error on the Gaussian NLL mse/(2σ²) with σ ≤ 0.3 (VON's train loss 4.85 → 3·10⁴ in 300 steps at σ = 0.3,
IVON's 162 → 10⁶–10⁹ at σ = 0.05: ``python benchmarks/scale_grid.py``), and noisy Adam's and VOGN's first
step was 12–20 at σ = 0.05. The K-FAC family's grid is ``test_kfac_scale.py``.

The grid: 120 points x ~ N(0, I₄), f(x) = sin(x·w); Gaussian noise σ ∈ {0.05, 0.3, 1, 3} with the loss
mse/(2σ²), or 3 classes from f with the cross-entropy; an MLP 4-16-k (tanh), batches of 20, 120 steps; every
rule built with ``data_size`` N ∈ {10², 10⁴, 10⁶} (N may exceed the data: it emulates a larger set) and
nothing else. The claims, per cell:

* no divergence: no non-finite step, and the train loss at the mean ends below its start and within 3× of
  Adam's at its default lr 10⁻³ on the same batches (the Adam-like rules take Adam's step);
* a sensible σ: every σ of q finite and positive, and no wider than the prior (1/√λ, with λ = 1 for Vadam,
  Vprop, VON, VOGN and noisy Adam, λ = δN for IVON) or, for VadaGrad (no prior; s only grows), than its
  start 1/√s₀, to a relative 10⁻⁵ (float32 rounding);
* the first step's length ‖Δμ₁‖ ≤ √κ (10⁻⁴ relative; IVON 2%, see the assertion) for the rules with the
  region.

The problem and the network are ``test_kfac_scale``'s.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_kfac_scale import BATCH, N_PTS, net, problem

import ngvi
from ngvi.optim.engine.prior import KL_CLIP

STEPS = 120
KINDS = (0.05, 0.3, 1.0, 3.0, "ce")
SIZES = (100, 10_000, pytest.param(1_000_000, marks=pytest.mark.slow))
#: every posterior rule with its defaults (VOGN hooks the model's layers); the K-FAC family: test_kfac_scale
MAKERS = {
    "vadam": lambda m, n: ngvi.Vadam(m.parameters(), n, seed=0),
    "vprop": lambda m, n: ngvi.Vprop(m.parameters(), n, seed=0),
    "von": lambda m, n: ngvi.VON(m.parameters(), n, seed=0),
    "vogn": lambda m, n: ngvi.VOGN(m, n, seed=0),
    "vadagrad": lambda m, n: ngvi.VadaGrad(m.parameters(), seed=0),
    "ivon": lambda m, n: ngvi.IVON(m.parameters(), n, seed=0),
    "noisy_adam": lambda m, n: ngvi.NoisyAdam(m.parameters(), n, seed=0),
    "badam": lambda m, n: ngvi.BAdam(m.parameters(), n, seed=0),
}
#: the rules whose step the trust region caps (kl_clip="auto")
CAPPED = ("von", "vogn", "vadagrad", "ivon", "noisy_adam")


def train(make, kind, steps: int = STEPS):
    """(loss at the start, loss at the mean after ``steps``, ‖Δμ₁‖, optimizer); a non-finite step raises."""
    x, y, loss_fn, outputs = problem(kind)
    model = net(outputs)
    opt = make(model)
    order = torch.Generator().manual_seed(1)
    params = list(model.parameters())
    mean = getattr(opt, "mean_of", lambda p: p)
    with torch.no_grad():
        start = loss_fn(model(x), y).item()
    first = None
    for _ in range(steps):
        idx = torch.randint(0, N_PTS, (BATCH,), generator=order)

        def closure(xb=x[idx], yb=y[idx]):
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            return loss

        before = [p.detach().clone() for p in params] if first is None else None
        loss = opt.step(closure)
        assert math.isfinite(float(loss))
        if before is not None:
            first = math.sqrt(
                sum((mean(p) - b).square().sum().item() for p, b in zip(params, before, strict=True))
            )
    with torch.no_grad():
        return start, loss_fn(model(x), y).item(), first, opt


ADAM: dict = {}


def adam_loss(kind) -> float:
    if kind not in ADAM:
        ADAM[kind] = train(lambda m: torch.optim.Adam(m.parameters(), lr=1e-3), kind)[1]
    return ADAM[kind]


def widest_allowed(name: str, opt, n: int) -> float:
    """The largest σ q may have: the prior's, or VadaGrad's start."""
    if name == "vadagrad":
        return 1 / math.sqrt(opt.param_groups[0]["init_prec"])
    if name == "ivon":
        return 1 / math.sqrt(opt.param_groups[0]["weight_decay"] * n)
    if name == "badam":  # prior_prec = 0: no prior to compare with
        return math.inf
    return 1.0  # λ = 1


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", KINDS, ids=str)
@pytest.mark.parametrize("name", list(MAKERS))
def test_defaults_train_and_give_a_sensible_sigma(name, kind, n):
    start, final, first, opt = train(lambda m: MAKERS[name](m, n), kind)
    assert final < start, (start, final)
    assert final <= 3 * adam_loss(kind), (final, adam_loss(kind))
    sd = torch.cat([v.reshape(-1) for v in opt.posterior().variance]).sqrt()
    assert torch.isfinite(sd).all() and (sd > 0).all()
    assert sd.max().item() <= widest_allowed(name, opt, n) * (1 + 1e-5), sd.max().item()
    if name in CAPPED:
        # the cap is in the metric after the first curvature update; IVON's default early weight (3·10⁻³,
        # forget_start, issue 44; 10⁻⁵ before) can move h + δ below 1: seen 1.014·√κ at σ = 0.05, N = 100
        slack = 1.02 if name == "ivon" else 1 + 1e-4
        assert first <= math.sqrt(KL_CLIP) * slack, first


WITH_KAPPA = {
    "von": lambda m, k: ngvi.VON(m.parameters(), 1000, seed=0, kl_clip=k),
    "vogn": lambda m, k: ngvi.VOGN(m, 1000, seed=0, kl_clip=k),
    "vadagrad": lambda m, k: ngvi.VadaGrad(m.parameters(), seed=0, kl_clip=k),
    "ivon": lambda m, k: ngvi.IVON(m.parameters(), 1000, seed=0, kl_clip=k),
    "noisy_adam": lambda m, k: ngvi.NoisyAdam(m.parameters(), 1000, seed=0, kl_clip=k),
}


@pytest.mark.parametrize("name", CAPPED)
def test_the_region_is_a_no_op_where_it_does_not_bind_and_can_be_switched_off(name):
    """σ = 3 (a flat likelihood: the steps stay inside √κ): bitwise the run without the region. kl_clip=None
    restores the uncapped first step at σ = 0.05 (> 10√κ); a bad κ is refused."""
    capped = train(lambda m: WITH_KAPPA[name](m, "auto"), 3.0, steps=20)[3]
    uncapped = train(lambda m: WITH_KAPPA[name](m, None), 3.0, steps=20)[3]
    pairs = zip(capped.posterior().mean, uncapped.posterior().mean, strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert train(lambda m: WITH_KAPPA[name](m, None), 0.05, steps=1)[2] > 10 * math.sqrt(KL_CLIP)
    with pytest.raises(ValueError, match="kl_clip"):
        WITH_KAPPA[name](net(1), -1.0)


def test_only_the_papers_start_keeps_the_uncapped_step():
    """kl_clip="auto" has one meaning for every rule (issue 42): κ = 10⁻² for every start but the papers'
    ``init_prec=None`` (what the golden trajectories and the experiments pin). A number is capped in the
    metric s + λ̃: at init_prec = 50, N = 1000 that is s₀ + λ̃ = 0.05, so ‖Δμ₁‖ ≤ √(κ/0.05) ≈ 0.45 (s₁ moves
    from s₀ by β·ĥ: 10% allowed)."""
    papers = train(lambda m: ngvi.VON(m.parameters(), 1000, init_prec=None, seed=0), 0.05, steps=1)[2]
    assert papers > 10 * math.sqrt(KL_CLIP), papers
    uncapped = train(lambda m: ngvi.VON(m.parameters(), 1000, init_prec=50.0, kl_clip=None, seed=0), 0.05, 1)[
        2
    ]
    auto = train(lambda m: ngvi.VON(m.parameters(), 1000, init_prec=50.0, seed=0), 0.05, steps=1)[2]
    assert auto <= math.sqrt(KL_CLIP / 0.05) * 1.1, auto
    assert auto < uncapped / 5, (auto, uncapped)


def test_a_checkpoint_without_kl_clip_resumes_without_the_region():
    """A checkpoint saved before kl_clip existed was trained without a region: it resumes without one (it
    resumed with "auto" before issue 42). Its step is then the uncapped one, far beyond √κ."""
    model = net(1)
    opt = ngvi.IVON(model.parameters(), 1000, seed=0)
    state = opt.state_dict()
    for group in state["param_groups"]:
        del group["kl_clip"]
    fresh = ngvi.IVON(model.parameters(), 1000, seed=0)
    fresh.load_state_dict(state)
    assert [g["kl_clip"] for g in fresh.param_groups] == [None]
    x, y, loss_fn, _ = problem(0.05)

    def closure():
        fresh.zero_grad()
        loss = loss_fn(model(x[:20]), y[:20])
        loss.backward()
        return loss

    before = [p.detach().clone() for p in model.parameters()]
    fresh.step(closure)
    step = math.sqrt(
        sum((p - b).square().sum().item() for p, b in zip(model.parameters(), before, strict=True))
    )
    assert step > 10 * math.sqrt(KL_CLIP)
