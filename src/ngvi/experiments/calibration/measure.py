r"""The calibration metrics of a predictive, from its samples, by :mod:`ngvi.metrics` and :mod:`ngvi.report`'s
functions (nothing is recomputed here), and the issue's criteria.

* **regression** (Gaussian likelihood, noise s.d. σ known): the NLL of the mixture (1/S) Σₛ N(fₛ(x), σ²)
  (:func:`ngvi.metrics.gaussian_log_likelihood`), the RMSE of its mean, the coverage of its central 95%
  interval from the PIT u = (1/S) Σₛ Φ((y − fₛ)/σ) (:func:`ngvi.report.pit`: y is inside exactly when
  |u − ½| ≤ 0.475) and the calibration error of the central intervals at 5%, …, 95%.
* **classification**: accuracy, NLL, ECE (15 equal-width bins) and Brier of the averaged probabilities
  (:func:`ngvi.evaluation.classification_metrics`).
* **spread away from the data**: on each probe, the mean over points of the s.d. across samples of the
  network's output: of f(x) for regression (the weights' part; the noise σ is the same everywhere), of the
  class probabilities softmax(f(x)) for classification (mean over classes). ``far/near`` is its ratio
  between the probe at c = :data:`.problems.FAR` and the test set.

The criteria (issue 32, item 2), applied to the means over seeds: the NLL at most
:data:`NLL_MARGIN` nats above the ensemble's, the 95% coverage in :data:`COVERAGE_BAND`, the ECE at most the
ensemble's + :data:`ECE_MARGIN`, and far/near > 1.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ngvi import metrics
from ngvi.evaluation import classification_metrics
from ngvi.report import LEVELS, coverage_curve, pit

NLL_MARGIN = 0.15
COVERAGE_BAND = (0.90, 0.99)
ECE_MARGIN = 0.02
ECE_BINS = 15
#: the bounds are inclusive: a difference that rounding puts 1e-16 beyond one still meets it
_ROUNDING = 1e-12


def regression_metrics(samples: Tensor, y: Tensor, noise_std: float) -> dict[str, float]:
    """NLL, RMSE, 95% coverage and calibration error of the predictive of samples [S, N, 1]."""
    u = pit(samples, y, noise_std)
    levels = torch.tensor(LEVELS, dtype=torch.float64)
    return {
        "nll": -metrics.gaussian_log_likelihood(samples, y, noise_std**-2),
        "rmse": metrics.rmse(samples.double().mean(0), y),
        "coverage95": float(((u - 0.5).abs() <= 0.475).double().mean()),
        "calibration_error": float((coverage_curve(u) - levels).abs().mean()),
    }


def classifier_metrics(logit_samples: Tensor, y: Tensor) -> dict[str, float]:
    """Accuracy, NLL, ECE and Brier of the averaged probabilities of logit samples [S, N, C]."""
    return classification_metrics(metrics.predictive_probs(logit_samples), y, ECE_BINS)


def spread(samples: Tensor, task: str) -> float:
    """The mean over points of the s.d. across samples of f(x) (regression) or of softmax(f(x))
    (classification, averaged over classes); 0 for a single sample."""
    if samples.shape[0] < 2:
        return 0.0
    values = torch.softmax(samples.double(), -1) if task == "classification" else samples.double()
    return float(values.std(0).mean())


def far_near(sd: dict[str, float], far: str) -> float | None:
    """The far probe's spread over the test set's (``x1``); None where the test set's is 0 (a point
    estimate: no ratio)."""
    return sd[far] / sd["x1"] if sd["x1"] > 0 else None


def criteria(task: str, cell: dict[str, Any], ensemble: dict[str, Any]) -> dict[str, bool | None]:
    """met (True) / missed (False) / not applicable (None) of each criterion, from the means over seeds of
    a method (``cell``) and of the ensemble: ``nll``, ``coverage95`` or ``ece``, and ``far_near``."""
    out: dict[str, bool | None] = {"nll": cell["nll"] - ensemble["nll"] <= NLL_MARGIN + _ROUNDING}
    if task == "regression":
        low, high = COVERAGE_BAND
        out["calibration"] = low <= cell["coverage95"] <= high
    else:
        out["calibration"] = cell["ece"] <= ensemble["ece"] + ECE_MARGIN + _ROUNDING
    ratio = cell.get("far_near")
    out["growing"] = None if ratio is None else ratio > 1.0
    return out
