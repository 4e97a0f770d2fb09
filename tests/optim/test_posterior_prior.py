"""A posterior as the next prior (``opt.set_prior``, :mod:`ngvi.optim.engine.posterior_prior`) against the
truth: Bayesian linear regression split into tasks, whose exact sequential answers are linear algebra."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ngvi
from ngvi.posterior import flatten

DIAGONAL_RULES = {
    "Vadam": lambda params, n, **kw: ngvi.Vadam(params, n, **kw),
    "Vprop": lambda params, n, **kw: ngvi.Vprop(params, n, **kw),
    "VON": lambda params, n, **kw: ngvi.VON(params, n, **kw),
    "IVON": lambda params, n, **kw: ngvi.IVON(params, n, **kw),
    "NoisyAdam": lambda params, n, **kw: ngvi.NoisyAdam(params, n, **kw),
    "BAdam": lambda params, n, **kw: ngvi.BAdam(params, n, **kw),
}


def _regression(n: int, d: int, seed: int, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mix = torch.eye(d) + 0.5 * torch.randn(d, d, generator=gen)  # correlated features
    x = (torch.randn(n, d, generator=gen) @ mix).double()
    w = torch.tensor([1.0, -2.0, 0.5, 1.5][:d]).double()
    y = (x @ w + 0.3 + torch.randn(n, generator=gen).double() / tau**0.5).unsqueeze(1)
    return x, y


def _design(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)  # nn.Linear's order: weight, then bias


def _fit(opt, model, x, y, tau: float, steps: int, decay: float) -> None:
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: max(decay**t, 0.005))

    def closure():
        opt.zero_grad()
        out = model(x)
        return 0.5 * tau * (out - y).square().sum(1).mean(), out

    for _ in range(steps):
        opt.step(closure)
        sched.step()


def _tiny_run(rule: str, prior_as_posterior: bool, flat: bool | None) -> ngvi.DiagonalGaussian:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    x, y = torch.randn(32, 3).double(), torch.randn(32, 1).double()
    opt = DIAGONAL_RULES[rule](model.parameters(), 32, prior_prec=2.0, seed=0, flat=flat)
    if prior_as_posterior:
        opt.set_prior(ngvi.DiagonalGaussian.isotropic(list(model.parameters()), 2.0))

    def closure():
        opt.zero_grad()
        loss = (model(x) - y).square().mean()
        loss.backward()
        return loss

    for _ in range(10):
        opt.step(closure)
    return opt.posterior()


@pytest.mark.parametrize("flat", [None, False], ids=["flat", "per_tensor"])
@pytest.mark.parametrize("rule", sorted(DIAGONAL_RULES))
def test_the_scalar_prior_given_as_a_posterior_is_the_scalar_prior_bitwise(rule, flat):
    """N(0, I/λ) given through set_prior is the rule with prior_prec=λ, bit for bit: Λ₀/N is formed as
    (Λ₀ − λ)/N + λ/N = λ/N exactly and ĝ − Λ̃₀⊙0 = ĝ."""
    a, b = _tiny_run(rule, False, flat), _tiny_run(rule, True, flat)
    for u, v in zip(a.mean + a.variance, b.mean + b.variance, strict=True):
        assert torch.equal(u, v)


@pytest.mark.filterwarnings("ignore::ngvi.PosteriorWarning")  # s stays at 0 here, as intended
@pytest.mark.parametrize("rule", ["Vadam", "Vprop", "VON", "NoisyAdam"])
def test_without_data_the_posterior_is_the_prior(rule):
    """A zero data term (ĝ = ĥ = 0) from q₀ = the scalar prior (init_prec=None, s₀ = 0): the precision is Λ₀
    exactly at every step, and μ converges to m₀ (to 1e-8)."""
    p = nn.Parameter(torch.zeros(2, 3, dtype=torch.float64))
    opt = DIAGONAL_RULES[rule]([p], 10, lr=0.1, prior_prec=1.0, init_prec=None, seed=0)
    m0 = torch.linspace(-2, 2, 6, dtype=torch.float64).reshape(2, 3)
    var = torch.linspace(0.2, 3.0, 6, dtype=torch.float64).reshape(2, 3)
    opt.set_prior(ngvi.DiagonalGaussian([m0], [var]))

    def closure():
        opt.zero_grad()
        loss = (p * 0).sum()
        loss.backward()
        return loss

    for _ in range(1500):
        opt.step(closure)
    post = opt.posterior()
    torch.testing.assert_close(post.variance[0], var, rtol=1e-12, atol=0)
    torch.testing.assert_close(post.mean[0], m0, rtol=0, atol=1e-8)


def _mean_field_sequence(tasks, tau: float, lam: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The sequential mean-field fixed point, exactly: task t's q under the prior q_{t−1} = N(m, diag(1/p))
    solves (τXᵀX + diag p)μ = τXᵀy + p⊙m with precision τ diag(XᵀX) + p (the stationarity of its ELBO)."""
    d = tasks[0][0].shape[1] + 1
    m, p = torch.zeros(d, dtype=torch.float64), torch.full((d,), lam, dtype=torch.float64)
    out = []
    for x, y in tasks:
        xb = _design(x)
        mean = torch.linalg.solve(tau * xb.T @ xb + torch.diag(p), tau * xb.T @ y[:, 0] + p * m)
        m, p = mean, tau * (xb * xb).sum(0) + p
        out.append((m, p))
    return out


def _tasks(T: int, n: int, d: int, tau: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = _regression(n * T, d, seed=3, tau=tau)
    return [(x[i * n : (i + 1) * n], y[i * n : (i + 1) * n]) for i in range(T)]


def test_vogn_task_by_task_reaches_the_sequential_mean_field_fixed_point():
    """VOGN with the Gauss-Newton of sampled targets, three tasks, each under the last posterior: after each
    task the mean is within 0.1 posterior s.d. and the precision within 5% of the exact sequential
    mean-field fixed point (measured: ≤ 0.074 s.d. and ≤ 2.3%; the precision's error is the EMA's sampling
    noise, √(β/N) ≈ 1.4%, the mean's the MC gradient's at the last step size)."""
    tau, lam, n = 2.0, 1.0, 100
    tasks = _tasks(3, n, 3, tau)
    truth = _mean_field_sequence(tasks, tau, lam)
    torch.manual_seed(0)
    model = nn.Linear(3, 1).double()
    post = None
    for (x, y), (m, p) in zip(tasks, truth, strict=True):
        opt = ngvi.VOGN(
            model, n, lr=0.5, beta=0.02, momentum=0.0, prior_prec=lam, curvature="fisher",
            likelihood="gaussian", noise_prec=tau, seed=0, mc_samples=2,
        )  # fmt: skip
        if post is not None:
            opt.set_prior(post)
        _fit(opt, model, x, y, tau, steps=400, decay=0.985)
        post = opt.posterior()
        mean, prec = flatten(post.mean), flatten(post.variance).reciprocal()
        assert ((mean - m).abs() * p.sqrt()).max() < 0.1
        assert ((prec - p).abs() / p).max() < 0.05


def test_nng_full_task_by_task_reaches_the_joint_exact_posterior():
    """NNG-full (true Fisher) on three tasks, each under the previous posterior as its dense prior: the
    last posterior is the exact posterior of all the data (Bayes' rule applied task by task is exact for a
    Gaussian model): covariance within 10% (relative Frobenius), mean within 0.1 posterior s.d., the
    tolerances of the one-task test (tests/optim/test_nng.py)."""
    tau, prior_var, n = 1.5, 10.0, 150
    tasks = _tasks(3, n, 4, tau)
    xb = _design(torch.cat([x for x, _ in tasks]))
    y = torch.cat([y for _, y in tasks])
    exact_cov = torch.linalg.inv(tau * xb.T @ xb + torch.eye(5, dtype=torch.float64) / prior_var)
    exact_mean = exact_cov @ (tau * xb.T @ y).squeeze(1)
    torch.manual_seed(0)
    model = nn.Linear(4, 1).double()
    post = None
    for x, y_t in tasks:
        opt = ngvi.NNGFull(
            model, n, lr=0.5, beta=0.02, prior_var=prior_var, damping=0.0, mc_samples=2,
            curvature="fisher", likelihood="gaussian", noise_prec=tau, seed=0,
        )  # fmt: skip
        if post is not None:
            opt.set_prior(post)
        _fit(opt, model, x, y_t, tau, steps=300, decay=0.98)
        post = opt.posterior()
    assert isinstance(post, ngvi.FullGaussian)
    assert (post.covariance - exact_cov).norm() / exact_cov.norm() < 0.1
    mean = flatten(post.mean)
    assert ((mean - exact_mean).abs() / exact_cov.diagonal().sqrt()).max() < 0.1


# ------------------------------------------------------------------------------------------------------------
# what a user may get wrong, and what must survive
# ------------------------------------------------------------------------------------------------------------
def _model_and_opt(**kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    return model, ngvi.Vadam(model.parameters(), 50, seed=0, **kw)


def test_a_prior_of_other_shapes_or_count_or_names_is_refused_in_one_line():
    model, opt = _model_and_opt()
    good = opt.posterior()
    wrong_shape = ngvi.DiagonalGaussian(
        [torch.zeros(4, 4), *good.mean[1:]], [torch.ones(4, 4), *good.variance[1:]]
    )
    for bad, words in (
        (wrong_shape, r"has shape \(4, 4\)"),
        (ngvi.DiagonalGaussian(good.mean[:2], good.variance[:2]), "covers 2 tensors"),
    ):
        with pytest.raises(ValueError, match=words) as err:
            opt.set_prior(bad)
        assert "\n" not in str(err.value)
    named = opt.posterior().annotate(names=["a", "b", "c", "d"])
    with pytest.raises(ValueError, match=r"'a' but the optimizer's parameter 0 is '0\.weight'"):
        opt.set_prior(named, model=model)
    with pytest.raises(TypeError, match="takes a posterior"):
        opt.set_prior(3.0)
    assert not any("prior_prec" in st for st in opt.state.values())  # refused: nothing written


def test_options_that_read_a_scalar_prior_are_refused():
    model, opt = _model_and_opt(empirical_bayes=True)
    with pytest.raises(ValueError, match="empirical_bayes"):
        opt.set_prior(opt.posterior())
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    kfac = ngvi.NoisyKFAC(model, 50)
    with pytest.raises(TypeError, match="does not take a posterior"):
        kfac.set_prior(kfac.posterior())
    model, opt = _model_and_opt()
    opt.set_prior(opt.posterior())
    x, y = torch.randn(20, 3).double(), torch.randint(0, 2, (20,))
    with pytest.raises(TypeError, match="posterior prior"):
        ngvi.calibrate(model, opt, [(x, y)])


def test_frozen_parameters_and_groups():
    """A frozen parameter is left out of the prior (as of posterior()) and gets no state; two groups with
    their own λ take the prior's tensors in group order, and set_prior(None) restores the scalar prior."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    model[0].bias.requires_grad_(False)
    groups = [
        {"params": list(model[0].parameters()), "prior_prec": 3.0},
        {"params": list(model[2].parameters())},
    ]
    opt = ngvi.Vadam(groups, 50, seed=0)
    prior = opt.posterior()
    assert len(prior.mean) == 3
    opt.set_prior(prior)
    assert model[0].bias not in opt.state or "prior_prec" not in opt.state[model[0].bias]
    torch.testing.assert_close(opt.state[model[2].weight]["prior_prec"], prior.variance[1].reciprocal())
    opt.set_prior(None)
    assert not any("prior_prec" in st for st in opt.state.values())


def test_a_state_dict_and_a_saved_file_round_trip_the_prior(tmp_path):
    """The prior lives in the state: a resumed optimizer steps bitwise as the original; a saved posterior
    read back by path (checked against the model) is the same prior."""
    model, opt = _model_and_opt()
    x, y = torch.randn(20, 3).double(), torch.randint(0, 2, (20,))

    def closure(m=model, o=opt):
        o.zero_grad()
        loss = nn.functional.cross_entropy(m(x), y)
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    path = ngvi.save_posterior(model, opt, tmp_path / "task1.safetensors")
    opt.set_prior(path, model=model)
    prior = ngvi.load_posterior(path)
    torch.testing.assert_close(opt.state[model[0].weight]["prior_mean"], prior.mean[0])
    saved = opt.state_dict()
    twin = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    twin.load_state_dict(model.state_dict())
    opt2 = ngvi.Vadam(twin.parameters(), 50, seed=0)
    opt2.load_state_dict(saved)
    for _ in range(3):
        opt.step(closure)
        opt2.step(lambda: closure(twin, opt2))
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_state_dict_with_a_broken_prior_is_refused():
    _, opt = _model_and_opt()
    opt.set_prior(opt.posterior())
    saved = opt.state_dict()
    bad = {**saved, "state": {k: dict(v) for k, v in saved["state"].items()}}
    bad["state"][0]["prior_prec"] = -bad["state"][0]["prior_prec"]
    with pytest.raises(ValueError, match=r"'prior_prec' of .* must be positive"):
        opt.load_state_dict(bad)
    bad["state"][0]["prior_prec"] = torch.ones(2, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"'prior_prec' .* has shape \(2, 2\)"):
        opt.load_state_dict(bad)
