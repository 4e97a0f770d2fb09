"""Curvature states that forget their start (issue 44, item 1; :mod:`ngvi.optim.forgetting`), against an
exact answer.

Bayesian linear regression, N = 200, six features of which two are identically zero in the training data, a
bias, noise precision τ = 4, prior N(0, I/λ), λ = 1. Its exact mean-field posterior
(:func:`ngvi.baselines.exact.linear_regression_mean_field`) gives the weights of the zero features the
prior itself: mean 0, variance 1/λ. Every diagonal rule is built with ``data_size`` and ``prior_prec``: IVON,
noisy Adam and Vprop with nothing else (their defaults forget the start), VON, VOGN and Vadam with
``forget_start="auto"`` (their defaults keep the constant weight, docs/CHOOSING.md says why); ngvi's start
s₀ = 1; 4,000 steps (the early phase at ρₑ = 3·10⁻³ ends after 3,300: :func:`~ngvi.optim.forgetting.
early_steps`), the lr under a cosine decay to 0 (docs/CHOOSING.md's advice); full batch for the rules with
a true curvature (VON, IVON, VOGN), batches of one for the squared-gradient rules (Vadam, Vprop, noisy Adam:
their ĝ² is the per-example empirical Fisher only at M = 1, Khan et al. 2018 Thm. 1), whose Adam-unit lr is
10⁻² (CHOOSING: your Adam lr, 10⁻³–10⁻²).

Tolerances (``python benchmarks/forget_start.py --steps 4000`` measured the same problem): the constrained
means within 0.3 exact posterior s.d. at full batch and 0.5 at batch one (seen 0.08–0.10 and 0.16–0.42), the
constrained precisions within 15% for the Price rules (seen 10%) and 30% for the empirical-Fisher ones
(VOGN's ``"ef"`` and the three ĝ² rules, seen 18–23%: the EF equals the Gauss-Newton matrix only in
expectation over the noise), the unconstrained weights' variance within 5% of the prior's (seen 0.5%) and
their mean within 0.05 prior s.d. of 0. With ``forget_start=None`` (the constant weight, IVON before issue
44) the unconstrained variance is 0.005 of the prior's after the same steps, which the test would catch.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import ngvi
from ngvi.baselines.exact import linear_regression_mean_field, linear_regression_posterior
from ngvi.optim import forgetting

N, D, ZERO, TAU, LAM = 200, 6, (4, 5), 4.0, 1.0

#: rule → (factory, batch size, steps, mean tolerance, precision tolerance). IVON, noisy Adam and Vprop
#: forget their start by default; VON, VOGN and Vadam keep the constant weight by default (docs/CHOOSING.md)
#: and are built with ``forget_start="auto"``.
FORGET = {"forget_start": "auto"}
RULES = {
    "ivon": (lambda m, **kw: ngvi.IVON(m.parameters(), N, prior_prec=LAM, **kw), N, 4000, 0.3, 0.15),
    "noisy_adam": (
        lambda m, **kw: ngvi.NoisyAdam(m.parameters(), N, prior_prec=LAM, **kw),
        1,
        4000,
        0.5,
        0.30,
    ),
    "von": (lambda m, **kw: ngvi.VON(m.parameters(), N, prior_prec=LAM, **FORGET, **kw), N, 4000, 0.3, 0.15),
    "vogn": (lambda m, **kw: ngvi.VOGN(m, N, prior_prec=LAM, **FORGET, **kw), N, 4000, 0.3, 0.30),
    "vadam": (
        lambda m, **kw: ngvi.Vadam(m.parameters(), N, lr=1e-2, prior_prec=LAM, **FORGET, **kw),
        1,
        4000,
        0.5,
        0.30,
    ),
    "vprop": (
        lambda m, **kw: ngvi.Vprop(m.parameters(), N, lr=1e-2, prior_prec=LAM, **kw),
        1,
        4000,
        0.5,
        0.30,
    ),
}
SLOW = ("vogn", "vadam")  # the same code paths as VON's and Vprop's


def problem():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=gen, dtype=torch.float64)
    x[:, list(ZERO)] = 0.0
    w = torch.randn(D, 1, generator=gen, dtype=torch.float64)
    y = x @ w + 0.5 + torch.randn(N, 1, generator=gen, dtype=torch.float64) / math.sqrt(TAU)
    design = torch.cat([x, torch.ones(N, 1, dtype=torch.float64)], 1)
    exact = linear_regression_mean_field(design, y[:, 0], TAU, LAM)
    return x, y, exact.mean[0], exact.variance[0]


def _loss(opt, model, x, y):
    opt.zero_grad()
    loss = 0.5 * TAU * (model(x) - y).square().mean()
    loss.backward()
    return loss


def fit(rule: str, **options):
    """(q's mean and variance of [w, b], the exact ones) after the rule's steps."""
    make, batch, steps, _, _ = RULES[rule]
    x, y, mean, var = problem()
    torch.manual_seed(0)
    model = nn.Linear(D, 1).double()
    opt = make(model, seed=0, **options)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: 0.5 * (1 + math.cos(math.pi * min(t, steps) / steps))
    )
    gen = torch.Generator().manual_seed(1)
    order, pos = torch.randperm(N, generator=gen), 0
    for _ in range(steps):
        if pos + batch > N:
            order, pos = torch.randperm(N, generator=gen), 0
        xb, yb = x[order[pos : pos + batch]], y[order[pos : pos + batch]]
        pos += batch
        opt.step(lambda xb=xb, yb=yb: _loss(opt, model, xb, yb))
        sched.step()
    post = opt.posterior()
    q_mean = torch.cat([t.reshape(-1) for t in post.mean])
    q_var = torch.cat([t.reshape(-1) for t in post.variance])
    return q_mean, q_var, mean, var


FREE = torch.zeros(D + 1, dtype=torch.bool)
FREE[list(ZERO)] = True


@pytest.mark.parametrize(
    "rule", [pytest.param(r, marks=pytest.mark.slow) if r in SLOW else r for r in sorted(RULES)]
)
def test_forgetting_reaches_the_mean_field_posterior_and_the_prior_where_no_data_are(rule):
    q_mean, q_var, mean, var = fit(rule)
    z = ((q_mean - mean) / var.sqrt())[~FREE].abs().max().item()
    prec = (var / q_var - 1)[~FREE].abs().max().item()
    assert z < RULES[rule][3], f"{rule}: constrained mean off by {z:.3f} s.d."
    assert prec < RULES[rule][4], f"{rule}: constrained precision off by {prec:.3f}"
    free_var = q_var[FREE] * LAM
    assert ((free_var - 1).abs() < 0.05).all(), f"{rule}: unconstrained variance {free_var.tolist()} of 1/λ"
    assert (q_mean[FREE].abs() * math.sqrt(LAM) < 0.05).all(), f"{rule}: unconstrained mean {q_mean[FREE]}"


def test_the_constant_weight_keeps_the_start():
    """The negative control: IVON before issue 44 (``forget_start=None``, β₂ = 0.99999) keeps most of N·h₀."""
    _, q_var, _, _ = fit("ivon", forget_start=None)
    assert (q_var[FREE] * LAM < 0.5).all(), q_var[FREE]


def test_the_early_phase_ends_when_the_start_is_one_percent_of_the_prior():
    """T_e = ⌈ln(N s₀/(0.01 λ)) / −ln(1 − ρₑ)⌉: 986 steps for N s₀/λ = 200 at ρₑ = 10⁻², and then
    N s₀ (1 − ρₑ)^{T_e} ≤ 0.01 λ < N s₀ (1 − ρₑ)^{T_e − 1}; none where the start is already below."""
    t = forgetting.early_steps(1e-2, 200.0)
    assert t == 986
    assert 200 * 0.99**t <= 0.01 < 200 * 0.99 ** (t - 1)
    assert forgetting.early_steps(1e-2, 0.005) == 0
    group = {"forget_start": 1e-2, "init_prec": "auto"}
    assert forgetting.update_weight(1e-3, t, group, 200.0, 1.0) == 1e-2
    rate = 1e-3
    assert forgetting.update_weight(rate, t + 1, group, 200.0, 1.0) is rate  # the same object: bitwise
    assert forgetting.update_weight(rate, 1, {"forget_start": "auto", "init_prec": None}, 200.0, 1.0) is rate


def test_a_start_the_caller_chose_is_kept_bitwise():
    """``"auto"`` is off for ``init_prec=None`` or a number, as ``kl_clip="auto"``: the same trajectory as
    ``forget_start=None``, bit for bit."""
    x, y, _, _ = problem()
    results = []
    for forget in ("auto", None):
        torch.manual_seed(0)
        model = nn.Linear(D, 1).double()
        opt = ngvi.VON(model.parameters(), N, prior_prec=LAM, init_prec=50.0, forget_start=forget, seed=0)
        for _ in range(20):
            opt.step(lambda opt=opt, model=model: _loss(opt, model, x, y))
        results.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    assert torch.equal(results[0], results[1])


@pytest.mark.parametrize("bad", [0.0, 1.5, -1.0, "fast", True, float("nan")])
def test_a_bad_forget_start_is_refused(bad):
    with pytest.raises(ValueError, match="forget_start"):
        ngvi.IVON(nn.Linear(2, 1).parameters(), N, forget_start=bad)


def test_the_papers_moment_takes_no_early_weight():
    with pytest.raises(ValueError, match="step_moment='debiased'"):
        ngvi.Vadam(nn.Linear(2, 1).parameters(), N, step_moment="paper", forget_start=1e-2)


def test_ivon_paper_settings_are_reachable_by_name():
    opt = ngvi.IVON(nn.Linear(2, 1).parameters(), N, **ngvi.optim.ivon.PAPER)
    group = opt.param_groups[0]
    assert group["betas"] == (0.9, 0.99999) and group["hess_init"] == 1.0 and group["forget_start"] is None


def fit_kronecker(cls, forget_start, steps: int = 1500):
    """The K-FAC family on the same problem, full batch, the true Fisher (CHOOSING's advice for the family),
    the cosine lr decay; → (q's mean over [w, b], its marginal variances, its covariance if it keeps one)."""
    x, y, _, _ = problem()
    torch.manual_seed(0)
    model = nn.Linear(D, 1).double()
    opt = cls(model, N, prior_prec=LAM, curvature="fisher", likelihood="gaussian", noise_prec=TAU,
              forget_start=forget_start, seed=0)  # fmt: skip
    cosine = lambda t: 0.5 * (1 + math.cos(math.pi * min(t, steps) / steps))  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine)

    def closure():
        opt.zero_grad()
        out = model(x)
        return 0.5 * TAU * (out - y).square().mean(), out

    for _ in range(steps):
        opt.step(closure)
        sched.step()
    post = opt.posterior()
    q_mean = torch.cat([m.reshape(-1) for m in post.mean]).double()
    q_var = torch.cat([v.reshape(-1) for v in post.variance]).double()
    return q_mean, q_var, getattr(post, "covariance", None)


def exact_full():
    x, y, _, _ = problem()
    design = torch.cat([x, torch.ones(N, 1, dtype=torch.float64)], 1)
    return linear_regression_posterior(design, y[:, 0], TAU, LAM)


def test_nng_full_forgetting_reaches_the_exact_posterior():
    """NNG-full's posterior is a full Gaussian with the prior as γ_in, so on Bayesian linear regression its
    target is the exact posterior itself. With ``forget_start=1e-2`` (the early phase ends after 986 updates)
    it reaches it in 1,500 steps: the covariance within 2% (Frobenius, relative; seen 0.5% at 4,000 steps with
    "auto"), the mean within 0.3 s.d., the unconstrained weights' variance within 5% of the prior's (seen
    0.995); with the constant β it is 0.21 of the prior's and the covariance 79% off."""
    mean, cov = exact_full()
    q_mean, q_var, q_cov = fit_kronecker(ngvi.NNGFull, 1e-2)
    assert ((q_mean - mean) / cov.diagonal().sqrt()).abs().max() < 0.3
    assert (q_cov - cov).norm() / cov.norm() < 0.02, ((q_cov - cov).norm() / cov.norm()).item()
    assert ((q_var[FREE] * LAM - 1).abs() < 0.05).all(), q_var[FREE]
    _, q_var_constant, _ = fit_kronecker(ngvi.NNGFull, None)
    assert (q_var_constant[FREE] * LAM < 0.5).all(), q_var_constant[FREE]


@pytest.mark.xfail(
    strict=True,
    reason="noisy K-FAC's prior is factored damping (A + pi*sqrt(g))(S + sqrt(g)/pi): an unconstrained "
    "weight keeps a precision of ~25-40x the prior's with or without forget_start (its variance "
    "0.025-0.04 of 1/lambda at 4,000 steps; the constrained marginals within 6-7% of the exact ones)",
)
def test_noisy_kfac_forgetting_reaches_the_prior_where_no_data_are():
    _, q_var, _ = fit_kronecker(ngvi.NoisyKFAC, 1e-2)
    assert ((q_var[FREE] * LAM - 1).abs() < 0.05).all(), q_var[FREE]
