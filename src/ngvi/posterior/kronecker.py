"""The layer-wise matrix-variate family vec(W) ~ N(vec(M), U ⊗ V) of noisy K-FAC, and its block layout."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .base import LOG_2PI, GaussianPosterior, point_indices
from .diagonal import DiagonalGaussian

__all__ = ["KroneckerBlock", "KroneckerGaussian", "join_block", "split_block"]


def join_block(tensors: Sequence[Tensor], groups: int, rows: int, lead: tuple[int, ...] = ()) -> Tensor:
    """The Kronecker block layout: parameter tensors → one [*lead, G, rows, cols] block.

    Each tensor (optionally with leading dims ``lead``) is reshaped to [*lead, G, rows, −1] and the pieces are
    concatenated along the last dim: for a layer, the weight's columns and then the bias column. Shared by
    :class:`KroneckerGaussian` and :class:`ngvi.NoisyKFAC`.

    Args:
        tensors: the parameter tensors of one block (weight, then bias), each with leading dims ``lead``.
        groups: G, the independent groups (1 except for grouped convolutions).
        rows: the block's rows r (a layer's output features per group).
        lead: leading dims the tensors share (e.g. samples), kept in front.
    """
    return torch.cat([t.reshape(*lead, groups, rows, -1) for t in tensors], dim=-1)


def split_block(block: Tensor, shapes: Sequence[torch.Size], groups: int, rows: int) -> list[Tensor]:
    """The inverse of :func:`join_block`: a [*lead, G, rows, cols] block → tensors of ``shapes``, each with
    the block's leading dims.

    Args:
        block: a [*lead, G, rows, cols] block.
        shapes: the parameter shapes to cut it into, in :func:`join_block`'s order.
        groups: G.
        rows: the block's rows.
    """
    lead = block.shape[:-3]
    sizes = [math.prod(shape) // (groups * rows) for shape in shapes]
    return [p.reshape(*lead, *shape) for p, shape in zip(block.split(sizes, dim=-1), shapes, strict=True)]


@dataclass(frozen=True)
class KroneckerBlock:
    r"""Parameters that share one matrix-variate Gaussian (e.g. the weight and bias of one layer).

    ``params`` are indices into the posterior's parameter list. Each of those tensors, reshaped to
    [G, r, -1] and concatenated along the last dim, gives W of shape [G, r, c] (G independent groups;
    G = 1 except for grouped convolutions). Then
    :math:`\mathrm{Cov}(W_{g,i,j}, W_{g,k,l}) = U_{g,i,k}\,V_{g,j,l}`, i.e. vec(W_g) ~ N(vec(M_g), U_g ⊗ V_g)
    in row-major order, with U = ``row_cov`` [G, r, r] and V = ``col_cov`` [G, c, c].
    """

    params: tuple[int, ...]
    row_cov: Tensor
    col_cov: Tensor


class KroneckerGaussian(GaussianPosterior):
    r"""Layer-wise matrix-variate Gaussian: blocks of parameters with Kronecker-factored covariance.

    Same interface as :class:`DiagonalGaussian`: ``mean`` and ``variance`` (the marginal variances
    :math:`U_{ii}V_{jj}`) are lists shaped like the parameters in parameter order; ``sample(n)``,
    ``log_prob``, ``kl`` (against another KroneckerGaussian with the same blocks, or a DiagonalGaussian such
    as the prior), ``entropy``, ``snr``. Densities use the Cholesky factors of U and V, in float64:

    .. math::
        \log q(W) = -\tfrac12\Big[\|L_U^{-1}(W-M)L_V^{-\top}\|_F^2 + c\log|U| + r\log|V| + rc\log 2\pi\Big].

    Args:
        mean: tensors shaped like the parameters.
        blocks: :class:`KroneckerBlock` s that, with ``point``, cover every parameter index exactly once.
        point: indices of point-estimate parameters (see the module docstring).
    """

    def __init__(self, mean: Sequence[Tensor], blocks: Sequence[KroneckerBlock], point: Sequence[int] = ()):
        self.mean = [m.detach().clone() for m in mean]
        self.point = point_indices(point, len(self.mean))
        covered = sorted([*(i for b in blocks for i in b.params), *self.point])
        if covered != list(range(len(self.mean))):
            raise ValueError(
                f"the blocks and point estimates must cover each of the {len(self.mean)} parameters exactly "
                f"once, got {covered}"
            )
        self.blocks: list[KroneckerBlock] = []
        self._chol: list[tuple[Tensor, Tensor]] = []
        for k, b in enumerate(blocks):
            row, col = b.row_cov.detach().clone(), b.col_cov.detach().clone()
            if row.dim() != 3 or col.dim() != 3 or row.shape[0] != col.shape[0]:
                raise ValueError(f"blocks[{k}]: row_cov and col_cov must be [G, r, r] and [G, c, c]")
            g, r, c = row.shape[0], row.shape[1], col.shape[1]
            if sum(self.mean[i].numel() for i in b.params) != g * r * c:
                raise ValueError(
                    f"blocks[{k}]: parameters {b.params} have "
                    f"{sum(self.mean[i].numel() for i in b.params)} weights, the factors describe "
                    f"{g}×{r}×{c}"
                )
            chol = []
            for name, cov in (("row_cov", row), ("col_cov", col)):
                lower, info = torch.linalg.cholesky_ex(cov.double())
                if bool((info != 0).any()) or not bool(torch.isfinite(lower).all()):
                    raise ValueError(f"blocks[{k}].{name} must be symmetric positive definite")
                chol.append(lower)
            self.blocks.append(KroneckerBlock(tuple(b.params), row, col))
            self._chol.append((chol[0], chol[1]))
        self.variance = [
            torch.zeros_like(m) if i in self.point else torch.empty(0) for i, m in enumerate(self.mean)
        ]
        for b in self.blocks:
            diag = (
                b.row_cov.diagonal(dim1=-2, dim2=-1)[:, :, None]
                * b.col_cov.diagonal(dim1=-2, dim2=-1)[:, None]
            )
            for i, v in zip(b.params, self._split(b, diag), strict=True):
                self.variance[i] = v.to(self.mean[i].dtype)

    # -- layout: parameter tensors <-> [*, G, r, c] blocks -------------------------------------------------
    def _join(self, b: KroneckerBlock, tensors: Sequence[Tensor], lead: tuple[int, ...]) -> Tensor:
        g, r = b.row_cov.shape[:2]
        return join_block(tensors, g, r, lead)

    def _split(self, b: KroneckerBlock, block: Tensor) -> list[Tensor]:
        g, r = b.row_cov.shape[:2]
        return split_block(block, [self.mean[i].shape for i in b.params], g, r)

    def _logdet(self, k: int) -> Tensor:
        lu, lv = self._chol[k]
        r, c = lu.shape[-1], lv.shape[-1]
        return 2.0 * (
            c * lu.diagonal(dim1=-2, dim2=-1).log().sum() + r * lv.diagonal(dim1=-2, dim2=-1).log().sum()
        )

    def _mahalanobis(self, k: int, diff: Tensor) -> Tensor:
        """‖L_U⁻¹ D L_V⁻ᵀ‖² per leading index, for D [*, G, r, c] in float64."""
        lu, lv = self._chol[k]
        y = torch.linalg.solve_triangular(lu, diff, upper=False)  # L_U⁻¹ D
        z = torch.linalg.solve_triangular(lv, y.mT, upper=False)  # L_V⁻¹ (L_U⁻¹ D)ᵀ
        return z.square().sum(dim=(-3, -2, -1))

    # -- the GaussianPosterior interface -----------------------------------------------------------------
    def sample(self, n: int | None = None, generator: torch.Generator | None = None) -> list[Tensor]:
        """Draw W = M + L_U E L_Vᵀ per block. With ``n`` each tensor gets a leading dimension of size n."""
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"n must be a positive int or None, got {n!r}")
        lead = () if n is None else (n,)
        out: list[Tensor] = [
            self.mean[i].expand(*lead, *self.mean[i].shape).clone() for i in range(len(self.mean))
        ]
        for k, b in enumerate(self.blocks):
            lu, lv = self._chol[k]
            m = self._join(b, [self.mean[i] for i in b.params], ())
            eps = torch.randn((*lead, *m.shape), generator=generator, dtype=m.dtype, device=m.device)
            draw = m + lu.to(m.dtype) @ eps @ lv.to(m.dtype).mT
            for i, t in zip(b.params, self._split(b, draw), strict=True):
                out[i] = t
        return out

    def log_prob(self, sample: Sequence[Tensor]) -> Tensor:
        """log q(θ): a scalar, or a vector of n values for a batch of n samples."""
        n = self._leading_dim(sample)
        lead = () if n is None else (n,)
        total = torch.zeros(lead, dtype=torch.float64, device=self.mean[0].device)
        for k, b in enumerate(self.blocks):
            diff = self._join(b, [sample[i].double() - self.mean[i].double() for i in b.params], lead)
            size = diff[(0,) * len(lead)].numel()
            total = total - 0.5 * (self._mahalanobis(k, diff) + self._logdet(k) + size * LOG_2PI)
        return total

    def entropy(self) -> Tensor:
        """H[q] = ½ Σ_blocks [k(1 + log 2π) + log|U ⊗ V|], k the block's number of weights."""
        total = torch.zeros((), dtype=torch.float64, device=self.mean[0].device)
        for k, b in enumerate(self.blocks):
            size = sum(self.mean[i].numel() for i in b.params)
            total = total + 0.5 * (size * (1.0 + LOG_2PI) + self._logdet(k))
        return total

    def kl(self, other: GaussianPosterior) -> Tensor:
        r"""KL(self ‖ other) = ½ Σ_blocks [tr(Σ₂⁻¹Σ₁) + (μ₂−μ₁)ᵀΣ₂⁻¹(μ₂−μ₁) − k + log|Σ₂| − log|Σ₁|].

        ``other`` is a KroneckerGaussian with the same blocks (tr = tr(U₂⁻¹U₁)·tr(V₂⁻¹V₁)) or a
        DiagonalGaussian over the same parameters (e.g. the prior).
        """
        if [m.shape for m in self.mean] != [m.shape for m in other.mean]:
            raise ValueError("the two posteriors cover parameters of different shapes")
        total = torch.zeros((), dtype=torch.float64, device=self.mean[0].device)
        for k, b in enumerate(self.blocks):
            diff = self._join(b, [other.mean[i].double() - self.mean[i].double() for i in b.params], ())
            size = diff.numel()
            if isinstance(other, KroneckerGaussian):
                j = next((j for j, ob in enumerate(other.blocks) if ob.params == b.params), None)
                if j is None or other.blocks[j].row_cov.shape != b.row_cov.shape:
                    raise ValueError(f"other has no block matching parameters {b.params}")
                (lu1, lv1), (lu2, lv2) = self._chol[k], other._chol[j]
                tr_u = torch.linalg.solve_triangular(lu2, lu1, upper=False).square().sum(dim=(-2, -1))
                tr_v = torch.linalg.solve_triangular(lv2, lv1, upper=False).square().sum(dim=(-2, -1))
                trace, maha, logdet2 = (tr_u * tr_v).sum(), other._mahalanobis(j, diff), other._logdet(j)
            elif isinstance(other, DiagonalGaussian):
                var2 = self._join(b, [other.variance[i].double() for i in b.params], ())
                diag_u = b.row_cov.double().diagonal(dim1=-2, dim2=-1)[:, :, None]
                diag_v = b.col_cov.double().diagonal(dim1=-2, dim2=-1)[:, None]
                trace = (diag_u * diag_v / var2).sum()
                maha, logdet2 = (diff.square() / var2).sum(), var2.log().sum()
            else:
                raise TypeError(f"KL between KroneckerGaussian and {type(other).__name__} is not implemented")
            total = total + 0.5 * (trace + maha - size + logdet2 - self._logdet(k))
        return total

    def _file_tensors(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        tensors = {}
        for k, b in enumerate(self.blocks):
            tensors[f"block.{k}.row_cov"], tensors[f"block.{k}.col_cov"] = b.row_cov, b.col_cov
        return tensors, {"blocks": [list(b.params) for b in self.blocks]}

    @classmethod
    def _from_file(
        cls, mean: list[Tensor], tensors: dict[str, Tensor], point: list[int], structure: dict[str, Any]
    ) -> KroneckerGaussian:
        layout = structure.get("blocks")
        if not isinstance(layout, list) or not all(
            isinstance(ps, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ps)
            for ps in layout
        ):
            raise ValueError("structure 'blocks' must be a list of lists of parameter indices")
        blocks = []
        for k, ps in enumerate(layout):
            row, col = tensors[f"block.{k}.row_cov"], tensors[f"block.{k}.col_cov"]
            for name, t in (("row_cov", row), ("col_cov", col)):
                if t.dim() != 3 or t.shape[1] != t.shape[2] or t.shape[0] != row.shape[0]:
                    raise ValueError(f"block.{k}.{name} has shape {list(t.shape)}, not [G, n, n]")
            blocks.append(KroneckerBlock(tuple(ps), row, col))
        return cls(mean, blocks, point=point)

    def __repr__(self) -> str:
        return f"KroneckerGaussian({len(self.blocks)} blocks, {self.numel()} weights)"
