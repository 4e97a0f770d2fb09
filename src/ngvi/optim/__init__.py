"""ngvi optimizers: one weight-perturbation engine and small update rules on top of it."""

from .badam import BAdam
from .base import NonFiniteGradientError, VariationalOptimizer
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
    "NoisyAdam",
    "NoisyKFAC",
    "NonFiniteGradientError",
    "PosteriorOptimizer",
    "VadaGrad",
    "Vadam",
    "VariationalOptimizer",
    "Vprop",
]
