r"""A Gaussian with a dense covariance over all parameters (NNG-full, Zhang et al. 2018 §3.1).

:class:`FullGaussian` has the interface of :class:`~ngvi.DiagonalGaussian`: ``mean`` and
``variance`` (the marginal variances Σⱼⱼ) are lists shaped like the parameters, in parameter order;
``sample(n)``, ``log_prob``, ``kl``, ``entropy`` and ``snr``. On top it has ``covariance`` and
``precision``: dense [k, k] matrices over the flattened parameters (each parameter flattened row-major, the
parameters concatenated in order). Densities use the Cholesky factor L of Σ, in float64:

.. math::
    \log q(\theta) = -\tfrac12\big[\lVert L^{-1}(\theta-\mu)\rVert^2 + 2\textstyle\sum_j\log L_{jj}
        + k\log 2\pi\big].

:func:`dense_covariance` gives the same dense matrix for the other families (diagonal, Kronecker, block
tridiagonal), which is what ``kl`` uses against a posterior of another family, and what NNG's Fig. 1 shows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .base import LOG_2PI, GaussianPosterior
from .diagonal import DiagonalGaussian
from .kronecker import KroneckerGaussian

__all__ = ["DENSE_LIMIT", "FullGaussian", "dense_covariance", "flatten", "unflatten"]

#: the most weights a dense covariance is formed for (a 8192² float64 matrix takes 512 MiB)
DENSE_LIMIT = 8192


def flatten(tensors: Sequence[Tensor], lead: tuple[int, ...] = ()) -> Tensor:
    """Tensors (each with leading dims ``lead``) → one [*lead, k] tensor, in order, each row-major.

    Args:
        tensors: the tensors, each shaped [*lead, ...].
        lead: the leading dims they share, kept in front.
    """
    return torch.cat([t.reshape(*lead, -1) for t in tensors], dim=-1)


def unflatten(flat: Tensor, shapes: Sequence[torch.Size]) -> list[Tensor]:
    """The inverse of :func:`flatten`: [*lead, k] → tensors of ``shapes`` with the leading dims.

    Args:
        flat: a [*lead, k] tensor, k the total size of ``shapes``.
        shapes: the shapes to cut it into, in order.
    """
    lead = flat.shape[:-1]
    sizes = [math.prod(s) for s in shapes]
    return [p.reshape(*lead, *s) for p, s in zip(flat.split(sizes, dim=-1), shapes, strict=True)]


def _check_size(k: int, what: str) -> None:
    if k > DENSE_LIMIT:
        raise ValueError(
            f"{what} needs a dense {k}×{k} covariance ({k * k * 8 / 2**30:.1f} GiB in float64), more than "
            f"ngvi.posterior.full.DENSE_LIMIT = {DENSE_LIMIT} weights allow; use a structured posterior's "
            "own methods (sample, log_prob, kl against the prior) instead"
        )


class FullGaussian(GaussianPosterior):
    r"""q(θ) = N(μ, Σ) with a dense covariance Σ over all k weights.

    Args:
        mean: tensors shaped like the parameters.
        covariance: a symmetric positive definite [k, k] matrix over the flattened parameters (in the order
            of :func:`flatten`); kept in float64.
    """

    def __init__(self, mean: Sequence[Tensor], covariance: Tensor):
        self.mean = [m.detach().clone() for m in mean]
        k = self.numel()
        if covariance.shape != (k, k):
            raise ValueError(
                f"covariance has shape {tuple(covariance.shape)}, expected ({k}, {k}) for {k} weights"
            )
        cov = covariance.detach().double()
        cov = 0.5 * (cov + cov.mT)
        lower, info = torch.linalg.cholesky_ex(cov)
        if int(info) != 0 or not bool(torch.isfinite(lower).all()):
            raise ValueError("covariance must be symmetric positive definite and finite")
        self.covariance = cov
        self._chol = lower
        shapes = [m.shape for m in self.mean]
        self.variance = [
            v.to(m.dtype) for v, m in zip(unflatten(cov.diagonal(), shapes), self.mean, strict=True)
        ]

    @property
    def precision(self) -> Tensor:
        """Σ⁻¹ as a dense [k, k] float64 matrix."""
        return torch.cholesky_inverse(self._chol)

    def _flat_mean(self) -> Tensor:
        return flatten([m.double() for m in self.mean])

    def sample(self, n: int | None = None, generator: torch.Generator | None = None) -> list[Tensor]:
        """θ = μ + Lε. With ``n`` each tensor gets a leading dimension of size n."""
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"n must be a positive int or None, got {n!r}")
        lead = () if n is None else (n,)
        eps = torch.randn((*lead, self.numel()), generator=generator, dtype=torch.float64)
        draw = self._flat_mean() + eps @ self._chol.mT
        return [
            t.to(m.dtype)
            for t, m in zip(unflatten(draw, [m.shape for m in self.mean]), self.mean, strict=True)
        ]

    def _logdet(self) -> Tensor:
        return 2.0 * self._chol.diagonal().log().sum()

    def _mahalanobis(self, diff: Tensor) -> Tensor:
        """‖L⁻¹ d‖² for d [*, k]."""
        z = torch.linalg.solve_triangular(self._chol, diff.unsqueeze(-1), upper=False)
        return z.squeeze(-1).square().sum(-1)

    def log_prob(self, sample: Sequence[Tensor]) -> Tensor:
        """log q(θ): a scalar, or a vector of n values for a batch of n samples."""
        n = self._leading_dim(sample)
        lead = () if n is None else (n,)
        diff = flatten([x.double() for x in sample], lead) - self._flat_mean()
        return -0.5 * (self._mahalanobis(diff) + self._logdet() + self.numel() * LOG_2PI)

    def entropy(self) -> Tensor:
        """H[q] = ½[k(1 + log 2π) + log|Σ|]."""
        return 0.5 * (self.numel() * (1.0 + LOG_2PI) + self._logdet())

    def kl(self, other: GaussianPosterior) -> Tensor:
        r"""KL(self ‖ other) = ½[tr(Σ₂⁻¹Σ₁) + (μ₂−μ₁)ᵀΣ₂⁻¹(μ₂−μ₁) − k + log|Σ₂| − log|Σ₁|], for ``other``
        of any family over the same parameters (a DiagonalGaussian, such as the prior, without forming
        Σ₂)."""
        if [m.shape for m in self.mean] != [m.shape for m in other.mean]:
            raise ValueError("the two posteriors cover parameters of different shapes")
        diff = flatten([m.double() for m in other.mean]) - self._flat_mean()
        k = self.numel()
        if isinstance(other, DiagonalGaussian):
            var2 = flatten([v.double() for v in other.variance])
            trace = (self.covariance.diagonal() / var2).sum()
            maha, logdet2 = (diff.square() / var2).sum(), var2.log().sum()
        else:
            other_full = other if isinstance(other, FullGaussian) else as_full(other)
            chol2 = other_full._chol
            trace = torch.linalg.solve_triangular(chol2, self._chol, upper=False).square().sum()
            maha, logdet2 = other_full._mahalanobis(diff), other_full._logdet()
        return 0.5 * (trace + maha - k + logdet2 - self._logdet())

    def _file_tensors(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        return {"covariance": self.covariance}, {}

    @classmethod
    def _from_file(
        cls, mean: list[Tensor], tensors: dict[str, Tensor], point: list[int], structure: dict[str, Any]
    ) -> FullGaussian:
        return cls(mean, tensors["covariance"])

    def __repr__(self) -> str:
        return f"FullGaussian({len(self.mean)} tensors, {self.numel()} weights)"


def dense_covariance(posterior: GaussianPosterior) -> Tensor:
    """The [k, k] float64 covariance of any ngvi posterior over its flattened parameters (in the order of
    :func:`flatten`). Raises ValueError beyond :data:`DENSE_LIMIT` weights."""
    k = posterior.numel()
    _check_size(k, type(posterior).__name__)
    if isinstance(posterior, FullGaussian):
        return posterior.covariance.clone()
    if isinstance(posterior, DiagonalGaussian):
        return torch.diag(flatten([v.double() for v in posterior.variance]))
    if isinstance(posterior, KroneckerGaussian):
        return _kronecker_dense(posterior)
    dense = getattr(posterior, "dense_covariance", None)
    if dense is None:
        raise TypeError(f"no dense covariance for {type(posterior).__name__}")
    return dense()


def as_full(posterior: GaussianPosterior) -> FullGaussian:
    """The same distribution as a :class:`FullGaussian` (a dense copy of its covariance).

    Args:
        posterior: any ngvi posterior of at most :data:`DENSE_LIMIT` weights.

    Raises:
        ValueError: more weights than :data:`DENSE_LIMIT`.
    """
    return FullGaussian(posterior.mean, dense_covariance(posterior))


def _kronecker_dense(post: KroneckerGaussian) -> Tensor:
    offsets = [0]
    for m in post.mean:
        offsets.append(offsets[-1] + m.numel())
    index = [torch.arange(offsets[i], offsets[i + 1]).reshape(m.shape) for i, m in enumerate(post.mean)]
    cov = torch.zeros(offsets[-1], offsets[-1], dtype=torch.float64)
    for b in post.blocks:
        g, r = b.row_cov.shape[:2]
        idx = torch.cat([index[i].reshape(g, r, -1) for i in b.params], dim=-1)
        for k in range(g):
            flat = idx[k].reshape(-1)
            cov[flat[:, None], flat[None, :]] = torch.kron(b.row_cov[k].double(), b.col_cov[k].double())
    return cov
