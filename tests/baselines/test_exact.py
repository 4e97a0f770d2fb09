"""The exact references against brute force: numpy.linalg, the evidence, quadrature and the ELBO gradient."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate
from scipy.special import log_expit
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
def test_gauss_hermite_expectation_matches_scipy_quad():
    """One data point: the quadrature term equals ∫ log sigmoid(a) N(a | m, v) da by adaptive quadrature."""
    for m, v in [(0.3, 0.5), (-2.0, 4.0), (1.0, 0.01)]:
        X = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
        mean = torch.tensor([m, 0.0], dtype=torch.float64)
        var = torch.tensor([v / 2, v / 2], dtype=torch.float64)
        kl = DiagonalGaussian([mean], [var]).kl(DiagonalGaussian.isotropic([mean], 1.0))
        term = exact.logistic_regression_elbo(mean, var, X, torch.ones(1, dtype=torch.float64), 1.0) + kl
        density = norm(loc=m, scale=math.sqrt(v)).pdf
        ref, _ = integrate.quad(lambda a, p=density: log_expit(a) * p(a), -np.inf, np.inf, epsabs=1e-13)
        assert term.item() == pytest.approx(ref, abs=1e-10)


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


def test_logistic_elbo_against_monte_carlo():
    X, y = _classification(n=40)
    q = exact.logistic_regression_mean_field(X, y, LAM)
    g = torch.Generator().manual_seed(1)
    (w,) = q.sample(200_000, generator=g)  # [S, D]
    s = torch.where(y > 0, 1.0, -1.0).double()
    loglik = torch.nn.functional.logsigmoid(s * (w @ X.T)).sum(1)  # [S]
    kl = q.kl(DiagonalGaussian.isotropic(q.mean, LAM))
    mc = loglik.mean() - kl
    se = loglik.std() / math.sqrt(loglik.numel())
    elbo = exact.logistic_regression_elbo(q.mean[0], q.variance[0], X, y, LAM)
    assert abs(elbo - mc) < 4 * se


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
