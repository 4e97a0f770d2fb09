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


LABEL_METRICS = {
    "accuracy": metrics.accuracy,
    "brier": metrics.brier,
    "reliability": metrics.reliability,
    "ece": metrics.ece,
    "categorical_nll": lambda probs, y: metrics.categorical_nll(probs.log().unsqueeze(0), y),
}


@pytest.mark.parametrize("name", LABEL_METRICS)
def test_metrics_refuse_labels_of_the_wrong_shape(name):
    """Labels [N, 1] used to broadcast against [N] predictions (accuracy 0.5 where it is 0.75): every
    metric that takes labels refuses them, and labels of another length or outside [0, C), by one check."""
    metric = LABEL_METRICS[name]
    probs = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.2, 0.8]], dtype=torch.float64)
    y = torch.tensor([0, 1, 1, 1])
    metric(probs, y)
    with pytest.raises(
        ValueError,
        match=r"labels must be shaped \[N\] \(class indices\); got \[4, 1\]: use "
        r"y\.squeeze\(-1\)",
    ):
        metric(probs, y[:, None])
    with pytest.raises(
        ValueError, match=r"labels must be shaped \[N\] \(class indices\) with N = 4 .*got \[3\]"
    ):
        metric(probs, y[:3])
    with pytest.raises(ValueError, match=r"labels must be class indices in \[0, 2\), got values in \[0, 2\]"):
        metric(probs, torch.tensor([0, 1, 2, 1]))


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


def test_reliability_bins_and_ece_by_hand_with_fifteen_bins():
    """Six predictions, 15 equal-width bins [b/15, (b+1)/15): by hand, confidences 0.97 and 0.99 fall in bin
    14, 0.55 and 0.58 in bin 8, 0.40 in bin 6 and 1.0 in bin 14 (the last bin is closed)."""
    probs = torch.tensor(
        [
            [0.97, 0.02, 0.01],  # conf .97, predicts 0, y = 0: right
            [0.01, 0.99, 0.00],  # conf .99, predicts 1, y = 2: wrong
            [0.55, 0.45, 0.00],  # conf .55, predicts 0, y = 0: right
            [0.20, 0.22, 0.58],  # conf .58, predicts 2, y = 1: wrong
            [0.40, 0.30, 0.30],  # conf .40, predicts 0, y = 0: right
            [0.00, 0.00, 1.00],  # conf 1.0, predicts 2, y = 2: right
        ],
        dtype=torch.float64,
    )
    y = torch.tensor([0, 2, 0, 1, 0, 2])
    rel = metrics.reliability(probs, y, 15)
    count = [0.0] * 15
    count[14], count[8], count[6] = 3, 2, 1
    assert rel["count"].tolist() == count
    assert rel["confidence"][14].item() == pytest.approx((0.97 + 0.99 + 1.0) / 3)
    assert rel["accuracy"][14].item() == pytest.approx(2 / 3)
    assert rel["confidence"][8].item() == pytest.approx((0.55 + 0.58) / 2)
    assert rel["accuracy"][8].item() == pytest.approx(1 / 2)
    assert rel["confidence"][6].item() == pytest.approx(0.40) and rel["accuracy"][6].item() == 1.0
    empty = [b for b in range(15) if b not in (6, 8, 14)]
    assert rel["confidence"][empty].abs().sum() == 0 and rel["accuracy"][empty].abs().sum() == 0
    # ECE = Σ_b (n_b/N)|acc_b − conf_b| = (3·|2/3 − 2.96/3| + 2·|0.5 − 0.565| + 1·|1 − 0.4|)/6
    by_hand = (3 * abs(2 / 3 - 2.96 / 3) + 2 * abs(0.5 - 0.565) + abs(1.0 - 0.4)) / 6
    assert metrics.ece(probs, y, 15) == pytest.approx(by_hand, rel=1e-12)
    # Brier by hand: Σ_c (p_c − 1[y=c])² per row, averaged
    rows = [
        0.03**2 + 0.02**2 + 0.01**2,
        0.01**2 + 0.99**2 + 1.0,
        0.45**2 + 0.45**2,
        0.2**2 + 0.78**2 + 0.58**2,
        0.6**2 + 0.3**2 + 0.3**2,
        0.0,
    ]
    assert metrics.brier(probs, y) == pytest.approx(sum(rows) / 6, rel=1e-12)


def test_predictive_entropy_by_hand():
    probs = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    expected = [0.0, math.log(2), math.log(3)]
    assert metrics.predictive_entropy(probs).tolist() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("ties", [False, True])
def test_auroc_matches_scikit_learn(ties):
    sklearn_metrics = pytest.importorskip("sklearn.metrics")  # the dev extra installs it
    gen = torch.Generator().manual_seed(3)
    for n_pos, n_neg in ((1, 1), (3, 7), (40, 25), (200, 300)):
        pos = torch.randn(n_pos, generator=gen, dtype=torch.float64) + 0.7
        neg = torch.randn(n_neg, generator=gen, dtype=torch.float64)
        scores = torch.cat([pos, neg])
        if ties:  # coarse scores: many ties, also across the classes
            scores = (scores * 2).round() / 2
        labels = torch.cat([torch.ones(n_pos), torch.zeros(n_neg)])
        perm = torch.randperm(n_pos + n_neg, generator=gen)
        scores, labels = scores[perm], labels[perm]
        ours = metrics.auroc(scores, labels)
        assert ours == pytest.approx(sklearn_metrics.roc_auc_score(labels.numpy(), scores.numpy()), abs=1e-12)
    # by hand: positives {3, 1}, negatives {2, 1}: pairs (3>2, 3>1, 1<2, 1=1) -> (1 + 1 + 0 + 0.5)/4
    assert metrics.auroc(torch.tensor([3.0, 1.0, 2.0, 1.0]), torch.tensor([1, 1, 0, 0])) == 0.625


def test_entropy_auroc_scores_out_of_distribution_points_by_their_entropy():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    gen = torch.Generator().manual_seed(4)
    p_in = torch.softmax(3 * torch.randn(30, 5, generator=gen, dtype=torch.float64), -1)  # confident
    p_out = torch.softmax(torch.randn(20, 5, generator=gen, dtype=torch.float64), -1)  # flatter
    scores = torch.cat([metrics.predictive_entropy(p_in), metrics.predictive_entropy(p_out)])
    labels = [0] * 30 + [1] * 20
    assert metrics.entropy_auroc(p_in, p_out) == pytest.approx(sklearn_metrics.roc_auc_score(labels, scores))


def test_auroc_rejects_bad_input():
    with pytest.raises(ValueError, match="both classes"):
        metrics.auroc(torch.tensor([0.1, 0.2]), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="0 or 1"):
        metrics.auroc(torch.tensor([0.1, 0.2]), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="finite"):
        metrics.auroc(torch.tensor([0.1, float("nan")]), torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="values"):
        metrics.auroc(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([1, 0]))
