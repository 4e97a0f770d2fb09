"""ngvi optimizers: one weight-perturbation engine and small update rules on top of it.

``__all__`` lists the optimizers (and their common base class, :class:`VariationalOptimizer`). What they take,
return and raise is here as well: :class:`EmpiricalBayes` (a learned prior precision), :class:`Diagnostics`
and :class:`PosteriorWarning` (``opt.diagnostics()``), :class:`NonFiniteGradientError`, and
:func:`sample_preactivations` (per-example pre-activation noise for the diagonal rules); each is also a name
of ``ngvi``. The protocol every trainer meets and the wrapper helper live in :mod:`ngvi.protocol`; reading
``ngvi.optim.PosteriorOptimizer`` or ``ngvi.optim.unwrap`` still works in 0.2.0 and warns.
"""

from __future__ import annotations

import warnings
from typing import Any

from ._diag_local import sample_preactivations as sample_preactivations
from .badam import BAdam
from .diagnostics import Diagnostics as Diagnostics
from .diagnostics import PosteriorWarning as PosteriorWarning
from .engine.empirical_bayes import EmpiricalBayes as EmpiricalBayes
from .engine.optimizer import NonFiniteGradientError as NonFiniteGradientError
from .engine.optimizer import VariationalOptimizer
from .engine.options import EngineOptions as EngineOptions
from .ivon import IVON
from .nng_blktri import NNGBlkTri
from .nng_full import NNGFull
from .noisy_adam import NoisyAdam
from .noisy_kfac import NoisyKFAC
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
    "NNGBlkTri",
    "NNGFull",
    "NoisyAdam",
    "NoisyKFAC",
    "VadaGrad",
    "Vadam",
    "VariationalOptimizer",
    "Vprop",
]

# names that moved in 0.2.0: read from here, they warn once per access and go in 0.3.0
_MOVED = {"PosteriorOptimizer": "ngvi.protocol", "unwrap": "ngvi.protocol"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(
            f"ngvi.optim.{name} moved to {_MOVED[name]}.{name} (also ngvi.{name}); "
            "the old path goes in 0.3.0",
            DeprecationWarning,
            stacklevel=2,
        )
        from .. import protocol

        return getattr(protocol, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
