"""Gaussian posteriors over a list of parameter tensors: one protocol, four families.

Every family is a :class:`GaussianPosterior`: ``mean`` and ``variance`` (marginal variances) are lists shaped
like the parameters, in parameter order, and each has ``std``, ``sample(n)``, ``log_prob``, ``entropy``,
``kl``, ``snr`` and ``prune_masks``. The families: :class:`DiagonalGaussian` (mean field),
:class:`KroneckerGaussian` (noisy K-FAC), :class:`FullGaussian` (a dense covariance, NNG-full) and
:class:`BlockTridiagonalGaussian` (NNG-BlkTri). :func:`dense_covariance` gives any of them as a dense matrix.

This package imports only torch, :mod:`ngvi.pruning` and :mod:`ngvi.curvature.tridiagonal`, never an
optimizer: the optimizers build posteriors, not the other way round.
"""

from .base import GaussianPosterior, symmetric_kl
from .blktri import BlockTridiagonalGaussian
from .diagonal import DiagonalGaussian
from .full import DENSE_LIMIT, FullGaussian, as_full, dense_covariance, flatten, unflatten
from .kronecker import KroneckerBlock, KroneckerGaussian, join_block, split_block

__all__ = [
    "DENSE_LIMIT",
    "BlockTridiagonalGaussian",
    "DiagonalGaussian",
    "FullGaussian",
    "GaussianPosterior",
    "KroneckerBlock",
    "KroneckerGaussian",
    "as_full",
    "dense_covariance",
    "flatten",
    "join_block",
    "split_block",
    "symmetric_kl",
    "unflatten",
]
