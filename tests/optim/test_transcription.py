"""Each rule equals a plain line-by-line transcription of its paper's equations, at two levels.

**The cores** (:mod:`ngvi.optim.functional`): each rule's update and precision core, called directly on
random float64 tensors (two parameter tensors with *different* step counts, so the per-tensor bias corrections
are exercised), equals the equations written out with ordinary per-tensor arithmetic.

**The rules, end to end**: each optimizer, stepped on a small problem with the sampling noise fixed, equals
the same transcription including the weight draw. The noise is fixed by replaying the optimizer's generator:
the engine documents that each sample draws ε ~ N(0, I) parameter by parameter (in group order) from
``torch.Generator().manual_seed(opt.seed)``, and that the Hutchinson estimator then draws its Rademacher z,
parameter by parameter.

Tolerance: 1e-12 relative (float64 round-off; the library uses fused foreach kernels).
"""

from __future__ import annotations

import math

import pytest
import torch

import ngvi
from ngvi.optim import functional as F

N = 40  # data_size
STEPS = 3


def problem(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(8, 3, generator=gen, dtype=torch.float64)
    Y = torch.randn(8, 2, generator=gen, dtype=torch.float64)
    W = torch.randn(3, 2, generator=gen, dtype=torch.float64) * 0.5
    b = torch.randn(2, generator=gen, dtype=torch.float64) * 0.5
    return X, Y, [W, b]


def loss_fn(params, X, Y):
    W, b = params
    return torch.log(torch.cosh(X @ W + b - Y)).sum(1).mean()  # smooth, not quadratic


def grad_at(theta, X, Y, create_graph=False):
    theta = [t.detach().requires_grad_(True) for t in theta]
    g = torch.autograd.grad(loss_fn(theta, X, Y), theta, create_graph=create_graph)
    return theta, g


def run_library(opt_factory, mc_samples=1, create_graph=False):
    X, Y, init = problem()
    params = [torch.nn.Parameter(t.clone()) for t in init]
    opt = opt_factory(params, mc_samples)

    def closure():
        opt.zero_grad()
        loss = loss_fn(params, X, Y)
        loss.backward(create_graph=create_graph)
        return loss

    for _ in range(STEPS):
        opt.step(closure)
    return [p.detach() for p in params], opt


class Replay:
    """The optimizer's noise, drawn again from a generator with its seed."""

    def __init__(self, seed):
        self.gen = torch.Generator().manual_seed(seed)

    def normal(self, like):
        return [torch.empty_like(t).normal_(generator=self.gen) for t in like]

    def rademacher(self, like):
        return [torch.empty_like(t).bernoulli_(0.5, generator=self.gen).mul_(2).sub_(1) for t in like]


def assert_close(lib, ref):
    for a, b in zip(lib, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def mc_mean(values_per_sample):
    return [sum(vs) / len(vs) for vs in zip(*values_per_sample, strict=True)]


# ------------------------------------------------------------------------------------------------------------
# The cores, on random tensors
# ------------------------------------------------------------------------------------------------------------
SHAPES = [(4, 3), (3,)]
T = [3, 7]  # per-tensor step counts


def rand(seed: int, positive: bool = False) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
    return [t.abs() + 0.1 for t in out] if positive else out


def clones(ts):
    return [t.clone() for t in ts]


def test_vadam_core_is_eqs_89_93():
    lr, b1, b2, lt = 0.05, 0.9, 0.99, 0.03
    mu, g, u, s = rand(0), rand(1), rand(2), rand(3, positive=True)
    g2 = [gi * gi + 0.1 for gi in g]  # an MC mean of squares need not be the square of the mean
    mu_c, u_c, s_c = clones(mu), clones(u), clones(s)
    F.vadam_update_(
        mu_c,
        g,
        g2,
        u_c,
        s_c,
        lr=lr,
        beta1=b1,
        beta2=b2,
        prior_tilde=lt,
        bias1=[1 - b1**t for t in T],
        bias2=[1 - b2**t for t in T],
    )
    for i, t in enumerate(T):
        u_new = b1 * u[i] + (1 - b1) * (g[i] + lt * mu[i])  # (89)
        s_new = b2 * s[i] + (1 - b2) * g2[i]  # (90)
        u_hat, s_hat = u_new / (1 - b1**t), s_new / (1 - b2**t)  # (91, 92)
        mu_new = mu[i] - lr * u_hat / (torch.sqrt(s_hat) + lt)  # (93)
        assert_close([mu_c[i], u_c[i], s_c[i]], [mu_new, u_new, s_new])


def test_vprop_core_is_eq_14():
    lr, step, lt = 0.05, 0.1, 0.03  # beta is the paper's step β_t
    mu, g, s = rand(0), rand(1), rand(3, positive=True)
    g2 = [gi * gi for gi in g]
    mu_c, s_c = clones(mu), clones(s)
    F.vprop_update_(mu_c, g, g2, s_c, lr=lr, beta=step, prior_tilde=lt)
    for i in range(len(SHAPES)):
        s_new = (1 - step) * s[i] + step * g2[i]
        mu_new = mu[i] - lr * (g[i] + lt * mu[i]) / (torch.sqrt(s_new) + lt)
        assert_close([mu_c[i], s_c[i]], [mu_new, s_new])


def test_vprop_core_debiased_step():
    """step_moment="debiased": s is the EMA v from 0 and the step divides by √(v/(1−(1−β)ᵗ)) + λ̃."""
    lr, step, lt = 0.05, 0.1, 0.03
    mu, g, v = rand(0), rand(1), rand(3, positive=True)
    g2 = [gi * gi for gi in g]
    mu_c, v_c = clones(mu), clones(v)
    bias = [1 - (1 - step) ** t for t in T]
    F.vprop_update_(mu_c, g, g2, v_c, lr=lr, beta=step, prior_tilde=lt, bias=bias)
    for i in range(len(SHAPES)):
        v_new = (1 - step) * v[i] + step * g2[i]
        mu_new = mu[i] - lr * (g[i] + lt * mu[i]) / (torch.sqrt(v_new / bias[i]) + lt)
        assert_close([mu_c[i], v_c[i]], [mu_new, v_new])


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_von_core_is_eqs_7_8_with_riemannian_correction(momentum):
    lr, beta, lt = 0.05, 0.2, 0.03
    mu, g, h_hat, s, prev = rand(0), rand(1), rand(2), rand(3, positive=True), rand(4)
    h_hat[0][0, 0] = -50.0  # a very negative Price estimate: s + λ̃ must stay positive
    buf = [m - p for m, p in zip(mu, prev, strict=True)]  # μ_t − μ_{t−1}
    mu_c, s_c, buf_c = clones(mu), clones(s), clones(buf)
    F.von_update_(  # ĥ is consumed (its buffer holds s + λ̃ afterwards): a copy
        mu_c,
        g,
        clones(h_hat),
        s_c,
        buf_c if momentum else None,
        lr=lr,
        beta=beta,
        prior_tilde=lt,
        momentum=momentum,
    )
    for i in range(len(SHAPES)):
        s_new = (
            (1 - beta) * s[i] + beta * h_hat[i] + 0.5 * beta**2 * (h_hat[i] - s[i]) ** 2 / (s[i] + lt)
        )  # (8)
        mu_new = mu[i] - lr * (g[i] + lt * mu[i]) / (s_new + lt)  # (7)
        mu_new = mu_new + momentum * (s[i] + lt) / (s_new + lt) * buf[i]  # natural momentum (18)
        assert_close([mu_c[i], s_c[i]], [mu_new, s_new])
        assert bool((s_c[i] + lt > 0).all())
        if momentum:
            assert_close([buf_c[i]], [mu_new - mu[i]])  # the buffer now holds μ_{t+1} − μ_t


@pytest.mark.parametrize("clip", [None, 0.3])
def test_ivon_core_is_algorithm_1(clip):
    lr, b1, b2, delta = 0.1, 0.9, 0.95, 0.05
    m, g, h_hat, g_bar, h = rand(0), rand(1), rand(2), rand(3), rand(4, positive=True)
    m_c, gb_c, h_c = clones(m), clones(g_bar), clones(h)
    F.ivon_update_(
        m_c,
        g,
        h_hat,
        gb_c,
        h_c,
        lr=lr,
        beta1=b1,
        beta2=b2,
        weight_decay=delta,
        bias1=[1 - b1**t for t in T],
        clip_radius=clip,
    )
    for i, t in enumerate(T):
        gb_new = b1 * g_bar[i] + (1 - b1) * g[i]
        h_new = (
            b2 * h[i] + (1 - b2) * h_hat[i] + 0.5 * (1 - b2) ** 2 * (h[i] - h_hat[i]) ** 2 / (h[i] + delta)
        )
        step = (gb_new / (1 - b1**t) + delta * m[i]) / (h_new + delta)
        if clip is not None:
            step = torch.clamp(step, -clip, clip)
        assert_close([m_c[i], gb_c[i], h_c[i]], [m[i] - lr * step, gb_new, h_new])


def test_noisy_adam_core_is_nng_algorithm_1():
    lr, b1, b2, gamma_in, gamma_ex = 0.05, 0.9, 0.99, 0.02, 1e-2
    mu, g, m, f = rand(0), rand(1), rand(2), rand(3, positive=True)
    g2 = [gi * gi for gi in g]
    mu_c, m_c, f_c = clones(mu), clones(m), clones(f)
    F.noisy_adam_update_(
        mu_c,
        g,
        g2,
        m_c,
        f_c,
        lr=lr,
        beta1=b1,
        beta2=b2,
        gamma_in=gamma_in,
        damping=gamma_ex,
        bias1=[1 - b1**k for k in T],
    )
    for i, k in enumerate(T):
        v = g[i] + gamma_in * mu[i]
        m_new = b1 * m[i] + (1 - b1) * v
        f_new = b2 * f[i] + (1 - b2) * g2[i]
        mu_new = mu[i] - lr * (m_new / (1 - b1**k)) / (f_new + gamma_in + gamma_ex)
        assert_close([mu_c[i], m_c[i], f_c[i]], [mu_new, m_new, f_new])


@pytest.mark.parametrize("prior_tilde", [None, 0.05])
def test_badam_core_is_adam_on_the_map_objective(prior_tilde):
    lr, b1, b2, eps = 0.05, 0.9, 0.99, 1e-8
    theta, g, m, v = rand(0), rand(1), rand(2), rand(3, positive=True)
    th_c, m_c, v_c = clones(theta), clones(m), clones(v)
    F.badam_update_(
        th_c,
        g,
        m_c,
        v_c,
        lr=lr,
        beta1=b1,
        beta2=b2,
        eps=eps,
        prior_tilde=prior_tilde,
        bias1=[1 - b1**t for t in T],
        bias2=[1 - b2**t for t in T],
    )
    for i, t in enumerate(T):
        gi = g[i] + (prior_tilde or 0.0) * theta[i]
        m_new = b1 * m[i] + (1 - b1) * gi
        v_new = b2 * v[i] + (1 - b2) * gi**2
        th_new = theta[i] - lr * (m_new / (1 - b1**t)) / (torch.sqrt(v_new / (1 - b2**t)) + eps)
        assert_close([th_c[i], m_c[i], v_c[i]], [th_new, m_new, v_new])


def test_vadagrad_core_is_eq_96():
    lr, beta = 0.05, 0.3
    mu, g, s = rand(0), rand(1), rand(3, positive=True)
    mu_c, s_c = clones(mu), clones(s)
    F.vadagrad_update_(mu_c, g, [gi * gi for gi in g], s_c, lr=lr, beta=beta)
    for i in range(len(SHAPES)):
        s_new = s[i] + beta * g[i] ** 2
        assert_close([mu_c[i], s_c[i]], [mu[i] - lr * g[i] / torch.sqrt(s_new), s_new])


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_vogn_core_is_eqs_7_10_and_natural_momentum_eq_82(momentum):
    lr, beta, lt = 0.05, 0.2, 0.03
    mu, g, s, prev = rand(0), rand(1), rand(3, positive=True), rand(4)
    h_hat = [gi * gi for gi in rand(2)]
    buf = [m - p for m, p in zip(mu, prev, strict=True)]  # μ_t − μ_{t−1}
    mu_c, s_c, buf_c, h_c = clones(mu), clones(s), clones(buf), clones(h_hat)
    scratch = [torch.empty_like(t) for t in mu]
    F.vogn_update_(
        mu_c,
        g,
        h_c,
        s_c,
        scratch,
        buf_c if momentum else None,
        lr=lr,
        beta=beta,
        momentum=momentum,
        prior_tilde=lt,
    )
    for i in range(len(SHAPES)):
        s_new = (1 - beta) * s[i] + beta * h_hat[i]  # (10)
        mu_new = mu[i] - lr * (g[i] + lt * mu[i]) / (s_new + lt)  # (7)
        mu_new = mu_new + momentum * (s[i] + lt) / (s_new + lt) * buf[i]  # (82)
        assert_close([mu_c[i], s_c[i]], [mu_new, s_new])
        if momentum:
            assert_close([buf_c[i]], [mu_new - mu[i]])  # the buffer now holds μ_{t+1} − μ_t


def test_bbvi_core_is_adam_on_the_negative_elbo():
    lr, b1, b2, eps, lam, n = 0.01, 0.9, 0.999, 1e-8, 2.0, 40.0
    mu, rho, g, c = rand(0), [0.1 * t - 1.0 for t in rand(1)], rand(2), rand(3)
    states = [rand(4), rand(5, positive=True), rand(6), rand(7, positive=True)]
    mu_c, rho_c, st_c = clones(mu), clones(rho), [clones(x) for x in states]
    F.bbvi_update_(
        mu_c,
        rho_c,
        g,
        c,
        *st_c,
        lr=lr,
        beta1=b1,
        beta2=b2,
        eps=eps,
        prior_prec=lam,
        data_size=n,
        bias1=[1 - b1**t for t in T],
        bias2=[1 - b2**t for t in T],
    )

    def adam(x, grad, m, v, t):
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad**2
        return x - lr * (m / (1 - b1**t)) / (torch.sqrt(v / (1 - b2**t)) + eps), m, v

    for i, t in enumerate(T):
        sigma2 = torch.exp(rho[i]) ** 2
        mu_new, m1, v1 = adam(mu[i], g[i] + lam / n * mu[i], states[0][i], states[1][i], t)  # ∇_μ
        rho_new, m2, v2 = adam(rho[i], c[i] + (lam * sigma2 - 1) / n, states[2][i], states[3][i], t)  # ∇_logσ
        assert_close([mu_c[i], rho_c[i], *(x[i] for x in st_c)], [mu_new, rho_new, m1, v1, m2, v2])


def test_precision_cores():
    s, rho = rand(0, positive=True), rand(1)
    n, lam, lt = 40.0, 2.0, 0.05
    assert_close(F.scaled_precision(s, scale=n, shift=lam), [n * si + lam for si in s])  # Vadam, Vprop
    assert_close(F.shifted_precision(s, shift=lt, scale=n), [n * (si + lt) for si in s])  # VON, IVON
    assert_close(F.identity_precision(s), s)  # VadaGrad
    assert_close(F.exp_precision(rho), [1 / torch.exp(r) ** 2 for r in rho])  # BBVI
    b2, eps = 0.99, 1e-8
    got = F.laplace_precision(s, bias2=[1 - b2**t for t in T], eps=eps, data_size=n, prior_prec=lam)
    expected = [n * (torch.sqrt(si / (1 - b2**t)) + eps) + lam for si, t in zip(s, T, strict=True)]
    assert_close(got, expected)  # BADAM eq. 12 plus the prior
    _, sigma = F.diagonal_sigma(s, precision=F.scaled_precision, scale=n, shift=lam)
    assert_close(sigma, [1 / torch.sqrt(n * si + lam) for si in s])


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_kfac_cores_are_nng_eq_12_and_algorithm_2(momentum):
    gen = torch.Generator().manual_seed(0)
    groups, rows, cols, gamma_in, w = 2, 3, 4, 0.02, 0.3

    def spd(k):
        x = torch.randn(groups, k, k, generator=gen, dtype=torch.float64)
        return x @ x.mT + torch.eye(k, dtype=torch.float64)

    a, s, a_hat, s_hat = spd(cols), spd(rows), spd(cols), spd(rows)
    a_new, s_new = F.kfac_factor_ema(a, s, a_hat, s_hat, w)
    assert_close([a_new, s_new], [(1 - w) * a + w * a_hat, (1 - w) * s + w * s_hat])  # (12)
    g, m, buf = (torch.randn(groups, rows, cols, generator=gen, dtype=torch.float64) for _ in range(3))
    a_inv, s_inv = torch.linalg.inv(spd(cols)), torch.linalg.inv(spd(rows))
    step = F.kfac_natural_step([g], [m], a_inv, s_inv, gamma_in=gamma_in, momentum=momentum, buffer=buf)
    expected = s_inv @ (g + gamma_in * m) @ a_inv  # [S^γ]⁻¹ V [A^γ]⁻¹
    assert_close([step], [momentum * buf + expected if momentum else expected])


# ------------------------------------------------------------------------------------------------------------
# The rules, end to end (noise replayed from the optimizer's generator)
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mc", [1, 2])
def test_vadam_matches_fig1_eqs_88_93(mc):
    lr, b1, b2, lam, init = 0.05, 0.9, 0.99, 2.0, 30.0
    lib, opt = run_library(
        lambda ps, S: ngvi.Vadam(
            ps, N, lr=lr, betas=(b1, b2), prior_prec=lam, init_prec=init, mc_samples=S, step_moment="paper"
        ),
        mc,
    )
    X, Y, mu = problem()
    rng = Replay(opt.seed)
    u = [torch.zeros_like(t) for t in mu]
    s = [torch.full_like(t, (init - lam) / N) for t in mu]
    for t in range(1, STEPS + 1):
        gs, g2s = [], []
        for _ in range(mc):
            eps = rng.normal(mu)
            theta = [m + e / torch.sqrt(N * si + lam) for m, e, si in zip(mu, eps, s, strict=True)]  # (88)
            _, g = grad_at(theta, X, Y)
            gs.append(g)
            g2s.append([gi * gi for gi in g])
        g, g2 = mc_mean(gs), mc_mean(g2s)
        u = [b1 * ui + (1 - b1) * (gi + lam / N * m) for ui, gi, m in zip(u, g, mu, strict=True)]  # (89)
        s = [b2 * si + (1 - b2) * g2i for si, g2i in zip(s, g2, strict=True)]  # (90)
        u_hat = [ui / (1 - b1**t) for ui in u]  # (91)
        s_hat = [si / (1 - b2**t) for si in s]  # (92)
        mu = [
            m - lr * uh / (torch.sqrt(sh) + lam / N) for m, uh, sh in zip(mu, u_hat, s_hat, strict=True)
        ]  # (93)
    assert_close(lib, mu)
    assert_close([st["exp_avg_sq"] for st in opt.state.values()], s)


@pytest.mark.parametrize("init", [30.0, "auto"])
def test_vadam_debiased_step(init):
    """The default step_moment="debiased": the sample uses the paper's s = γ₂ᵗs₀ + v (eq. 88), the step Adam's
    bias-corrected v = Σ(1−γ₂)γ₂^{t−k}ĝₖ² (the EMA from 0) in place of eq. 92's s/(1−γ₂ᵗ)."""
    lr, b1, b2, lam = 0.05, 0.9, 0.99, 2.0
    lib, opt = run_library(
        lambda ps, S: ngvi.Vadam(ps, N, lr=lr, betas=(b1, b2), prior_prec=lam, init_prec=init)
    )
    X, Y, mu = problem()
    rng = Replay(opt.seed)
    s0 = 1.0 if init == "auto" else (init - lam) / N
    u = [torch.zeros_like(t) for t in mu]
    v = [torch.zeros_like(t) for t in mu]
    for t in range(1, STEPS + 1):
        s = [b2 ** (t - 1) * s0 + vi for vi in v]  # the paper's s, started at s₀
        theta = [m + e / torch.sqrt(N * si + lam) for m, e, si in zip(mu, rng.normal(mu), s, strict=True)]
        _, g = grad_at(theta, X, Y)
        u = [b1 * ui + (1 - b1) * (gi + lam / N * m) for ui, gi, m in zip(u, g, mu, strict=True)]
        v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, g, strict=True)]
        mu = [
            m - lr * (ui / (1 - b1**t)) / (torch.sqrt(vi / (1 - b2**t)) + lam / N)
            for m, ui, vi in zip(mu, u, v, strict=True)
        ]
    assert_close(lib, mu)
    precision = [N * (vi + b2**STEPS * s0) + lam for vi in v]
    assert_close([1 / var for var in opt.posterior().variance], precision)


def test_vadam_debiased_is_fig1_from_the_prior():
    """With s₀ = 0 (init_prec=None) the two step moments are the same rule, bit for bit."""
    runs = [
        run_library(lambda ps, S, m=m: ngvi.Vadam(ps, N, lr=0.05, init_prec=None, step_moment=m, seed=4))
        for m in ("paper", "debiased")
    ]
    for a, b in zip(runs[0][0], runs[1][0], strict=True):
        assert torch.equal(a, b)


def test_vprop_matches_eq_14():
    lr, step_beta, lam, init = 0.05, 0.1, 2.0, 30.0  # beta is the paper's step β_t
    lib, opt = run_library(
        lambda ps, S: ngvi.Vprop(
            ps, N, lr=lr, beta=step_beta, prior_prec=lam, init_prec=init, step_moment="paper", noise="normal"
        )
    )
    X, Y, mu = problem()
    rng = Replay(opt.seed)
    s = [torch.full_like(t, (init - lam) / N) for t in mu]
    for _ in range(STEPS):
        eps = rng.normal(mu)
        theta = [m + e / torch.sqrt(N * (si + lam / N)) for m, e, si in zip(mu, eps, s, strict=True)]
        _, g = grad_at(theta, X, Y)
        s = [(1 - step_beta) * si + step_beta * gi * gi for si, gi in zip(s, g, strict=True)]
        mu = [
            m - lr * (gi + lam / N * m) / (torch.sqrt(si) + lam / N)
            for m, gi, si in zip(mu, g, s, strict=True)
        ]
    assert_close(lib, mu)


def test_vprop_defaults_debiased_step_and_antithetic_noise():
    """Vprop's defaults: the step divides by the bias-corrected v (the EMA of ĝ² from 0), the sample uses the
    paper's s = (1−β)ᵗs₀ + v with s₀ = 1 (init_prec="auto"), and consecutive samples use ε, −ε."""
    lr, step_beta, lam = 0.05, 0.1, 2.0
    lib, opt = run_library(lambda ps, S: ngvi.Vprop(ps, N, lr=lr, beta=step_beta, prior_prec=lam))
    X, Y, mu = problem()
    rng = Replay(opt.seed)
    v = [torch.zeros_like(t) for t in mu]
    eps: list[torch.Tensor] = []
    for t in range(1, STEPS + 1):
        eps = rng.normal(mu) if t % 2 else [-e for e in eps]  # antithetic pairs (ε, −ε)
        s = [(1 - step_beta) ** (t - 1) + vi for vi in v]
        theta = [m + e / torch.sqrt(N * si + lam) for m, e, si in zip(mu, eps, s, strict=True)]
        _, g = grad_at(theta, X, Y)
        v = [(1 - step_beta) * vi + step_beta * gi * gi for vi, gi in zip(v, g, strict=True)]
        bias = 1 - (1 - step_beta) ** t
        mu = [
            m - lr * (gi + lam / N * m) / (torch.sqrt(vi / bias) + lam / N)
            for m, gi, vi in zip(mu, g, v, strict=True)
        ]
    assert_close(lib, mu)


def test_vadagrad_matches_eq_96():
    lr, beta, init = 0.05, 0.3, 20.0
    lib, opt = run_library(lambda ps, S: ngvi.VadaGrad(ps, lr=lr, beta=beta, init_prec=init))
    X, Y, mu = problem()
    rng = Replay(opt.seed)
    s = [torch.full_like(t, init) for t in mu]
    for _ in range(STEPS):
        eps = rng.normal(mu)
        theta = [m + e / torch.sqrt(si) for m, e, si in zip(mu, eps, s, strict=True)]  # σ² = 1/s
        _, g = grad_at(theta, X, Y)
        s = [si + beta * gi * gi for si, gi in zip(s, g, strict=True)]
        mu = [m - lr * gi / torch.sqrt(si) for m, gi, si in zip(mu, g, s, strict=True)]
    assert_close(lib, mu)


@pytest.mark.parametrize("momentum", [0.0, 0.5])
@pytest.mark.parametrize("hessian", ["price", "hutchinson"])
def test_von_matches_eqs_7_8_with_riemannian_correction(hessian, momentum):
    """Eqs. 7–8 (``momentum=0``) and the default natural momentum of eq. 18."""
    lr, beta, lam, init = 0.05, 0.2, 2.0, 30.0
    lib, opt = run_library(
        lambda ps, S: ngvi.VON(  # the equations alone: no trust region (on for a numeric start, issue 42)
            ps,
            N,
            lr=lr,
            beta=beta,
            prior_prec=lam,
            init_prec=init,
            hessian=hessian,
            momentum=momentum,
            kl_clip=None,
        ),
        create_graph=hessian == "hutchinson",
    )
    X, Y, mu = problem()
    rng = Replay(opt.seed)
    lam_t = lam / N
    s = [torch.full_like(t, (init - lam) / N) for t in mu]
    delta = [torch.zeros_like(t) for t in mu]  # μ_t − μ_{t−1}
    for _ in range(STEPS):
        eps = rng.normal(mu)
        sigma = [1 / torch.sqrt(N * (si + lam_t)) for si in s]
        theta = [m + sg * e for m, sg, e in zip(mu, sigma, eps, strict=True)]
        leaves, g = grad_at(theta, X, Y, create_graph=hessian == "hutchinson")
        if hessian == "price":  # App. D.1: ĥ = ĝ ε/σ = ĝ (θ−μ)/σ²
            h = [gi * (th - m) / sg**2 for gi, th, m, sg in zip(g, theta, mu, sigma, strict=True)]
        else:
            z = rng.rademacher(mu)
            hz = torch.autograd.grad(g, leaves, grad_outputs=z)
            h = [zi * hzi for zi, hzi in zip(z, hz, strict=True)]
        g = [gi.detach() for gi in g]
        s_old = s
        s = [
            (1 - beta) * si + beta * hi + 0.5 * beta**2 * (hi - si) ** 2 / (si + lam_t)
            for si, hi in zip(s, h, strict=True)
        ]
        delta = [
            -lr * (gi + lam_t * m) / (si + lam_t) + momentum * (so + lam_t) / (si + lam_t) * d
            for m, gi, si, so, d in zip(mu, g, s, s_old, delta, strict=True)
        ]  # (7) with the natural momentum of (18)
        mu = [m + d for m, d in zip(mu, delta, strict=True)]
    assert_close(lib, mu)
    assert_close([st["hess"] for st in opt.state.values()], s)


@pytest.mark.parametrize("kl_clip", [None, 1e-3])
@pytest.mark.parametrize("mc", [1, 2])
def test_ivon_matches_design_rule(mc, kl_clip):
    """DESIGN.md's rule; with ``kl_clip`` = κ the step before the clip is scaled by ν = min(1, √(κ/m)),
    m = α²Σ step²·(h + δ) (the trust region, issue 32)."""
    lr, b1, b2, delta, h0, clip = 0.1, 0.9, 0.95, 0.05, 2.0, 0.3
    lib, opt = run_library(
        lambda ps, S: ngvi.IVON(
            ps,
            N,
            lr=lr,
            betas=(b1, b2),
            weight_decay=delta,
            hess_init=h0,
            clip_radius=clip,
            mc_samples=S,
            kl_clip=kl_clip,
        ),
        mc,
    )
    X, Y, m = problem()
    rng = Replay(opt.seed)
    g_bar = [torch.zeros_like(t) for t in m]
    h = [torch.full_like(t, h0) for t in m]
    for t in range(1, STEPS + 1):
        gs, hs = [], []
        for _ in range(mc):
            sigma = [1 / torch.sqrt(N * (hi + delta)) for hi in h]
            theta = [mi + sg * e for mi, sg, e in zip(m, sigma, rng.normal(m), strict=True)]
            _, g = grad_at(theta, X, Y)
            gs.append(g)
            hs.append([gi * (th - mi) / sg**2 for gi, th, mi, sg in zip(g, theta, m, sigma, strict=True)])
        g, h_hat = mc_mean(gs), mc_mean(hs)
        g_bar = [b1 * gb + (1 - b1) * gi for gb, gi in zip(g_bar, g, strict=True)]
        h = [
            b2 * hi + (1 - b2) * hh + 0.5 * (1 - b2) ** 2 * (hi - hh) ** 2 / (hi + delta)
            for hi, hh in zip(h, h_hat, strict=True)
        ]
        step = [
            (gb / (1 - b1**t) + delta * mi) / (hi + delta) for gb, mi, hi in zip(g_bar, m, h, strict=True)
        ]
        if kl_clip is not None:
            length = lr**2 * sum((st**2 * (hi + delta)).sum() for st, hi in zip(step, h, strict=True))
            step = [st * min(1.0, math.sqrt(kl_clip / length.item())) for st in step]
        m = [mi - lr * torch.clamp(st, -clip, clip) for mi, st in zip(m, step, strict=True)]
    assert_close(lib, m)


@pytest.mark.parametrize("init", [None, "auto"])
def test_noisy_adam_matches_nng_algorithm_1(init):
    """Alg. 1 from f = 0 (``init_prec=None``) and from the default f₀ = 1."""
    lr, b1, b2, eta, kl, ext = 0.05, 0.9, 0.99, 0.5, 0.8, 1e-2
    lib, opt = run_library(
        lambda ps, S: ngvi.NoisyAdam(
            ps, N, lr=lr, betas=(b1, b2), prior_var=eta, kl_weight=kl, damping=ext, init_prec=init
        )
    )
    X, Y, mu = problem()
    rng = Replay(opt.seed)
    gamma_in = kl / (N * eta)
    gamma = gamma_in + ext
    m = [torch.zeros_like(t) for t in mu]
    f = [torch.full_like(t, 0.0 if init is None else 1.0) for t in mu]
    for k in range(1, STEPS + 1):
        # w ~ N(μ, (λ/N) diag(f + γ_in)⁻¹)
        w = [
            mi + e * torch.sqrt(kl / N / (fi + gamma_in))
            for mi, e, fi in zip(mu, rng.normal(mu), f, strict=True)
        ]
        _, g = grad_at(w, X, Y)  # g = −∇ log p
        v = [
            gi + gamma_in * mi for gi, mi in zip(g, mu, strict=True)
        ]  # prior term at E_q[w] = μ (module doc)
        m = [b1 * mi + (1 - b1) * vi for mi, vi in zip(m, v, strict=True)]
        f = [b2 * fi + (1 - b2) * gi**2 for fi, gi in zip(f, g, strict=True)]
        m_tilde = [mi / (1 - b1**k) for mi in m]
        m_hat = [mt / (fi + gamma) for mt, fi in zip(m_tilde, f, strict=True)]
        mu = [mi - lr * mh for mi, mh in zip(mu, m_hat, strict=True)]
    assert_close(lib, mu)


def test_badam_is_adam_and_reads_off_laplace_precision():
    lr, b1, b2, lam, eps = 0.05, 0.9, 0.99, 3.0, 1e-8
    lib, opt = run_library(lambda ps, S: ngvi.BAdam(ps, N, lr=lr, betas=(b1, b2), prior_prec=lam, eps=eps))
    X, Y, theta = problem()
    m = [torch.zeros_like(t) for t in theta]
    v = [torch.zeros_like(t) for t in theta]
    for t in range(1, STEPS + 1):
        _, g = grad_at(theta, X, Y)  # no perturbation: Adam at the mean
        g = [gi + lam / N * th for gi, th in zip(g, theta, strict=True)]
        m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, g, strict=True)]
        v = [b2 * vi + (1 - b2) * gi**2 for vi, gi in zip(v, g, strict=True)]
        m_hat = [mi / (1 - b1**t) for mi in m]
        v_hat = [vi / (1 - b2**t) for vi in v]
        theta = [
            th - lr * mh / (torch.sqrt(vh) + eps) for th, mh, vh in zip(theta, m_hat, v_hat, strict=True)
        ]
    assert_close(lib, theta)
    # eq. 12 plus the prior: precision N·(√v̂ + ε) + λ
    expected_var = [1 / (N * (torch.sqrt(vh) + eps) + lam) for vh in v_hat]
    assert_close(opt.posterior().variance, expected_var)
    # and it matches torch.optim.Adam with the prior as L2 (weight_decay = λ/N)
    X, Y, init = problem()
    params = [torch.nn.Parameter(t.clone()) for t in init]
    adam = torch.optim.Adam(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=lam / N)
    for _ in range(STEPS):
        adam.zero_grad()
        loss_fn(params, X, Y).backward()
        adam.step()
    assert_close(lib, [p.detach() for p in params])


def test_sampling_variance_matches_precision():
    """θ = μ + σε really has variance 1/precision: 4000 draws, a 4-sigma band on the sample variance."""
    _, _, init = problem()
    params = [torch.nn.Parameter(t.clone()) for t in init]
    opt = ngvi.Vadam(params, N, prior_prec=2.0, init_prec=9.0, seed=0)  # seeded: the band is 4σ per weight
    draws = []
    for _ in range(4000):
        with opt.sampled_params():
            draws.append(torch.cat([p.detach().flatten() for p in params]))
    var = torch.stack(draws).var(0)
    expected = 1 / 9.0
    band = 4 * expected * math.sqrt(2 / 3999)
    assert torch.all((var - expected).abs() < band), (var, expected, band)
