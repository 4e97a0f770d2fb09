"""One fit of the UCI protocol: standardise with training statistics, train for the protocol's epochs in
minibatches, evaluate RMSE and the predictive log-likelihood in the targets' original units.

The loss is the mean Gaussian NLL in standardised units, (τ/2)·mean((y − f(x))²) (constant dropped). With
targets scaled by s_y, predictions map back as f·s_y + m_y and the noise precision as τ/s_y²; the test
log-likelihood uses 100 posterior samples in log-sum-exp form (``ngvi.metrics``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

import ngvi
from ngvi import metrics

from ..core import models, training
from ..data import UCISplit
from .methods import SMALL_SETS, Setting, UCIMethod

EVAL_SAMPLES = 100
CURVE_SAMPLES = 20


@dataclass(frozen=True)
class Protocol:
    epochs: int = 40
    eval_samples: int = EVAL_SAMPLES
    curve: bool = True  # test RMSE after every epoch (Vadam Fig. 4), with CURVE_SAMPLES samples

    @staticmethod
    def batch_size(dataset: str) -> int:
        return 32 if dataset in SMALL_SETS else 128

    @staticmethod
    def hidden(dataset: str) -> int:
        return 100 if dataset == "protein-tertiary-structure" else 50


def tensors(split: UCISplit) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Any]:
    """``split`` as the fits take it: standardised float32 inputs and train targets ([N, 1]), the test
    targets in original units and float64, and the scaler that maps predictions back."""
    std, scaler = split.standardized()
    x_train = torch.as_tensor(std.x_train, dtype=torch.float32)
    y_train = torch.as_tensor(std.y_train, dtype=torch.float32).unsqueeze(1)
    x_test = torch.as_tensor(std.x_test, dtype=torch.float32)
    y_test = torch.as_tensor(split.y_test, dtype=torch.float64)
    return x_train, y_train, x_test, y_test, scaler


def fit(
    method: UCIMethod,
    dataset: str,
    split: UCISplit,
    prior_prec: float,
    noise_prec: float,
    protocol: Protocol,
    seed: int,
    dropout: float = 0.05,
) -> dict[str, Any]:
    """Train on ``split``'s training part and evaluate on its test part; returns metrics and timings."""
    start = time.perf_counter()
    torch.manual_seed(seed)
    x_train, y_train, x_test, y_test, scaler = tensors(split)
    n = x_train.shape[0]
    copies = method.train_samples(dataset) if method.samples_in_batch else 1
    setting = Setting(n, prior_prec, noise_prec, mc_samples=method.train_samples(dataset) // copies)
    registered = method.method
    model = models.mlp(
        x_train.shape[1], protocol.hidden(dataset), 1, dropout=dropout if registered.dropout else None
    )
    trainer = registered.build(model, n, **method.trainer_options(setting))

    def evaluate(samples: int) -> dict[str, float]:
        out = ngvi.predict(model, trainer, x_test, samples=samples, linearized=registered.linearized)[..., 0]
        out = out * scaler.y_std + scaler.y_mean
        return {
            "rmse": metrics.rmse(out.mean(0), y_test),
            "loglik": metrics.gaussian_log_likelihood(out, y_test, noise_prec / scaler.y_std**2),
        }

    curve: list[float] = []
    training.train(
        model,
        trainer,
        x_train,
        y_train,
        lambda output, y: 0.5 * noise_prec * ((output - y) ** 2).mean(),
        epochs=protocol.epochs,
        batch_size=protocol.batch_size(dataset),
        generator=torch.Generator().manual_seed(seed),
        copies=copies,
        after_epoch=(lambda _: curve.append(evaluate(CURVE_SAMPLES)["rmse"])) if protocol.curve else None,
    )
    train_seconds = time.perf_counter() - start
    result = evaluate(protocol.eval_samples)
    result.update(curve=curve, train_seconds=train_seconds, seconds=time.perf_counter() - start)
    return result
