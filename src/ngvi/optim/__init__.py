"""ngvi optimizers: one weight-perturbation engine and small update rules on top of it."""

from ._diag_local import sample_preactivations
from .badam import BAdam
from .diagnostics import Diagnostics, PosteriorWarning
from .engine.empirical_bayes import EmpiricalBayes
from .engine.optimizer import NonFiniteGradientError, VariationalOptimizer
from .ivon import IVON
from .nng_blktri import NNGBlkTri
from .nng_full import NNGFull
from .noisy_adam import NoisyAdam
from .noisy_kfac import NoisyKFAC
from .protocol import PosteriorOptimizer, unwrap
from .vadagrad import VadaGrad
from .vadam import Vadam
from .vogn import VOGN
from .von import VON
from .vprop import Vprop

__all__ = [
    "IVON",
    "VOGN",
    "VON",
    "BAdam",
    "Diagnostics",
    "EmpiricalBayes",
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
    "sample_preactivations",
    "unwrap",
]
