"""Metrics against brute-force loops and hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from ngvi import metrics


def test_gaussian_log_likelihood_is_log_of_mixture_density():
    gen = torch.Generator().manual_seed(0)
    f = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    y = torch.randn(7, generator=gen, dtype=torch.float64)
    tau = 3.0
    brute = 0.0
    for n in range(7):
        dens = sum(
            math.sqrt(tau / (2 * math.pi)) * math.exp(-0.5 * tau * (y[n] - f[s, n]) ** 2) for s in range(5)
        )
        brute += math.log(dens / 5)
    assert metrics.gaussian_log_likelihood(f, y, tau) == pytest.approx(brute / 7, rel=1e-12)
    # with one sample it is the plain Gaussian log density, and it is stable far in the tails
    assert metrics.gaussian_log_likelihood(torch.zeros(1, 1), torch.tensor([100.0]), 1.0) == pytest.approx(
        -0.5 * math.log(2 * math.pi) - 5000.0
    )


def test_categorical_nll_is_log_of_mean_probability():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 6, 3, generator=gen, dtype=torch.float64)
    y = torch.tensor([0, 2, 1, 1, 0, 2])
    probs = torch.softmax(logits, -1).mean(0)
    brute = -sum(math.log(probs[n, y[n]]) for n in range(6)) / 6
    assert metrics.categorical_nll(logits, y) == pytest.approx(brute, rel=1e-12)
    torch.testing.assert_close(metrics.predictive_probs(logits), probs)
    big = torch.tensor([[[1000.0, -1000.0]]])  # no overflow
    assert metrics.categorical_nll(big, torch.tensor([0])) == pytest.approx(0.0, abs=1e-12)


def test_accuracy_brier_ece_by_hand():
    probs = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.2, 0.8]], dtype=torch.float64)
    y = torch.tensor([0, 1, 1, 1])
    assert metrics.accuracy(probs, y) == 0.75
    # Brier: Σ_c (p_c − onehot)², averaged: (0.02 + 0.72 + 0.18 + 0.08)/4
    assert metrics.brier(probs, y) == pytest.approx((0.02 + 0.72 + 0.18 + 0.08) / 4)
    # two bins [0, .5), [.5, 1]: every confidence (.9, .6, .7, .8) lands in bin 1 with accuracy 3/4
    assert metrics.ece(probs, y, n_bins=2) == pytest.approx(abs(0.75 - (0.9 + 0.6 + 0.7 + 0.8) / 4))
    rel = metrics.reliability(probs, y, n_bins=10)
    assert rel["count"].sum() == 4 and rel["count"][9] == 1 and rel["count"][6] == 1


def test_rmse_and_predictive_moments():
    assert metrics.rmse(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 0.0])) == pytest.approx(math.sqrt(5))
    f = torch.tensor([[1.0], [3.0]])
    mean, var = metrics.gaussian_predictive(f, noise_prec=4.0)
    assert float(mean) == 2.0 and float(var) == pytest.approx(1.0 + 0.25)


def test_shape_errors():
    with pytest.raises(ValueError, match=r"\[S, N"):
        metrics.gaussian_log_likelihood(torch.zeros(3), torch.zeros(3), 1.0)
    with pytest.raises(ValueError, match="points"):
        metrics.gaussian_log_likelihood(torch.zeros(2, 3), torch.zeros(4), 1.0)
    with pytest.raises(ValueError, match="noise_prec"):
        metrics.gaussian_log_likelihood(torch.zeros(2, 3), torch.zeros(3), 0.0)
