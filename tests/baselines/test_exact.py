"""The exact references against brute force: numpy.linalg, the evidence, quadrature and the ELBO gradient."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import integrate
from scipy.special import expit, log_expit
from scipy.stats import norm

from ngvi import DiagonalGaussian
from ngvi.baselines import exact

TAU, LAM = 4.0, 2.0


def _regression(n: int = 60, d: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    X[:, 1] += 0.8 * X[:, 0]  # correlated features, so mean field and the full posterior differ
    w = torch.randn(d, generator=g, dtype=torch.float64)
    y = X @ w + torch.randn(n, generator=g, dtype=torch.float64) / math.sqrt(TAU)
    return X, y


def _classification(n: int = 150, d: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    w = 1.5 * torch.randn(d, generator=g, dtype=torch.float64)
    y = (torch.rand(n, generator=g, dtype=torch.float64) < torch.sigmoid(X @ w)).double()
    return X, y


def _log_evidence(X: np.ndarray, y: np.ndarray, tau: float, lam: float) -> float:
    """log N(y | 0, XXᵀ/λ + I/τ), by numpy."""
    cov = X @ X.T / lam + np.eye(len(y)) / tau
    _, logdet = np.linalg.slogdet(cov)
    return -0.5 * (y @ np.linalg.solve(cov, y) + logdet + len(y) * math.log(2 * math.pi))


# ----------------------------------------------------------------------------------------------------
# linear regression
# ----------------------------------------------------------------------------------------------------
def test_linear_posterior_matches_numpy():
    X, y = _regression()
    mean, cov = exact.linear_regression_posterior(X, y, TAU, LAM)
    Xn, yn = X.numpy(), y.numpy()
    P = TAU * Xn.T @ Xn + LAM * np.eye(X.shape[1])
    np.testing.assert_allclose(mean.numpy(), np.linalg.solve(P, TAU * Xn.T @ yn), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cov.numpy(), np.linalg.inv(P), rtol=1e-10, atol=1e-14)


def test_linear_mean_field_is_full_mean_and_diagonal_precision():
    X, y = _regression()
    q = exact.linear_regression_mean_field(X, y, TAU, LAM)
    mean, cov = exact.linear_regression_posterior(X, y, TAU, LAM)
    Xn = X.numpy()
    P = TAU * Xn.T @ Xn + LAM * np.eye(X.shape[1])
    assert isinstance(q, DiagonalGaussian) and len(q.mean) == 1 and q.mean[0].shape == (X.shape[1],)
    np.testing.assert_allclose(q.precision[0].numpy(), np.diag(P), rtol=1e-12)
    torch.testing.assert_close(q.mean[0], mean, rtol=1e-12, atol=1e-12)
    assert bool((q.variance[0] < torch.diagonal(cov)).all())  # mean field under-estimates marginals here


def test_linear_mean_field_elbo_gradient_vanishes():
    X, y = _regression()
    q = exact.linear_regression_mean_field(X, y, TAU, LAM)
    mean = q.mean[0].clone().requires_grad_(True)
    log_std = (0.5 * q.variance[0].log()).requires_grad_(True)
    elbo = exact.linear_regression_elbo(mean, (2 * log_std).exp(), X, y, TAU, LAM)
    g_mean, g_log_std = torch.autograd.grad(elbo, [mean, log_std])
    assert g_mean.abs().max() < 1e-9 and g_log_std.abs().max() < 1e-9
    for dm, ds in [(1e-3, 0.0), (0.0, 1e-2), (-1e-3, -1e-2)]:  # and it is a maximum
        worse = exact.linear_regression_elbo(q.mean[0] + dm, q.variance[0] * math.exp(ds), X, y, TAU, LAM)
        assert worse < elbo


def test_linear_elbo_against_the_evidence():
    """ELBO ≤ log p(y) by numpy; with orthogonal columns the mean field is exact and they are equal."""
    X, y = _regression()
    q = exact.linear_regression_mean_field(X, y, TAU, LAM)
    elbo = exact.linear_regression_elbo(q.mean[0], q.variance[0], X, y, TAU, LAM).item()
    evidence = _log_evidence(X.numpy(), y.numpy(), TAU, LAM)
    assert elbo < evidence - 1e-3

    Q, _ = torch.linalg.qr(X)
    X_orth = Q * torch.tensor([3.0, 1.0, 0.5, 2.0], dtype=torch.float64)
    q = exact.linear_regression_mean_field(X_orth, y, TAU, LAM)
    elbo = exact.linear_regression_elbo(q.mean[0], q.variance[0], X_orth, y, TAU, LAM).item()
    assert elbo == pytest.approx(_log_evidence(X_orth.numpy(), y.numpy(), TAU, LAM), abs=1e-9)


def test_linear_prior_per_weight_and_column_targets():
    X, y = _regression()
    lam = torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=torch.float64)
    q = exact.linear_regression_mean_field(X, y.unsqueeze(1), TAU, lam)
    P = TAU * X.T @ X + torch.diag(lam)
    torch.testing.assert_close(q.precision[0], torch.diagonal(P))
    torch.testing.assert_close(q.mean[0], torch.linalg.solve(P, TAU * X.T @ y))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(noise_prec=0.0), "noise_prec"),
        (dict(noise_prec=True), "noise_prec"),
        (dict(prior_prec=-1.0), "prior_prec"),
        (dict(prior_prec=torch.ones(3)), "prior_prec"),
        (dict(y=torch.zeros(5)), "y"),
        (dict(X=torch.zeros(10)), "X"),
    ],
)
def test_linear_bad_arguments_name_themselves(kwargs, name):
    X, y = _regression(n=10)
    args = dict(X=X, y=y, noise_prec=TAU, prior_prec=LAM) | kwargs
    for fn in (exact.linear_regression_posterior, exact.linear_regression_mean_field):
        with pytest.raises(ValueError, match=name):
            fn(**args)


# ----------------------------------------------------------------------------------------------------
# logistic regression
# ----------------------------------------------------------------------------------------------------
def _reference_expectation(fn, m: float, v: float) -> float:
    """∫ fn(a) N(a | m, v) da by adaptive quadrature (scipy), split at the kink 0 and at the mean."""
    s = math.sqrt(v)
    lo, hi = m - 40 * s, m + 40 * s
    edges = [lo, *sorted({p for p in (0.0, m) if lo < p < hi}), hi]
    return sum(
        integrate.quad(lambda a: fn(a) * norm.pdf(a, m, s), a, b, epsabs=1e-14, epsrel=1e-13, limit=500)[0]
        for a, b in itertools.pairwise(edges)
    )


MV_GRID = [
    (m, v) for v in (1e-4, 0.3, 1.0, 1.0001, 4.0, 25.0, 100.0, 1e3, 1e4) for m in (-20.0, -1.0, 0.0, 0.7, 5.0)
]


def test_one_dimensional_expectations_match_adaptive_quadrature():
    """E[log sigmoid(a)] and E[sigmoid(a)] for a ~ N(m, v), narrow to very wide: both branches (Gauss–Hermite
    for v ≤ 1, closed form + split Gauss–Legendre above) agree with scipy's adaptive quadrature to 1e-11
    (64-point Gauss–Hermite alone is off by 6e-2 at v = 1000)."""
    m = torch.tensor([mv[0] for mv in MV_GRID], dtype=torch.float64)
    v = torch.tensor([mv[1] for mv in MV_GRID], dtype=torch.float64)
    log_sig = exact._expected_log_sigmoid(m, v)
    sig = exact._expected_sigmoid(m, v)
    for i, (mi, vi) in enumerate(MV_GRID):
        assert log_sig[i].item() == pytest.approx(_reference_expectation(log_expit, mi, vi), abs=1e-11)
        assert sig[i].item() == pytest.approx(_reference_expectation(expit, mi, vi), abs=1e-11)


def test_gauss_hermite_expectation_matches_scipy_quad():
    """One data point: the ELBO's likelihood term equals ∫ log sigmoid(a) N(a | m, v) da."""
    for m, v in [(0.3, 0.5), (-2.0, 4.0), (1.0, 0.01), (3.0, 400.0)]:
        X = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
        mean = torch.tensor([m, 0.0], dtype=torch.float64)
        var = torch.tensor([v / 2, v / 2], dtype=torch.float64)
        kl = DiagonalGaussian([mean], [var]).kl(DiagonalGaussian.isotropic([mean], 1.0))
        term = exact.logistic_regression_elbo(mean, var, X, torch.ones(1, dtype=torch.float64), 1.0) + kl
        assert term.item() == pytest.approx(_reference_expectation(log_expit, m, v), abs=1e-10)


def _brute_force_elbo_1d(x: np.ndarray, s: np.ndarray, lam: float, means: np.ndarray, stds: np.ndarray):
    """The 1-D ELBO on a (mean, std) grid without quadrature rules: Σᵢ log sigmoid(sᵢxᵢw) tabulated on
    4001 points of w in [−12, 12], integrated against each N(w | μ, σ²) by the trapezoid rule (spectrally
    accurate for a smooth integrand at spacing 0.006 ≪ σ)."""
    w = np.linspace(-12.0, 12.0, 4001)
    loglik = log_expit(np.outer(w, s * x)).sum(1)  # [W]
    mu, sd = means[:, None, None], stds[None, :, None]
    density = norm.pdf(w[None, None, :], mu, sd)
    expected = integrate.trapezoid(density * loglik, w, axis=-1)
    kl = 0.5 * (lam * (sd[..., 0] ** 2 + mu[..., 0] ** 2) - 1.0 - np.log(lam * sd[..., 0] ** 2))
    return expected - kl


def test_logistic_mean_field_is_the_brute_force_grid_optimum_in_1d():
    """D = 1: MF-Exact (L-BFGS on the quadrature ELBO) against a brute-force search of (μ, σ) on grids that
    zoom in around the best point (5 levels, 31 × 31 each, spacing / 7.5 per level): the grid's best point
    lies within 1.5 final spacings of MF-Exact's, and no grid point beats MF-Exact's ELBO (brute-force ELBO,
    to 1e-9 absolute); the two ELBOs at MF-Exact's point agree to 1e-8."""
    g = torch.Generator().manual_seed(3)
    x = 1.5 * torch.randn(30, generator=g, dtype=torch.float64)
    y = (torch.rand(30, generator=g, dtype=torch.float64) < torch.sigmoid(1.2 * x)).double()
    q = exact.logistic_regression_mean_field(x[:, None], y, LAM)
    mu_star, sd_star = q.mean[0].item(), q.variance[0].sqrt().item()
    xn, sn = x.numpy(), np.where(y.numpy() > 0, 1.0, -1.0)

    center, half = np.array([0.0, 0.5]), np.array([3.0, 0.49])  # μ ∈ [−3, 3], σ ∈ [0.01, 0.99]
    for _ in range(5):
        means = np.linspace(center[0] - half[0], center[0] + half[0], 31)
        stds = np.linspace(center[1] - half[1], center[1] + half[1], 31)
        elbo = _brute_force_elbo_1d(xn, sn, LAM, means, stds)
        i, j = np.unravel_index(np.argmax(elbo), elbo.shape)
        center, spacing = np.array([means[i], stds[j]]), 2 * half / 30
        half = half / 7.5
    assert abs(center[0] - mu_star) < 1.5 * spacing[0] and abs(center[1] - sd_star) < 1.5 * spacing[1]
    at_star = _brute_force_elbo_1d(xn, sn, LAM, np.array([mu_star]), np.array([sd_star]))[0, 0]
    assert at_star >= elbo.max() - 1e-9
    quad = exact.logistic_regression_elbo(q.mean[0], q.variance[0], x[:, None], y, LAM).item()
    assert quad == pytest.approx(at_star, abs=1e-8)


def test_logistic_mean_field_elbo_gradient_vanishes():
    X, y = _classification()
    q = exact.logistic_regression_mean_field(X, y, LAM)
    mean = q.mean[0].clone().requires_grad_(True)
    log_std = (0.5 * q.variance[0].log()).requires_grad_(True)
    elbo = exact.logistic_regression_elbo(mean, (2 * log_std).exp(), X, y, LAM)
    g_mean, g_log_std = torch.autograd.grad(elbo, [mean, log_std])
    scale = X.shape[0]  # the summed ELBO; per example the gradient is ~1e-9 (float64's floor for L-BFGS)
    assert g_mean.abs().max() < 1e-7 * scale and g_log_std.abs().max() < 1e-7 * scale
    print(f"max |ELBO gradient| per example: {max(g_mean.abs().max(), g_log_std.abs().max()) / scale:.1e}")
    for dm, ds in [(1e-3, 0.0), (0.0, 1e-2), (-1e-3, -1e-2)]:
        worse = exact.logistic_regression_elbo(q.mean[0] + dm, q.variance[0] * math.exp(ds), X, y, LAM)
        assert worse < elbo


def _monte_carlo_elbo(mean, variance, X, y, samples: int, seed: int) -> tuple[float, float]:
    """(ELBO, its standard error) from ``samples`` draws w ~ q, KL to the prior in closed form.

    The log-likelihood of each draw has its first-order term gᵀ(w − μ) subtracted (g its gradient at μ):
    that term has expectation zero under q, so the estimate stays unbiased and its variance drops."""
    q = DiagonalGaussian([mean], [variance])
    gen = torch.Generator().manual_seed(seed)
    s = torch.where(y > 0, 1.0, -1.0).double()
    slope = X.T @ (s * torch.sigmoid(-s * (X @ mean)))  # ∇_w Σᵢ log sigmoid(sᵢxᵢᵀw) at w = μ
    total, total_sq = 0.0, 0.0
    for _ in range(samples // 100_000):
        (w,) = q.sample(100_000, generator=gen)  # [S, D]
        value = torch.nn.functional.logsigmoid(s * (w @ X.T)).sum(1) - (w - mean) @ slope  # [S]
        total, total_sq = total + value.sum().item(), total_sq + value.square().sum().item()
    mean_value = total / samples
    se = math.sqrt((total_sq / samples - mean_value**2) / samples)
    return mean_value - q.kl(DiagonalGaussian.isotropic(q.mean, LAM)).item(), se


@pytest.mark.parametrize("where", ["mf_exact", "wide"])
def test_logistic_elbo_matches_a_million_sample_monte_carlo(where):
    """The quadrature ELBO per example equals a 10⁶-sample Monte Carlo estimate to 1e-3 (and to 4 standard
    errors), at MF-Exact and at a wider q where most logit variances vᵢ take the closed-form branch (> 1)."""
    X, y = _classification(n=40)
    if where == "mf_exact":
        q = exact.logistic_regression_mean_field(X, y, LAM)
        mean, variance = q.mean[0], q.variance[0]
    else:
        mean, variance = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), torch.full((3,), 0.5).double()
        assert ((X.square() @ variance) > 1).double().mean() > 0.5
    mc, se = _monte_carlo_elbo(mean, variance, X, y, samples=1_000_000, seed=1)
    elbo = exact.logistic_regression_elbo(mean, variance, X, y, LAM).item()
    n = X.shape[0]
    assert se / n < 2.5e-4  # the Monte Carlo estimate itself resolves 1e-3 per example
    assert abs(elbo - mc) / n < 1e-3 and abs(elbo - mc) < 4 * se


def test_logistic_elbo_gradient_matches_finite_differences():
    """∂ELBO/∂μ and ∂ELBO/∂σ² by autograd against central differences (step 1e-5, float64), at a point
    where some logit variances are below and some above the switch between the two quadrature forms."""
    X, y = _classification(n=40)
    mean = torch.tensor([0.4, -1.1, 2.0], dtype=torch.float64, requires_grad=True)
    variance = torch.tensor([0.05, 0.6, 0.3], dtype=torch.float64, requires_grad=True)
    v = X.square() @ variance.detach()
    assert (v < 1).any() and (v > 1).any()
    g_mean, g_var = torch.autograd.grad(
        exact.logistic_regression_elbo(mean, variance, X, y, LAM), [mean, variance]
    )
    h = 1e-5
    for grad, param in ((g_mean, mean), (g_var, variance)):
        for j in range(3):
            plus, minus = param.detach().clone(), param.detach().clone()
            plus[j] += h
            minus[j] -= h
            args = (plus, variance.detach()) if param is mean else (mean.detach(), plus)
            args_m = (minus, variance.detach()) if param is mean else (mean.detach(), minus)
            fd = (
                exact.logistic_regression_elbo(*args, X, y, LAM)
                - exact.logistic_regression_elbo(*args_m, X, y, LAM)
            ).item() / (2 * h)
            assert grad[j].item() == pytest.approx(fd, rel=1e-6, abs=1e-6)


def test_logistic_log_loss_against_monte_carlo_and_the_plug_in():
    """The predictive log-loss by quadrature equals a 10⁵-sample average of sigmoid (within 4 s.e. per
    point), and with vanishing variance it is the plug-in log-loss of the mean."""
    X, y = _classification(n=40)
    mean, variance = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), torch.full((3,), 2.0).double()
    p = exact.logistic_regression_predictive(mean, variance, X)
    g = torch.Generator().manual_seed(2)
    (w,) = DiagonalGaussian([mean], [variance]).sample(100_000, generator=g)
    probs = torch.sigmoid(w @ X.T)  # [S, N]
    se = probs.std(0) / math.sqrt(probs.shape[0])
    assert bool(((p - probs.mean(0)).abs() < 4 * se + 1e-12).all())
    expected = -torch.where(y > 0, p, 1 - p).log().mean()
    assert exact.logistic_regression_log_loss(mean, variance, X, y).item() == pytest.approx(
        expected.item(), rel=1e-10
    )
    tiny = torch.full((3,), 1e-14).double()
    plug_in = torch.nn.functional.binary_cross_entropy_with_logits(X @ mean, y)
    assert exact.logistic_regression_log_loss(mean, tiny, X, y).item() == pytest.approx(
        plug_in.item(), rel=1e-6
    )


def test_logistic_label_encodings_agree_and_are_checked():
    X, y = _classification(n=50)
    a = exact.logistic_regression_mean_field(X, y, LAM)
    b = exact.logistic_regression_mean_field(X, 2 * y - 1, LAM)
    torch.testing.assert_close(a.mean[0], b.mean[0])
    torch.testing.assert_close(a.variance[0], b.variance[0])
    with pytest.raises(ValueError, match="labels"):
        exact.logistic_regression_mean_field(X, y + 0.5, LAM)
    with pytest.raises(ValueError, match="quad_points"):
        exact.logistic_regression_mean_field(X, y, LAM, quad_points=0)
    with pytest.raises(ValueError, match="prior_prec"):
        exact.logistic_regression_mean_field(X, y, 0.0)


def test_logistic_returns_x_dtype():
    X, y = _classification(n=50)
    q = exact.logistic_regression_mean_field(X.float(), y.float(), LAM)
    assert q.mean[0].dtype == torch.float32 and q.variance[0].dtype == torch.float32


def test_logistic_warns_when_stopped_early():
    X, y = _classification(n=50)
    with pytest.warns(RuntimeWarning, match="max_iter"):
        exact.logistic_regression_mean_field(X, y, LAM, max_iter=1)
