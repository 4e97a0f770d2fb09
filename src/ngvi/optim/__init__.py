"""ngvi optimizers: one weight-perturbation engine and small update rules on top of it."""

from .badam import BAdam
from .base import NonFiniteGradientError, VariationalOptimizer
from .diagnostics import Diagnostics, PosteriorWarning
from .ivon import IVON
from .noisy_adam import NoisyAdam
from .noisy_kfac import NoisyKFAC
from .protocol import PosteriorOptimizer
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
    "NoisyAdam",
    "NoisyKFAC",
    "NonFiniteGradientError",
    "PosteriorOptimizer",
    "PosteriorWarning",
    "VadaGrad",
    "Vadam",
    "VariationalOptimizer",
    "Vprop",
]
