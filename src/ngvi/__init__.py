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
"""

from . import baselines, curvature, metrics, pruning
from .evaluation import evaluate_classifier
from .optim import (
    IVON,
    VOGN,
    VON,
    BAdam,
    Diagnostics,
    NNGBlkTri,
    NNGFull,
    NoisyAdam,
    NoisyKFAC,
    NonFiniteGradientError,
    PosteriorOptimizer,
    PosteriorWarning,
    VadaGrad,
    Vadam,
    VariationalOptimizer,
    Vprop,
    unwrap,
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
from .pruning import apply_masks, prune_masks, pruned

__version__ = "0.1.0"

__all__ = [
    "IVON",
    "VOGN",
    "VON",
    "BAdam",
    "BlockTridiagonalGaussian",
    "Diagnostics",
    "DiagonalGaussian",
    "FullGaussian",
    "GaussianPosterior",
    "KroneckerGaussian",
    "NNGBlkTri",
    "NNGFull",
    "NoisyAdam",
    "NoisyKFAC",
    "NonFiniteGradientError",
    "PosteriorOptimizer",
    "PosteriorWarning",
    "VadaGrad",
    "Vadam",
    "VariationalOptimizer",
    "Vprop",
    "apply_masks",
    "baselines",
    "curvature",
    "evaluate_classifier",
    "metrics",
    "predict",
    "prune_masks",
    "pruned",
    "pruning",
    "symmetric_kl",
    "unwrap",
]
