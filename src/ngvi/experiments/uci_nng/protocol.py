"""One fit under NNG's regression protocol (Zhang et al. 2018, §5.1, Table 1).

Following Hernández-Lobato & Adams (2015) and Louizos & Welling (2016), as NNG does: one hidden layer of 50
ReLU units (100 for protein), inputs and targets standardised with training statistics, the observation
noise learned with the weights (:mod:`.noise`), and the training length of NNG's released regression code:
1000 epochs in minibatches of 10 (the five small sets) or 100 (kin8nm, naval, power, protein), 10 training
particles, 100 test particles. RMSE and the test log-likelihood are in the targets' original units; the
log-likelihood is log (1/S) Σₛ N(y | fₛ(x), 1/τₛ) with a weight draw and a τₛ ~ q(τ) per sample.

``epochs_large`` shortens the four large sets (a compute budget; the default is NNG's 1000).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

import ngvi

from ..core import models, training
from ..data import UCISplit
from ..uci.protocol import Protocol as UCIProtocol
from ..uci.protocol import tensors
from .methods import PRIOR_PREC, TRAIN_SAMPLES, NNGMethod
from .noise import GammaNoise

SMALL_SETS = ("bostonHousing", "concrete", "energy", "wine-quality-red", "yacht")
EVAL_SAMPLES = 100


@dataclass(frozen=True)
class Protocol:
    epochs: int = 1000
    epochs_large: int = 1000
    train_samples: int = TRAIN_SAMPLES
    eval_samples: int = EVAL_SAMPLES
    #: extrinsic damping γ_ex of the K-FAC-style methods (NNG §3.2: "for purposes of stability"); NNG's
    #: regression config has none. Protein needs it: see docs/results/uci-nng/README.md
    damping: float = 0.0

    def asdict(self) -> dict[str, Any]:
        """The fields, without ``damping`` at its default (the records of runs made before it existed)."""
        out = asdict(self)
        if not out["damping"]:
            del out["damping"]
        return out

    @staticmethod
    def batch_size(dataset: str) -> int:
        return 10 if dataset in SMALL_SETS else 100

    hidden = staticmethod(UCIProtocol.hidden)  # the same network as the Vadam protocol's

    def epochs_for(self, dataset: str) -> int:
        return self.epochs if dataset in SMALL_SETS else self.epochs_large


def _set_fisher_precision(trainer: Any, precision: float) -> None:
    """The true-Fisher targets of the next step are drawn with noise precision ``precision``."""
    trainer.curvature_estimator.likelihood.precision = precision


def fit(method: NNGMethod, dataset: str, split: UCISplit, protocol: Protocol, seed: int) -> dict[str, Any]:
    """Train on ``split``'s training part and evaluate on its test part; returns metrics and timings."""
    start = time.perf_counter()
    torch.manual_seed(seed)
    x_train, y_train, x_test, y_test, scaler = tensors(split)
    n = x_train.shape[0]
    copies = protocol.train_samples if method.copies else 1
    model = models.mlp(x_train.shape[1], protocol.hidden(dataset), 1)
    options = {"prior_prec": PRIOR_PREC, "mc_samples": protocol.train_samples // copies, "seed": seed}
    if method.extrinsic_damping:
        options["damping"] = protocol.damping
    trainer = method.method.build(model, n, **{**method.options(n), **options})
    if method.local:
        ngvi.optim.sample_preactivations(trainer, model)
    noise = GammaNoise(n)
    if method.true_fisher:
        _set_fisher_precision(trainer, noise.mean())

    def loss_fn(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 0.5 * noise.mean() * ((output - y) ** 2).mean()  # E_q[τ]: the loss is linear in τ

    def after_step(loss: float) -> None:
        tau = noise.mean()
        noise.update(2.0 * loss / tau)  # the step's mean squared residual
        if method.true_fisher:
            _set_fisher_precision(trainer, noise.mean())

    losses = training.train(
        model,
        trainer,
        x_train,
        y_train,
        loss_fn,
        epochs=protocol.epochs_for(dataset),
        batch_size=protocol.batch_size(dataset),
        generator=torch.Generator().manual_seed(seed),
        copies=copies,
        after_step=after_step,
    )
    train_seconds = time.perf_counter() - start
    out = ngvi.predict(model, trainer, x_test, samples=protocol.eval_samples)[..., 0].double()
    out = out * scaler.y_std + scaler.y_mean
    tau = noise.sample(protocol.eval_samples, np.random.default_rng(seed)) / scaler.y_std**2  # original units
    resid = (y_test[None] - out).square()
    log_lik = -0.5 * tau[:, None] * resid + 0.5 * tau.log()[:, None] - 0.5 * math.log(2 * math.pi)
    loglik = float((torch.logsumexp(log_lik, 0) - math.log(out.shape[0])).mean())
    return {
        "rmse": float((out.mean(0) - y_test).square().mean().sqrt()),
        "loglik": loglik,
        "noise_shape": noise.shape,
        "noise_rate": noise.rate,
        "noise_std": float(scaler.y_std / math.sqrt(noise.mean())),  # E_q[τ]^-1/2, original units
        "final_loss": float(np.mean(losses[-100:])) if losses else float("nan"),
        "steps": len(losses),
        "train_seconds": train_seconds,
        "seconds": time.perf_counter() - start,
    }
