"""The mean-field family q(θ) = Πⱼ N(θⱼ | μⱼ, σⱼ²) of Vadam, VOGN, IVON, BBVI, ... (point estimates: see
:mod:`.base`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .base import LOG_2PI, GaussianPosterior, point_indices

__all__ = ["DiagonalGaussian"]


class DiagonalGaussian(GaussianPosterior):
    r"""Mean-field Gaussian :math:`q(\theta)=\prod_j \mathcal N(\theta_j\mid\mu_j,\sigma_j^2)`.

    Args:
        mean: tensors shaped like the parameters.
        variance: positive tensors of the same shapes (marginal variances σ²); zeros at ``point``.
        point: indices of point-estimate parameters (see the module docstring).
    """

    def __init__(self, mean: Sequence[Tensor], variance: Sequence[Tensor], point: Sequence[int] = ()):
        if len(mean) != len(variance):
            raise ValueError(f"got {len(mean)} mean tensors but {len(variance)} variance tensors")
        self.point = point_indices(point, len(mean))
        for i, (m, v) in enumerate(zip(mean, variance, strict=True)):
            if m.shape != v.shape:
                raise ValueError(
                    f"mean[{i}] has shape {tuple(m.shape)} but variance[{i}] has {tuple(v.shape)}"
                )
            if i in self.point:
                if bool((v != 0).any()):
                    raise ValueError(f"variance[{i}] of a point estimate must be 0")
            elif not bool(torch.isfinite(v).all()) or not bool((v > 0).all()):
                raise ValueError(f"variance[{i}] must be positive and finite")
        self.mean = [m.detach().clone() for m in mean]
        self.variance = [v.detach().clone() for v in variance]

    def _random(self, *lists: Sequence[Tensor]) -> list[tuple[Tensor, ...]]:
        """Zipped entries of the random (non-point) parameters."""
        return [t for i, t in enumerate(zip(*lists, strict=True)) if i not in self.point]

    @property
    def precision(self) -> list[Tensor]:
        return [v.reciprocal() for v in self.variance]

    def sample(self, n: int | None = None, generator: torch.Generator | None = None) -> list[Tensor]:
        """Draw θ = μ + σ⊙ε. With ``n`` each tensor gets a leading dimension of size n."""
        if n is not None and (not isinstance(n, int) or n < 1):
            raise ValueError(f"n must be a positive int or None, got {n!r}")
        out = []
        for m, s in zip(self.mean, self.std, strict=True):
            shape = m.shape if n is None else (n, *m.shape)
            eps = torch.randn(shape, generator=generator, dtype=m.dtype, device=m.device)
            out.append(m + s * eps)
        return out

    def log_prob(self, sample: Sequence[Tensor]) -> Tensor:
        """log q(θ) summed over all weights: a scalar, or a vector of n values for a batch of n samples."""
        n = self._leading_dim(sample)
        total = torch.zeros(() if n is None else (n,), dtype=torch.float64, device=self.mean[0].device)
        for x, m, v in self._random(sample, self.mean, self.variance):
            x, m, v = x.double(), m.double(), v.double()
            terms = -0.5 * ((x - m) ** 2 / v + v.log() + LOG_2PI)
            total = total + (terms.sum() if n is None else terms.reshape(n, -1).sum(1))
        return total

    def entropy(self) -> Tensor:
        """H[q] = ½ Σⱼ (1 + log 2π + log σⱼ²)."""
        total = torch.zeros((), dtype=torch.float64)
        for (v,) in self._random(self.variance):
            total = total + (0.5 * (1.0 + LOG_2PI + v.double().log())).sum()
        return total

    def kl(self, other: GaussianPosterior) -> Tensor:
        r"""KL(self ‖ other) = ½ Σⱼ [σ₁²/σ₂² + (μ₂−μ₁)²/σ₂² − 1 + log σ₂² − log σ₁²]."""
        if not isinstance(other, DiagonalGaussian):
            raise TypeError(f"KL between DiagonalGaussian and {type(other).__name__} is not implemented")
        if [m.shape for m in self.mean] != [m.shape for m in other.mean]:
            raise ValueError("the two posteriors cover parameters of different shapes")
        if set(other.point) - set(self.point):
            raise ValueError("KL(q ‖ p) is infinite where p is a point mass and q is not")
        total = torch.zeros((), dtype=torch.float64, device=self.mean[0].device)
        for m1, v1, m2, v2 in self._random(self.mean, self.variance, other.mean, other.variance):
            m1, v1, m2, v2 = m1.double(), v1.double(), m2.double(), v2.double()
            total = total + 0.5 * (v1 / v2 + (m2 - m1) ** 2 / v2 - 1.0 + v2.log() - v1.log()).sum()
        return total

    @classmethod
    def isotropic(cls, like: Sequence[Tensor], precision: float, mean: float = 0.0) -> DiagonalGaussian:
        """The prior N(mean, I/precision) over tensors shaped like ``like``."""
        if not precision > 0:
            raise ValueError(f"precision must be positive, got {precision}")
        return cls(
            [torch.full_like(t, mean) for t in like], [torch.full_like(t, 1.0 / precision) for t in like]
        )

    def _file_tensors(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        return {f"variance.{i}": v for i, v in enumerate(self.variance)}, {}

    @classmethod
    def _from_file(
        cls, mean: list[Tensor], tensors: dict[str, Tensor], point: list[int], structure: dict[str, Any]
    ) -> DiagonalGaussian:
        return cls(mean, [tensors[f"variance.{i}"] for i in range(len(mean))], point=point)

    def __repr__(self) -> str:
        return f"DiagonalGaussian({len(self.mean)} tensors, {self.numel()} weights)"
