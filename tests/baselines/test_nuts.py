"""The NUTS reference (pyro-ppl's sampler) against the analytic posterior of Bayesian linear regression.

Tolerance: a Monte Carlo estimate of E[g(θ)] from correlated draws has standard error sd(g)/√ESS(g). We
estimate ESS(g) with pyro's own estimator (``pyro.ops.stats.effective_sample_size``, over both chains) for
each g we check: θᵢ for the mean, and (θᵢ − μᵢ)(θⱼ − μⱼ) for the covariance (centred on the exact mean, so
its expectation is Σᵢⱼ exactly; the ESS of a second moment is usually far below that of the mean under NUTS,
so each entry gets its own). Every entry must lie within 4 standard errors: for 3 means and 6 covariance
entries that fails by chance with probability below 10⁻³ (normal tails), and the run is seeded.
"""

from __future__ import annotations

import sys

import pytest
import torch

from ngvi.baselines import exact
from ngvi.baselines.nuts import (
    PYRO_MISSING,
    NUTSPosterior,
    effective_sample_size,
    nuts_posterior,
    split_r_hat,
)

pyro_stats = pytest.importorskip("pyro.ops.stats")

Z = 4.0


def _linear_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    n, d = 40, 3
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    X[:, 2] = 0.8 * X[:, 1] + 0.6 * X[:, 2]  # correlated inputs: a posterior with off-diagonal covariance
    w = torch.tensor([1.0, -0.5, 0.3], dtype=torch.float64)
    return X, X @ w + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)


@pytest.fixture(scope="module")
def linear_problem():
    X, y = _linear_data()
    d = X.shape[1]
    noise_prec, prior_prec = 4.0, 2.0
    model = torch.nn.Linear(d, 1, bias=False).double()
    post = nuts_posterior(
        model, X, y, prior_prec=prior_prec, noise_prec=noise_prec, num_samples=500, warmup=250, chains=2
    )
    mean, cov = exact.linear_regression_posterior(X, y, noise_prec, prior_prec)
    return post, mean, cov


def _mc_error(series: torch.Tensor) -> torch.Tensor:
    """Standard error of the mean of ``series`` [chains, samples, ...] from its sd and pyro's ESS."""
    ess = pyro_stats.effective_sample_size(series, chain_dim=0, sample_dim=1)
    return series.reshape(-1, *series.shape[2:]).std(0) / ess.sqrt()


def test_nuts_matches_the_exact_linear_regression_posterior(linear_problem):
    post, mean, cov = linear_problem
    draws = post.draws  # [2, 500, 3]
    assert draws.shape == (2, 500, 3)
    # chains mixed: R-hat near 1, no divergent transitions, plenty of effective draws
    assert float(post.r_hat.max()) < 1.02 and sum(post.divergences) == 0
    assert float(post.ess.min()) > 300
    mean_err = _mc_error(draws)
    assert ((post.mean - mean).abs() <= Z * mean_err).all(), (post.mean - mean) / mean_err
    centred = draws - mean
    products = centred.unsqueeze(-1) * centred.unsqueeze(-2)  # [2, 500, 3, 3]
    cov_hat = products.reshape(-1, 3, 3).mean(0)
    cov_err = _mc_error(products)
    assert ((cov_hat - cov).abs() <= Z * cov_err).all(), (cov_hat - cov) / cov_err
    # the check has teeth: the mean-field covariance (exact diagonal precision) is far outside it
    mean_field = torch.diag(1.0 / torch.diagonal(torch.linalg.inv(cov)))
    assert ((mean_field - cov).abs() > Z * cov_err).any()


def test_a_dense_mass_matrix_samples_the_same_posterior(linear_problem):
    """full_mass=True adapts a D × D mass matrix (for correlated posteriors): same posterior, within the
    same Monte Carlo bands, and the run records the setting."""
    _, mean, cov = linear_problem
    X, y = _linear_data()
    model = torch.nn.Linear(3, 1, bias=False).double()
    post = nuts_posterior(
        model, X, y, prior_prec=2.0, noise_prec=4.0, num_samples=300, warmup=200, chains=2, full_mass=True
    )
    assert post.summary()["full_mass"] is True and float(post.r_hat.max()) < 1.05
    assert ((post.mean - mean).abs() <= Z * _mc_error(post.draws)).all()
    centred = post.draws - mean
    products = centred.unsqueeze(-1) * centred.unsqueeze(-2)
    assert ((products.reshape(-1, 3, 3).mean(0) - cov).abs() <= Z * _mc_error(products)).all()


def test_predictions_and_their_diagnostics(linear_problem):
    post = linear_problem[0]
    x = torch.eye(3, dtype=torch.float64)  # f(e_i) = w_i: the predictions are the weights themselves
    out = post.predict(x)
    assert out.shape == (1000, 3, 1)
    torch.testing.assert_close(out[..., 0], post.flat)
    stats = post.output_diagnostics(x, thin=2)
    assert stats["r_hat"].shape == (3, 1) and float(stats["r_hat"].max()) < 1.02
    summary = post.summary()
    assert summary["chains"] == 2 and len(summary["seconds"]) == 2 and summary["max_r_hat"] < 1.02


def test_bad_arguments_are_named():
    model = torch.nn.Linear(2, 1)
    x, y = torch.randn(5, 2), torch.randn(5)
    with pytest.raises(ValueError, match="exactly one of noise_prec"):
        nuts_posterior(model, x, y, prior_prec=1.0)
    with pytest.raises(ValueError, match="chains must be a positive integer"):
        nuts_posterior(model, x, y, prior_prec=1.0, noise_prec=1.0, chains=0)
    with pytest.raises(ValueError, match="prior_prec"):
        nuts_posterior(model, x, y, prior_prec=-1.0, noise_prec=1.0)
    with pytest.raises(ValueError, match="finite"):
        nuts_posterior(model, x, y * float("nan"), prior_prec=1.0, noise_prec=1.0)


def test_without_pyro_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyro", None)  # import pyro now raises ModuleNotFoundError
    with pytest.raises(ModuleNotFoundError, match=r"pip install \"ngvi\[experiments\]\"") as err:
        nuts_posterior(
            torch.nn.Linear(2, 1), torch.randn(4, 2), torch.randn(4), prior_prec=1.0, noise_prec=1.0
        )
    assert str(err.value) == PYRO_MISSING and "\n" not in PYRO_MISSING


# -- split R-hat -------------------------------------------------------------------------------------
def test_split_r_hat_by_hand_and_against_pyro():
    # chains [0, 1, 2, 3] and [1, 2, 1, 2]: halves of variance ½ each (W = ½), half means ½, 2½, 1½, 1½
    # (variance ⅔), so R̂ = √((½·½ + ⅔) / ½) = √(11/6)
    hand = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 2.0, 1.0, 2.0]], dtype=torch.float64)
    assert float(split_r_hat(hand)) == pytest.approx((11 / 6) ** 0.5, rel=1e-12)
    gen = torch.Generator().manual_seed(0)
    iid = torch.randn(4, 1000, 3, generator=gen, dtype=torch.float64)
    shifted = iid + torch.tensor([0.0, 0.0, 0.0, 3.0], dtype=torch.float64)[:, None, None]  # one chain apart
    drifting = (
        iid + torch.linspace(0, 3, 1000, dtype=torch.float64)[None, :, None]
    )  # every chain drifts alike
    for draws in (iid, shifted, drifting, iid[:, :7]):  # an odd length drops the middle draw, as pyro does
        expected = pyro_stats.split_gelman_rubin(draws, chain_dim=0, sample_dim=1)
        torch.testing.assert_close(split_r_hat(draws), expected)
    assert (split_r_hat(iid) < 1.01).all() and (split_r_hat(shifted) > 1.3).all()
    assert (split_r_hat(drifting) > 1.1).all()  # the split sees a trend that whole chains share
    assert float(split_r_hat(torch.full((2, 6), 3.0))) == 1.0  # constant: the chains agree
    assert float(split_r_hat(torch.tensor([[1.0] * 4, [2.0] * 4]))) == float("inf")
    with pytest.raises(ValueError, match="samples ≥ 4"):
        split_r_hat(torch.randn(4, 3))


# -- the effective sample size ----------------------------------------------------------------------
def test_ess_of_known_chains():
    gen = torch.Generator().manual_seed(0)
    iid = torch.randn(4, 1000, 3, generator=gen, dtype=torch.float64)
    ess = effective_sample_size(iid)
    assert ess.shape == (3,) and ((ess > 0.85 * 4000) & (ess <= 4000)).all(), ess  # ≈ n for iid draws
    phi, n = 0.9, 20000  # AR(1): ESS = N (1 − φ) / (1 + φ)
    noise = torch.randn(2, n, generator=gen, dtype=torch.float64)
    ar = torch.zeros(2, n, dtype=torch.float64)
    for t in range(1, n):
        ar[:, t] = phi * ar[:, t - 1] + noise[:, t]
    assert float(effective_sample_size(ar)) == pytest.approx(2 * n * (1 - phi) / (1 + phi), rel=0.15)
    assert float(effective_sample_size(torch.full((2, 10), 3.0))) == 20.0  # constant: the mean is exact
    antithetic = torch.tensor([[1.0, -1.0] * 5] * 2)
    assert float(effective_sample_size(antithetic)) == 20.0  # at most the number of draws
    with pytest.raises(ValueError, match="at least 2 draws per chain, got 1"):
        effective_sample_size(torch.randn(4, 1))


def test_ess_of_short_chains_is_never_negative():
    """pyro's estimate goes negative on about one in ten such 2 × 10 chains."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        ess = effective_sample_size(torch.randn(2, 10, 2, generator=gen))
        assert ((ess > 0) & (ess <= 20)).all(), ess


def test_output_diagnostics_of_short_chains_are_in_range():
    """`ngvi hmc --quick` printed "lowest ESS −51511": 2 chains of 10 draws, pyro's ESS of f(x*)."""
    gen = torch.Generator().manual_seed(21)
    draws = torch.randn(2, 10, 3, generator=gen, dtype=torch.float64)
    assert (pyro_stats.effective_sample_size(draws, chain_dim=0, sample_dim=1) < 0).any()  # pyro's, negative
    model = torch.nn.Linear(3, 1, bias=False).double()
    post = NUTSPosterior(
        model, draws, torch.ones(3), effective_sample_size(draws), [0, 0], [0.1] * 2, [0.0] * 2
    )
    ess = post.output_diagnostics(torch.eye(3, dtype=torch.float64))["ess"]  # f(e_i) = w_i
    assert ess.shape == (3, 1) and ((ess > 0) & (ess <= 20)).all(), ess
    torch.testing.assert_close(ess[:, 0], effective_sample_size(draws))
    with pytest.raises(ValueError, match="num_samples must be at least 2"):
        nuts_posterior(
            model, torch.randn(4, 3), torch.randn(4), prior_prec=1.0, noise_prec=1.0, num_samples=1
        )
