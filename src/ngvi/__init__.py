"""ngvi: natural-gradient variational inference for PyTorch.

Bayesian deep learning as easy as training with Adam::

    opt = ngvi.Vadam(model.parameters(), data_size=len(train_set), prior_prec=1.0)
    for x, y in loader:
        def closure():
            opt.zero_grad()
            loss = loss_fn(model(x), y)      # mean negative log-likelihood
            loss.backward()
            return loss
        opt.step(closure)
    outputs = ngvi.predict(model, opt, x_test, samples=32)    # [32, ...]
    posterior = opt.posterior()                               # DiagonalGaussian
    cal = ngvi.calibrate(model, opt, (x_val, y_val), "classification")   # λ fitted on held-out NLL
"""

from . import baselines, curvature, metrics, pruning
from ._version import __version__ as __version__
from .artefacts import PosteriorSampler, load_posterior, posterior_of, save_posterior
from .calibrate import Calibration, calibrate
from .evaluation import evaluate_classifier
from .merge import merge
from .optim import (
    IVON,
    VOGN,
    VON,
    BAdam,
    Diagnostics,
    EmpiricalBayes,
    EngineOptions,
    NNGBlkTri,
    NNGFull,
    NoisyAdam,
    NoisyKFAC,
    NonFiniteGradientError,
    PosteriorWarning,
    VadaGrad,
    Vadam,
    VariationalOptimizer,
    Vprop,
)
from .posterior import (
    BlockTridiagonalGaussian,
    DiagonalGaussian,
    FullGaussian,
    GaussianPosterior,
    KroneckerGaussian,
    symmetric_kl,
)
from .predict import predict
from .protocol import PosteriorOptimizer, unwrap
from .pruning import apply_masks, prune_masks, pruned
from .report import UncertaintyReport, uncertainty_report

__all__ = [
    "IVON",
    "VOGN",
    "VON",
    "BAdam",
    "BlockTridiagonalGaussian",
    "Calibration",
    "Diagnostics",
    "DiagonalGaussian",
    "EmpiricalBayes",
    "EngineOptions",
    "FullGaussian",
    "GaussianPosterior",
    "KroneckerGaussian",
    "NNGBlkTri",
    "NNGFull",
    "NoisyAdam",
    "NoisyKFAC",
    "NonFiniteGradientError",
    "PosteriorOptimizer",
    "PosteriorSampler",
    "PosteriorWarning",
    "UncertaintyReport",
    "VadaGrad",
    "Vadam",
    "VariationalOptimizer",
    "Vprop",
    "apply_masks",
    "baselines",
    "calibrate",
    "curvature",
    "evaluate_classifier",
    "load_posterior",
    "merge",
    "metrics",
    "posterior_of",
    "predict",
    "prune_masks",
    "pruned",
    "pruning",
    "save_posterior",
    "symmetric_kl",
    "uncertainty_report",
    "unwrap",
]
