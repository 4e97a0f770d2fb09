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
from ngvi.experiments.data import UCISplit

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


def _evaluate(
    model, trainer, method: UCIMethod, x, y, y_mean, y_std, noise_prec, samples
) -> dict[str, float]:
    out = ngvi.predict(model, trainer, x, samples=samples, linearized=method.linearized)[..., 0]
    out = out * y_std + y_mean
    return {
        "rmse": metrics.rmse(out.mean(0), y),
        "loglik": metrics.gaussian_log_likelihood(out, y, noise_prec / y_std**2),
    }


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
    std, scaler = split.standardized()
    x_train = torch.as_tensor(std.x_train, dtype=torch.float32)
    y_train = torch.as_tensor(std.y_train, dtype=torch.float32).unsqueeze(1)
    x_test = torch.as_tensor(std.x_test, dtype=torch.float32)
    y_test = torch.as_tensor(split.y_test, dtype=torch.float64)
    y_mean, y_std = scaler.y_mean, scaler.y_std
    n = x_train.shape[0]
    setting = Setting(
        in_features=x_train.shape[1],
        hidden=protocol.hidden(dataset),
        data_size=n,
        prior_prec=prior_prec,
        noise_prec=noise_prec,
        mc_samples=1 if method.samples_in_batch else method.train_samples(dataset),
        dropout=dropout,
    )
    model, trainer = method.build(setting)
    batch = protocol.batch_size(dataset)
    copies = method.train_samples(dataset) if method.samples_in_batch else 1
    order = torch.Generator().manual_seed(seed)
    curve = []
    for _ in range(protocol.epochs):
        model.train()
        for idx in torch.randperm(n, generator=order).split(batch):
            xb, yb = x_train[idx], y_train[idx]
            if copies > 1:
                xb, yb = xb.repeat(copies, 1), yb.repeat(copies, 1)

            def closure(xb=xb, yb=yb):
                trainer.zero_grad()
                output = model(xb)
                loss = 0.5 * noise_prec * ((output - yb) ** 2).mean()
                if method.true_fisher:
                    return loss, output  # the optimizer backpropagates (see ngvi.curvature.optimizer)
                loss.backward()
                return loss

            trainer.step(closure)
        if protocol.curve:
            curve.append(
                _evaluate(model, trainer, method, x_test, y_test, y_mean, y_std, noise_prec, CURVE_SAMPLES)[
                    "rmse"
                ]
            )
    train_seconds = time.perf_counter() - start
    result = _evaluate(
        model, trainer, method, x_test, y_test, y_mean, y_std, noise_prec, protocol.eval_samples
    )
    result.update(curve=curve, train_seconds=train_seconds, seconds=time.perf_counter() - start)
    return result
