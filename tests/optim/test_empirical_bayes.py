"""``empirical_bayes=``: the prior precision λ learned during training (EM / type-II ML of the ELBO).

Truth: Bayesian linear regression y = Xw + e, e ~ N(0, 1/τ), w ~ N(0, I/λ), with orthogonal columns
(XᵀX = diag(d)), so the mean-field posterior is the exact one and the ELBO at the optimal q is the log
evidence. Along the unit directions uᵢ = Xᵢ/√dᵢ the marginal of y has variance 1/τ + dᵢ/λ (the other n − P
directions 1/τ, free of λ), so with cᵢ = uᵢᵀy

    log p(y | λ) = −½ Σᵢ [log(1/τ + dᵢ/λ) + cᵢ²/(1/τ + dᵢ/λ)] + const,

maximised here over log λ by scipy's bounded scalar search (to 10⁻¹⁰ in log λ). The evidence separates
over orthogonal directions, so one λ per layer maximises each layer's own sum. The rules are run with
the decaying schedule of ``test_exactness.py`` under which they reach the exact mean-field posterior:
VON with Hutchinson's estimator (exact for a diagonal Hessian: z⊙(Hz) = diag H for Rademacher z) and IVON.
Tolerance on λ: 2% (seen: at most 0.8% over seeds 0–2 for VON, 0.2% for IVON).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from scipy.optimize import minimize_scalar
from test_exactness import anneal

import ngvi
from ngvi.optim.engine.empirical_bayes import prior_precisions
from optimizer_db import TRAINERS, assert_same, saved, trainers

STEPS, TOL = 3000, 0.02
HUTCHINSON = "ignore:Using backward\\(\\) with create_graph=True"


def orthogonal_regression(seed: int, scales: tuple[float, ...], n: int = 40, tau: float = 4.0):
    """X [n, P] with orthogonal columns of squared norms d; w of the k-th block ~ N(0, scales[k]²), four
    weights a block; y = Xw + noise of precision τ."""
    gen = torch.Generator().manual_seed(seed)
    p = 4 * len(scales)
    q, _ = torch.linalg.qr(torch.randn(n, p, generator=gen, dtype=torch.float64))
    d = torch.linspace(0.5, 3.0, p, dtype=torch.float64) ** 2 * n / 4
    x = q * d.sqrt()
    w = torch.randn(p, generator=gen, dtype=torch.float64) * torch.tensor(scales).repeat_interleave(4)
    y = x @ w + torch.randn(n, generator=gen, dtype=torch.float64) / tau**0.5
    return x, y, tau


def type2_ml(x: torch.Tensor, y: torch.Tensor, tau: float) -> float:
    """argmax_λ log p(y | λ) (module docstring) for the columns of x."""
    d = (x * x).sum(0)
    c2 = (x.T @ y) ** 2 / d

    def neg_log_evidence(log_lam: float) -> float:
        v = 1 / tau + d / math.exp(log_lam)
        return float(0.5 * (v.log() + c2 / v).sum())

    result = minimize_scalar(neg_log_evidence, bounds=(-12, 12), method="bounded", options={"xatol": 1e-10})
    assert -11 < result.x < 11  # an interior optimum, not a bound
    return math.exp(result.x)


class Additive(torch.nn.Module):
    """f(x) = x[:, :4]·w₁ + x[:, 4:]·w₂ …: one weight tensor (a "layer") per block of four columns."""

    def __init__(self, blocks: int):
        super().__init__()
        self.w = torch.nn.ParameterList(
            torch.nn.Parameter(torch.zeros(4, dtype=torch.float64)) for _ in range(blocks)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(x[:, 4 * k : 4 * k + 4] @ w for k, w in enumerate(self.w))


RULES = {
    "VON-hutchinson": (
        lambda ps, n, eb: ngvi.VON(
            ps, n, lr=0.2, beta=0.01, curvature="hutchinson", seed=0, empirical_bayes=eb
        ),
        True,
    ),
    "IVON": (
        lambda ps, n, eb: ngvi.IVON(
            ps, n, lr=0.2, betas=(0.9, 0.99), hess_init=10.0, seed=0, empirical_bayes=eb
        ),
        False,
    ),
}


def fit(rule: str, seed: int, scales: tuple[float, ...], eb, steps: int = STEPS):
    x, y, tau = orthogonal_regression(seed, scales)
    make, graph = RULES[rule]
    model = Additive(len(scales))
    opt = make(model.parameters(), x.shape[0], eb)

    def closure():
        opt.zero_grad()
        loss = 0.5 * tau * (model(x) - y).square().mean()
        loss.backward(create_graph=graph)
        return loss

    for t in range(steps):
        anneal(opt, t)  # test_exactness.py's schedule: the curvature EMA becomes a running average
        opt.step(closure)
    return x, y, tau, opt


@pytest.mark.filterwarnings(HUTCHINSON)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_learned_prior_is_the_type2_ml_one(rule, seed):
    # every=70: the last update is at step 2940, so the final check also sees 60 steps of q under that λ
    x, y, tau, opt = fit(rule, seed, (1.4,), ngvi.EmpiricalBayes(every=70))
    (lam,) = prior_precisions(opt)
    truth = type2_ml(x, y, tau)
    assert abs(lam / truth - 1) < TOL, (lam, truth)
    # the fixed point: λ = P / Σ(μ² + σ²) of the posterior the rule holds now, 60 steps after the update
    post = opt.posterior()
    fixed = 4 / float(sum((m.square() + v).sum() for m, v in zip(post.mean, post.variance, strict=True)))
    assert abs(lam / fixed - 1) < 1e-3, (lam, fixed)


@pytest.mark.filterwarnings(HUTCHINSON)
def test_per_layer_and_per_group():
    scales = (0.3, 3.0)  # type-II ML λ ≈ 18 and ≈ 0.18: per layer the two must come apart
    x, y, tau, opt = fit("VON-hutchinson", 0, scales, "layer")
    assert len(opt.param_groups) == 2
    lams = prior_precisions(opt)
    truths = [type2_ml(x[:, 4 * k : 4 * k + 4], y, tau) for k in range(2)]
    for lam, truth in zip(lams, truths, strict=True):
        assert abs(lam / truth - 1) < TOL, (lams, truths)
    assert lams[0] > 10 * lams[1]
    # per group: one λ for all eight weights, the maximiser of the pooled evidence, between the two
    x, y, tau, opt = fit("VON-hutchinson", 0, scales, "group")
    (lam,) = prior_precisions(opt)
    pooled = type2_ml(x, y, tau)
    assert abs(lam / pooled - 1) < TOL, (lam, pooled)
    assert truths[1] < lam < truths[0]
    assert "learned prior precision" in str(opt.diagnostics())
    assert opt.diagnostics().learned_prior_prec == [lam]


def _has_prior(info) -> bool:
    return info.engine and info.cls is not ngvi.VadaGrad and getattr(info.cls, "_has_posterior", True)


@pytest.mark.filterwarnings(HUTCHINSON)
@pytest.mark.parametrize("info", trainers(_has_prior))
def test_every_rule_with_a_prior_takes_the_em_step(info):
    """Until its first update the option changes nothing (bitwise); the update writes P/Σ(μ² + σ²) of
    the posterior the rule holds at that step, into the rule's own key."""
    with_eb, without = info.model(), info.model()
    a = info.build(with_eb, seed=0, empirical_bayes=ngvi.EmpiricalBayes(every=3))
    b = info.build(without, seed=0)
    before = prior_precisions(a)
    info.train(with_eb, a, 3)
    info.train(without, b, 3)
    assert_same(list(with_eb.parameters()), list(without.parameters()))
    post = b.posterior()
    count = sum(m.numel() for m in post.mean)
    total = sum(
        float(m.double().square().sum() + v.double().sum())
        for m, v in zip(post.mean, post.variance, strict=True)
    )
    (lam,) = prior_precisions(a)
    assert lam != before[0]
    assert lam == pytest.approx(count / total, rel=1e-9)
    a._check_group(a.param_groups[0])  # the rule's own checks accept the learned value


@pytest.mark.parametrize("name", ["vadam", "ivon", "noisy_adam", "noisy_kfac"])
def test_state_dict_keeps_the_learned_prior(name):
    info = next(i for i in TRAINERS if i.name == name)
    eb = ngvi.EmpiricalBayes(every=2, decay=0.5)
    model = info.model()
    opt = info.build(model, seed=0, empirical_bayes=eb)
    info.train(model, opt, 4)
    learned = prior_precisions(opt)
    state = saved(opt.state_dict())
    twin_model = copy.deepcopy(model)
    twin = info.build(twin_model, seed=0, empirical_bayes=eb)
    twin.load_state_dict(state)
    assert prior_precisions(twin) == learned != [1.0]
    info.train(model, opt, 3, batch_seed=2)  # the resumed run takes the same steps and the same updates
    info.train(twin_model, twin, 3, batch_seed=2)
    assert_same(list(model.parameters()), list(twin_model.parameters()))
    assert prior_precisions(twin) == prior_precisions(opt)


def test_decay_and_bounds():
    """decay d: log λ ← d·log λ + (1 − d)·log λ*; bounds clip it."""
    info = next(i for i in TRAINERS if i.name == "vadam")
    plain, damped = info.model(), info.model()
    a = info.build(plain, seed=0, empirical_bayes=ngvi.EmpiricalBayes(every=2))
    b = info.build(damped, seed=0, empirical_bayes=ngvi.EmpiricalBayes(every=2, decay=0.75))
    info.train(plain, a, 2)
    info.train(damped, b, 2)
    (target,), (got,) = prior_precisions(a), prior_precisions(b)
    assert got == pytest.approx(math.exp(0.25 * math.log(target)), rel=1e-12)  # from λ = 1
    model = info.model()
    clipped = info.build(model, seed=0, empirical_bayes=ngvi.EmpiricalBayes(every=2, bounds=(0.1, 2.0)))
    info.train(model, clipped, 2)
    assert target > 2 and prior_precisions(clipped) == [2.0]


def test_off_by_default_and_no_extra_keys():
    info = next(i for i in TRAINERS if i.name == "vadam")
    opt = info.build(info.model(), seed=0)
    assert opt.empirical_bayes is None and opt.diagnostics().learned_prior_prec is None
    assert "learned prior" not in str(opt.diagnostics())


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("yes", "empirical_bayes must be None, True, 'group', 'layer'"),
        (1, "empirical_bayes must be None, True, 'group', 'layer'"),
        ({"per": "group"}, "empirical_bayes must be None, True, 'group', 'layer'"),
    ],
)
def test_invalid_option(value, match):
    with pytest.raises(ValueError, match=match):
        ngvi.Vadam(torch.nn.Linear(2, 1).parameters(), 10, empirical_bayes=value)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"per": "tensor"}, "per must be 'group' or 'layer'"),
        ({"every": 0}, "every must be a positive int"),
        ({"every": 2.5}, "every must be a positive int"),
        ({"start": 0}, "start must be a positive int"),
        ({"decay": 1.0}, r"decay must be a number in \[0, 1\)"),
        ({"decay": -0.1}, r"decay must be a number in \[0, 1\)"),
        ({"bounds": (1.0, 0.5)}, "bounds must be"),
        ({"bounds": 3.0}, "bounds must be a pair"),
    ],
)
def test_invalid_schedule(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ngvi.EmpiricalBayes(**kwargs)


def test_refused_where_there_is_no_prior_or_no_posterior():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    with pytest.raises(ValueError, match="VadaGrad has no prior"):
        ngvi.VadaGrad(model.parameters(), empirical_bayes=True)
    with pytest.raises(ValueError, match="KFAC is a point estimate"):
        ngvi.baselines.KFAC(model, 10, empirical_bayes=True)
    with pytest.raises(ValueError, match="per='layer' is not offered"):
        ngvi.VOGN(model, 10, empirical_bayes="layer")
