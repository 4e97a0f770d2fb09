r"""Predictive metrics for regression and classification.

Every function takes Monte-Carlo *samples* of the model output, shaped [S, N, ...] (S posterior samples),
and returns a Python float. The predictive log-likelihoods use the log-sum-exp form of the UCI literature
(Hernández-Lobato & Adams 2015; Gal & Ghahramani 2016):

.. math::
    \frac1N\sum_n \log \frac1S \sum_s p(y_n \mid f_s(x_n)).
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "accuracy",
    "auroc",
    "brier",
    "categorical_nll",
    "check_classification",
    "check_labels",
    "ece",
    "entropy_auroc",
    "gaussian_log_likelihood",
    "gaussian_predictive",
    "predictive_entropy",
    "predictive_probs",
    "reliability",
    "rmse",
]
from torch import Tensor


def _check_samples(samples: Tensor, y: Tensor, name: str = "samples") -> None:
    if samples.dim() < 2:
        raise ValueError(
            f"{name} must be shaped [S, N, ...] (S posterior samples), got {tuple(samples.shape)}"
        )
    if samples.shape[1] != y.shape[0]:
        raise ValueError(f"{name} cover {samples.shape[1]} points but y has {y.shape[0]}")


def check_labels(y: Tensor, n: int, num_classes: int) -> None:
    """Class labels: shaped [N], indices in [0, C). [N, 1] would broadcast against [N] predictions into a
    wrong value instead of failing, so every metric that takes labels asks this first.

    Args:
        y: the labels.
        n: N, the number of rows of predictions.
        num_classes: C.

    Raises:
        ValueError: ``y`` is not [N] (an [N, 1] gets the hint ``y.squeeze(-1)``), holds non-integers, or an
            index outside [0, C).
    """
    shape = list(y.shape)
    if y.dim() == 2 and y.shape[1] == 1 and y.shape[0] == n:
        raise ValueError(f"labels must be shaped [N] (class indices); got {shape}: use y.squeeze(-1)")
    if y.dim() != 1 or y.shape[0] != n:
        raise ValueError(
            f"labels must be shaped [N] (class indices) with N = {n} rows of predictions, got {shape}"
        )
    if y.is_floating_point() and not bool((y == y.round()).all()):
        raise ValueError("labels must be class indices (whole numbers)")
    low, high = (int(y.min()), int(y.max())) if n else (0, 0)
    if n and (low < 0 or high >= num_classes):
        raise ValueError(f"labels must be class indices in [0, {num_classes}), got values in [{low}, {high}]")


def check_classification(probs: Tensor, y: Tensor) -> None:
    """Predictive probabilities [N, C] and their labels [N] (ValueError naming what is off).

    Args:
        probs: class probabilities [N, C].
        y: class indices [N].

    Raises:
        ValueError: ``probs`` is not [N, C], or ``y`` fails :func:`check_labels`.
    """
    if probs.dim() != 2:
        raise ValueError(f"probs must be shaped [N, C], got {list(probs.shape)}")
    check_labels(y, probs.shape[0], probs.shape[1])


def rmse(pred: Tensor, y: Tensor) -> float:
    """Root-mean-squared error of a point prediction (e.g. the predictive mean) against y.

    Args:
        pred: the predictions, any shape with as many values as ``y``.
        y: the targets.

    Returns:
        The RMSE, a float (computed in float64).

    Raises:
        ValueError: ``pred`` and ``y`` hold different numbers of values.
    """
    pred, y = pred.reshape(-1).double(), y.reshape(-1).double()
    if pred.shape != y.shape:
        raise ValueError(f"pred has {pred.numel()} values but y has {y.numel()}")
    return float(((pred - y) ** 2).mean().sqrt())


def gaussian_log_likelihood(samples: Tensor, y: Tensor, noise_prec: float) -> float:
    r"""Mean test log-likelihood of y under the mixture (1/S) Σₛ N(fₛ(x), 1/τ), τ = ``noise_prec``.

    Args:
        samples: the outputs under S posterior draws, [S, N] or [S, N, D] (as :func:`ngvi.predict` gives).
        y: the targets, [N] or [N, D].
        noise_prec: τ > 0.

    Returns:
        The mean over points of the log of the mixture density (log-sum-exp form), a float.

    Raises:
        ValueError: shapes that do not match, or τ ≤ 0.
    """
    _check_samples(samples, y)
    if not noise_prec > 0:
        raise ValueError(f"noise_prec must be positive, got {noise_prec}")
    f = samples.reshape(samples.shape[0], y.shape[0], -1).double()
    y = y.reshape(1, y.shape[0], -1).double()
    log_lik = -0.5 * noise_prec * (y - f) ** 2 + 0.5 * math.log(noise_prec) - 0.5 * math.log(2 * math.pi)
    log_lik = log_lik.sum(-1)  # independent output dimensions
    return float((torch.logsumexp(log_lik, 0) - math.log(f.shape[0])).mean())


def gaussian_predictive(samples: Tensor, noise_prec: float) -> tuple[Tensor, Tensor]:
    """Mean and variance of the predictive mixture: E[f] and Var[f] + 1/τ.

    Args:
        samples: the outputs under S posterior draws, [S, ...].
        noise_prec: τ, the likelihood's noise precision.

    Returns:
        (mean, variance), each shaped like one sample.
    """
    return samples.mean(0), samples.var(0, unbiased=False) + 1.0 / noise_prec


def predictive_probs(logit_samples: Tensor) -> Tensor:
    """Class probabilities (1/S) Σₛ softmax(logitsₛ), shaped [N, C].

    Args:
        logit_samples: logits under S posterior draws, [S, N, C].

    Returns:
        The Bayesian model average of the class probabilities, [N, C].
    """
    if logit_samples.dim() != 3:
        raise ValueError(f"logit samples must be shaped [S, N, C], got {tuple(logit_samples.shape)}")
    return torch.softmax(logit_samples.double(), -1).mean(0)


def categorical_nll(logit_samples: Tensor, y: Tensor) -> float:
    r"""−(1/N) Σₙ log (1/S) Σₛ softmax(fₛ(xₙ))[yₙ], computed stably in log space.

    Args:
        logit_samples: logits under S posterior draws, [S, N, C].
        y: class indices [N].

    Returns:
        The mean negative log-likelihood of the model average, in nats.

    Raises:
        ValueError: the shapes do not match or ``y`` fails :func:`check_labels`.
    """
    if logit_samples.dim() != 3:
        raise ValueError(f"logit samples must be shaped [S, N, C], got {list(logit_samples.shape)}")
    check_labels(y, logit_samples.shape[1], logit_samples.shape[2])
    log_p = torch.log_softmax(logit_samples.double(), -1)  # [S, N, C]
    picked = log_p.gather(-1, y.long().view(1, -1, 1).expand(log_p.shape[0], -1, 1)).squeeze(-1)
    return float(-(torch.logsumexp(picked, 0) - math.log(log_p.shape[0])).mean())


def accuracy(probs: Tensor, y: Tensor) -> float:
    """The fraction of points whose most probable class (probs [N, C]) is the label.

    Args:
        probs: class probabilities [N, C].
        y: class indices [N].

    Returns:
        The accuracy in [0, 1].

    Raises:
        ValueError: as :func:`check_classification`.
    """
    check_classification(probs, y)
    return float((probs.argmax(-1) == y.long()).double().mean())


def brier(probs: Tensor, y: Tensor) -> float:
    """Mean over points of Σ_c (p_c − 1[y = c])².

    Args:
        probs: class probabilities [N, C].
        y: class indices [N].

    Returns:
        The Brier score in [0, 2].

    Raises:
        ValueError: as :func:`check_classification`.
    """
    check_classification(probs, y)
    onehot = torch.nn.functional.one_hot(y.long(), probs.shape[-1]).double()
    return float(((probs.double() - onehot) ** 2).sum(-1).mean())


def reliability(probs: Tensor, y: Tensor, n_bins: int = 15) -> dict[str, Tensor]:
    """Per-bin mean confidence, accuracy and count of the top-class confidence (Guo et al. 2017, §2).

    Bins are equal-width: bin b holds confidences in [b/B, (b+1)/B), and a confidence of exactly 1 goes to the
    last bin. Empty bins have count 0 (and confidence = accuracy = 0).

    Args:
        probs: class probabilities [N, C].
        y: class indices [N].
        n_bins: B.

    Returns:
        ``{"confidence", "accuracy", "count"}``, each a tensor [B].

    Raises:
        ValueError: as :func:`check_classification`.
    """
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    check_classification(probs, y)
    conf, pred = probs.double().max(-1)
    correct = (pred == y.long()).double()
    bins = torch.clamp((conf * n_bins).long(), max=n_bins - 1)
    count = torch.bincount(bins, minlength=n_bins).double()
    conf_sum = torch.bincount(bins, weights=conf, minlength=n_bins)
    acc_sum = torch.bincount(bins, weights=correct, minlength=n_bins)
    safe = count.clamp(min=1)
    return {"confidence": conf_sum / safe, "accuracy": acc_sum / safe, "count": count}


def ece(probs: Tensor, y: Tensor, n_bins: int = 15) -> float:
    """Expected calibration error (Guo et al. 2017): Σ_b (n_b/N)·|acc_b − conf_b|.

    Args:
        probs: class probabilities [N, C].
        y: class indices [N].
        n_bins: the number of equal-width confidence bins (:func:`reliability`).

    Returns:
        The ECE in [0, 1].

    Raises:
        ValueError: as :func:`check_classification`.
    """
    r = reliability(probs, y, n_bins)
    return float((r["count"] / r["count"].sum() * (r["accuracy"] - r["confidence"]).abs()).sum())


def predictive_entropy(probs: Tensor) -> Tensor:
    r"""H[p] = −Σ_c p_c log p_c per point (nats; 0·log 0 = 0): the score of out-of-distribution detection.

    Args:
        probs: class probabilities [..., C].

    Returns:
        The entropy of each row, [...].
    """
    p = probs.double()
    return -(p * torch.where(p > 0, p.log(), 0.0)).sum(-1)


def auroc(scores: Tensor, labels: Tensor) -> float:
    r"""Area under the ROC curve of ``scores`` for the binary ``labels`` (1 = positive).

    The Mann-Whitney form: the probability that a random positive scores higher than a random negative, ties
    counting one half,

    .. math::
        \mathrm{AUROC} = \frac{\sum_{i\,\in\,\mathrm{pos}} r_i - n_+(n_+ + 1)/2}{n_+\, n_-},

    with r the ranks of all scores (tied scores get their average rank). It equals the trapezoidal area
    under the ROC curve."""
    scores, labels = scores.reshape(-1).double(), labels.reshape(-1)
    if scores.shape != labels.shape:
        raise ValueError(f"scores have {scores.numel()} values but labels have {labels.numel()}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("scores must be finite")
    positive = labels.bool()
    if not bool(((labels == 0) | (labels == 1)).all()):
        raise ValueError("labels must be 0 or 1")
    n_pos = int(positive.sum())
    n_neg = positive.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"AUROC needs both classes, got {n_pos} positive and {n_neg} negative labels")
    _, inverse, counts = torch.unique(scores, sorted=True, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    average_rank = ends - (counts.double() - 1.0) / 2.0  # ranks 1..n; ties share their mean rank
    rank_sum = average_rank[inverse][positive].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def entropy_auroc(probs_in: Tensor, probs_out: Tensor) -> float:
    """AUROC of out-of-distribution detection by predictive entropy: in-distribution points (``probs_in``,
    [N, C]) are the negatives, out-of-distribution ones (``probs_out``) the positives."""
    h_in, h_out = predictive_entropy(probs_in), predictive_entropy(probs_out)
    labels = torch.cat([torch.zeros(h_in.numel()), torch.ones(h_out.numel())])
    return auroc(torch.cat([h_in, h_out]), labels)
