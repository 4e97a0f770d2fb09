r"""The block-tridiagonal Gaussian of NNG-BlkTri (Zhang et al. 2018 §3.5; Martens & Grosse 2015 §4.3).

Over a chain of layers with weights W_i [o_i, d_i] (weight columns, then the bias column),

.. math::
    q(w) = \mathcal N(\mu,\ \Sigma),\qquad \Sigma = c\,\Xi^\top\Lambda\,\Xi = c\,\hat F^{-1},

where c = λ/N and :mod:`ngvi.curvature.tridiagonal` defines Ξ (links Ψ_{i,i+1} = Ψ^S ⊗ Ψ^A between adjacent
layers) and Λ = diag(Λ_i), Λ_i = (K_S ⊗ K_A) diag(1/(1 − e_S e_Aᵀ)) (K_S ⊗ K_A)ᵀ. The covariance Σ is block
tridiagonal (adjacent layers are correlated, layers further apart only through them) and the precision
Σ⁻¹ = F̂/c agrees with the damped Kronecker-factored Fisher on the tridiagonal blocks.

Everything is computed from the factors, in float64, without forming Σ:

* a sample is μ + √c Ξᵀ R ε with RRᵀ = Λ (R_i = (K_S ⊗ K_A) diag(√D_i));
* the marginal variance of layer i is c·[diag(Λ_i) + diag(Ψ_{i−1,i}ᵀ Λ_{i−1} Ψ_{i−1,i})], each a product of
  squared factors: diag((P⊗Q) D (P⊗Q)ᵀ) = P^{∘2} D Q^{∘2ᵀ};
* log q uses Σ⁻¹ = Ξ⁻¹Λ⁻¹Ξ⁻ᵀ/c: y = Ξ⁻ᵀ(w − μ) by forward substitution, then Σ_i Σ_{jk} (1 − e_S e_A)ⱼₖ ·
  (K_S⁻¹ y_i K_A⁻ᵀ)ⱼₖ², and log|Σ| = k log c + Σ_i [2d_i log|K_S| + 2o_i log|K_A| − Σ log(1 − e_S e_Aᵀ)]
  (|Ξ| = 1).

``dense_covariance()`` forms Σ for small models (the figure of NNG's Fig. 1, KL against other families).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..curvature.tridiagonal import ChainLayer, lam_sqrt, precondition, xi_t, xi_t_solve
from .base import LOG_2PI, GaussianPosterior
from .diagonal import DiagonalGaussian
from .full import _check_size, as_full, flatten

__all__ = ["BlockTridiagonalGaussian"]

#: the ChainLayer fields, in its constructor's order (the tensors a saved file holds per layer)
CHAIN_FIELDS = ("row_basis", "col_basis", "row_eig", "col_eig", "row_link", "col_link")


class BlockTridiagonalGaussian(GaussianPosterior):
    r"""q(w) = N(μ, c·ΞᵀΛΞ) over a chain of layers (see the module docstring).

    Args:
        mean: tensors shaped like the parameters.
        layers: for each layer of the chain, in order, the indices into ``mean`` of its parameters (the
            weight [o, d] and then, if any, the bias [o]).
        chain: the :class:`~ngvi.curvature.tridiagonal.ChainLayer` of each layer.
        scale: c = λ/N.
    """

    def __init__(
        self,
        mean: Sequence[Tensor],
        layers: Sequence[Sequence[int]],
        chain: Sequence[ChainLayer],
        scale: float,
    ):
        self.mean = [m.detach().clone() for m in mean]
        if sorted(i for ls in layers for i in ls) != list(range(len(self.mean))):
            raise ValueError(f"the layers must cover each of the {len(self.mean)} parameters exactly once")
        if len(layers) != len(chain):
            raise ValueError(f"got {len(layers)} layers but {len(chain)} chain factors")
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.layers = [tuple(ls) for ls in layers]
        self.chain = [c.to(torch.float64) for c in chain]
        self.scale = float(scale)
        for k, (ls, c) in enumerate(zip(self.layers, self.chain, strict=True)):
            rows, cols = c.row_basis.shape[0], c.col_basis.shape[0]
            if sum(self.mean[i].numel() for i in ls) != rows * cols:
                raise ValueError(f"layer {k}: parameters {ls} do not make a [{rows}, {cols}] block")
        self._inverse_bases = [
            (torch.linalg.inv(c.row_basis), torch.linalg.inv(c.col_basis)) for c in self.chain
        ]
        self._variance64: list[Tensor] = [torch.empty(0)] * len(self.mean)
        for ls, var in zip(self.layers, self._block_variances(), strict=True):
            for i, v in zip(ls, self._split(ls, var), strict=True):
                self._variance64[i] = self.scale * v
        self.variance = [v.to(m.dtype) for v, m in zip(self._variance64, self.mean, strict=True)]

    # -- layout ------------------------------------------------------------------------------------------
    def _join(self, ls: tuple[int, ...], tensors: Sequence[Tensor], lead: tuple[int, ...]) -> Tensor:
        rows = self.mean[ls[0]].shape[0]
        return torch.cat([tensors[i].reshape(*lead, rows, -1) for i in ls], dim=-1)

    def _split(self, ls: tuple[int, ...], block: Tensor) -> list[Tensor]:
        lead = block.shape[:-2]
        sizes = [self.mean[i].numel() // block.shape[-2] for i in ls]
        return [
            p.reshape(*lead, *self.mean[i].shape) for i, p in zip(ls, block.split(sizes, dim=-1), strict=True)
        ]

    def _blocks(self, tensors: Sequence[Tensor], lead: tuple[int, ...]) -> list[Tensor]:
        return [self._join(ls, tensors, lead) for ls in self.layers]

    # -- the moments ---------------------------------------------------------------------------------------
    def _block_variances(self) -> list[Tensor]:
        """diag(ΞᵀΛΞ) per layer block (without the scale c)."""
        out = []
        for i, c in enumerate(self.chain):
            var = c.row_basis.square() @ c.weights() @ c.col_basis.square().mT
            if i > 0:
                prev = self.chain[i - 1]
                assert prev.row_link is not None and prev.col_link is not None  # every block but the last
                p = prev.row_link.mT @ prev.row_basis
                q = prev.col_link.mT @ prev.col_basis
                var = var + p.square() @ prev.weights() @ q.square().mT
            out.append(var)
        return out

    def dense_covariance(self) -> Tensor:
        """Σ as a dense [k, k] float64 matrix over the flattened parameters (small models): Σ applied to
        every basis vector by the block formulas."""
        k = self.numel()
        _check_size(k, "BlockTridiagonalGaussian")
        sizes, shapes = [m.numel() for m in self.mean], [m.shape for m in self.mean]
        eye = torch.eye(k, dtype=torch.float64).split(sizes, dim=1)
        basis = [t.reshape(k, *s) for t, s in zip(eye, shapes, strict=True)]
        columns = precondition(self.chain, self._blocks(basis, (k,)))
        parts: list[Tensor] = [torch.empty(0)] * len(self.mean)
        for ls, block in zip(self.layers, columns, strict=True):
            for i, part in zip(ls, self._split(ls, block), strict=True):
                parts[i] = part
        cov = self.scale * flatten(parts, (k,))  # row j: (Σ e_j)ᵀ
        return 0.5 * (cov + cov.mT)

    # -- the GaussianPosterior interface -----------------------------------------------------------------
    def sample(self, n: int | None = None, generator: torch.Generator | None = None) -> list[Tensor]:
        """w = μ + √c ΞᵀRε. With ``n`` each tensor gets a leading dimension of size n."""
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"n must be a positive int or None, got {n!r}")
        lead = () if n is None else (n,)
        eps = [
            torch.randn((*lead, c.row_basis.shape[0], c.col_basis.shape[0]), generator=generator,
                        dtype=torch.float64)
            for c in self.chain
        ]  # fmt: skip
        draws = xi_t(self.chain, lam_sqrt(self.chain, eps))
        out: list[Tensor] = [torch.empty(0)] * len(self.mean)
        for ls, d in zip(self.layers, draws, strict=True):
            for i, part in zip(ls, self._split(ls, d * math.sqrt(self.scale)), strict=True):
                out[i] = (self.mean[i].double() + part).to(self.mean[i].dtype)
        return out

    def _logdet(self) -> Tensor:
        """log|Σ| = k log c + Σ_i log|Λ_i|."""
        total = torch.tensor(self.numel() * math.log(self.scale), dtype=torch.float64)
        for c in self.chain:
            rows, cols = c.row_basis.shape[0], c.col_basis.shape[0]
            log_k = cols * torch.linalg.slogdet(c.row_basis)[1] + rows * torch.linalg.slogdet(c.col_basis)[1]
            total = total + 2.0 * log_k + c.weights().log().sum()
        return total

    def _mahalanobis(self, diff: list[Tensor]) -> Tensor:
        """(w − μ)ᵀΣ⁻¹(w − μ) for per-layer blocks [*, o, d] of w − μ."""
        y = xi_t_solve(self.chain, diff)
        total: Tensor | float = 0.0
        for c, (ks_inv, ka_inv), yi in zip(self.chain, self._inverse_bases, y, strict=True):
            z = ks_inv @ yi @ ka_inv.mT
            total = total + (z.square() / c.weights()).sum(dim=(-2, -1))
        return torch.as_tensor(total / self.scale)

    def log_prob(self, sample: Sequence[Tensor]) -> Tensor:
        """log q(w): a scalar, or a vector of n values for a batch of n samples."""
        n = self._leading_dim(sample)
        lead = () if n is None else (n,)
        diff = self._blocks([s.double() - m.double() for s, m in zip(sample, self.mean, strict=True)], lead)
        return -0.5 * (self._mahalanobis(diff) + self._logdet() + self.numel() * LOG_2PI)

    def entropy(self) -> Tensor:
        """H[q] = ½[k(1 + log 2π) + log|Σ|]."""
        return 0.5 * (self.numel() * (1.0 + LOG_2PI) + self._logdet())

    def kl(self, other: GaussianPosterior) -> Tensor:
        r"""KL(self ‖ other) = ½[tr(Σ₂⁻¹Σ₁) + (μ₂−μ₁)ᵀΣ₂⁻¹(μ₂−μ₁) − k + log|Σ₂| − log|Σ₁|]: in closed form
        against a DiagonalGaussian over the same parameters (such as the prior), through dense matrices
        against other families (small models)."""
        if [m.shape for m in self.mean] != [m.shape for m in other.mean]:
            raise ValueError("the two posteriors cover parameters of different shapes")
        if not isinstance(other, DiagonalGaussian):
            return as_full(self).kl(other)
        total = torch.zeros((), dtype=torch.float64)
        for v1, m1, v2, m2 in zip(self._variance64, self.mean, other.variance, other.mean, strict=True):
            v1, m1, v2, m2 = v1.double(), m1.double(), v2.double(), m2.double()
            total = total + (v1 / v2 + (m2 - m1).square() / v2 + v2.log()).sum()
        return 0.5 * (total - self.numel() - self._logdet())

    def _file_tensors(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        tensors = {}
        for k, c in enumerate(self.chain):
            for f in CHAIN_FIELDS:
                if getattr(c, f) is not None:
                    tensors[f"chain.{k}.{f}"] = getattr(c, f)
        return tensors, {"layers": [list(ls) for ls in self.layers], "scale": self.scale}

    @classmethod
    def _from_file(
        cls, mean: list[Tensor], tensors: dict[str, Tensor], point: list[int], structure: dict[str, Any]
    ) -> BlockTridiagonalGaussian:
        layers, scale = structure.get("layers"), structure.get("scale")
        if not isinstance(layers, list) or not all(
            isinstance(ls, list) and ls and all(isinstance(i, int) and not isinstance(i, bool) for i in ls)
            for ls in layers
        ):
            raise ValueError("structure 'layers' must be a list of non-empty lists of parameter indices")
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale < math.inf:
            raise ValueError(f"structure 'scale' must be a finite number > 0, got {repr(scale)[:40]}")
        chain = []  # the bases and eigenvalues are required, the links to the next layer only before the last
        for k in range(len(layers)):
            fields = [tensors[f"chain.{k}.{f}"] for f in CHAIN_FIELDS[:4]]
            if k < len(layers) - 1:
                fields += [tensors[f"chain.{k}.{f}"] for f in CHAIN_FIELDS[4:]]
            chain.append(ChainLayer(*fields))
        for k, c in enumerate(chain):
            o, d = c.row_basis.shape[0], c.col_basis.shape[0]
            expected = {"row_basis": [o, o], "col_basis": [d, d], "row_eig": [o], "col_eig": [d]}
            if k < len(chain) - 1:
                nxt = chain[k + 1]
                expected |= {
                    "row_link": [o, nxt.row_basis.shape[0]], "col_link": [d, nxt.col_basis.shape[0]]
                }  # fmt: skip
            for f, shape in expected.items():
                if list(getattr(c, f).shape) != shape:
                    raise ValueError(f"chain.{k}.{f} has shape {list(getattr(c, f).shape)}, expected {shape}")
            if any(i >= len(mean) or i < 0 for i in layers[k]) or list(mean[layers[k][0]].shape[:1]) != [o]:
                raise ValueError(f"layer {k}: its first parameter is not a weight with {o} rows")
        return cls(mean, layers, chain, float(scale))

    def __repr__(self) -> str:
        return f"BlockTridiagonalGaussian({len(self.layers)} layers, {self.numel()} weights)"
