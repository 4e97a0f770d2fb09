r"""Damped Kronecker factors: the π split and the inverses noisy K-FAC needs (NNG eq. 13; K-FAC §6.3).

The posterior precision of a layer is :math:`\frac N\lambda(S\otimes A + \gamma I)`, which has no Kronecker
form. K-FAC's factored Tikhonov damping replaces it by

.. math::
    (S + \tfrac{\sqrt\gamma}{\pi} I) \otimes (A + \pi\sqrt\gamma\, I), \qquad
    \pi = \sqrt{\frac{\operatorname{tr}(A)/\dim A}{\operatorname{tr}(S)/\dim S}},

which keeps the γI term exactly and adds cross terms :math:`\sqrt\gamma(\pi^{-1}A\otimes I + \pi I\otimes S)`;
π is the split that minimises their norm bound. The split is invariant to rescaling A by c and S by 1/c.

Noisy K-FAC uses two dampings: γ_in = λ/(Nη) (the prior; it defines the posterior, so the samples) and
γ = γ_in + γ_ex (the update). From one factor X, :func:`damped_inverses` returns

* ``root``: B with :math:`BB^\top = (X + c_{in} I)^{-1}` (the inverse transpose of a Cholesky factor), so
  that :math:`B_S E B_A^\top` with standard-normal E has the matrix-variate covariance;
* ``inverse``: :math:`(X + c\,I)^{-1}`, for the preconditioned step :math:`S_\gamma^{-1} V A_\gamma^{-1}`.

Both come from Cholesky factorisations (a third of the work of an eigendecomposition); if one fails (a
factor that is not numerically PSD), an eigendecomposition with eigenvalues clamped at 0 is used instead.
Half-precision factors are handled in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def pi_split(a: Tensor, s: Tensor) -> Tensor:
    """π per group for factors a [G, dA, dA] and s [G, dS, dS]; 1 where a trace is not positive."""
    mean_a = a.diagonal(dim1=-2, dim2=-1).mean(-1)
    mean_s = s.diagonal(dim1=-2, dim2=-1).mean(-1)
    ok = (mean_a > 0) & (mean_s > 0)
    ratio = torch.where(ok, mean_a / torch.where(ok, mean_s, 1.0), 1.0)
    return ratio.sqrt()


@dataclass
class Factorisation:
    """A batch of damped factors X + cᵢ·I, Cholesky-factorised but not yet checked: no value has been read
    back, so the factorisations of every layer can be checked with one host read (:func:`all_succeeded`).

    The batch may stack the factors of several layers of one shape ([L·G, d, d]); :meth:`part` is one
    layer's slice, which checks its own success (a failed layer falls back alone)."""

    x: Tensor  # the symmetrised factors [G, d, d], in the working dtype
    dtype: torch.dtype  # the factors' own dtype (the results are cast back to it)
    dampings: tuple[Tensor, ...]  # each [G, 1, 1]
    chols: tuple[Tensor, ...]  # the Cholesky factor of X + c·I for each damping
    infos: tuple[Tensor, ...]  # cholesky_ex's info of each, [G]

    @property
    def ok(self) -> Tensor:
        """0-dim bool: every factorisation succeeded (a device flag, not read here)."""
        return torch.stack([(info == 0).all() for info in self.infos]).all()

    def part(self, start: int, stop: int) -> Factorisation:
        """The factorisations of matrices [start, stop) of the batch (one layer's), bitwise as if factorised
        alone: cholesky_ex factorises each matrix of a batch on its own. Copies, not views: LAPACK's
        triangular solve rounds differently for a matrix at an unaligned address (measured: 17×17 float32),
        and a fresh tensor is aligned as the layer's own factor was."""
        return Factorisation(
            self.x[start:stop].clone(),
            self.dtype,
            tuple(c[start:stop] for c in self.dampings),
            tuple(c[start:stop].clone() for c in self.chols),
            tuple(i[start:stop] for i in self.infos),
        )


def factorise(x: Tensor, *dampings: Tensor) -> Factorisation:
    """Cholesky factorisations of X + c·I for a batch x [G, d, d] of PSD matrices and each damping c [G] > 0
    (half-precision factors in float32), with their success as a device flag."""
    dtype = x.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    x = x.to(work)
    x = 0.5 * (x + x.mT)
    eye = torch.eye(x.shape[-1], dtype=work, device=x.device)
    cs = tuple(c.to(work)[:, None, None] for c in dampings)
    chols, infos = zip(*(torch.linalg.cholesky_ex(x + c * eye) for c in cs), strict=True)
    return Factorisation(x, dtype, cs, chols, infos)


def all_succeeded(factorisations: list[Factorisation]) -> bool:
    """Whether every factorisation succeeded: one host read for all of them (an inversion step's only one)."""
    if not factorisations:
        return True
    return not bool(torch.cat([info for f in factorisations for info in f.infos]).any())  # infos are [G]


def roots_and_inverse(f: Factorisation, ok: bool | None = None) -> tuple[Tensor, Tensor]:
    """(B, (X + c_inverse·I)⁻¹) from ``factorise(x, c_root, c_inverse)``: B is the inverse transpose of the
    Cholesky factor, BBᵀ = (X + c_root·I)⁻¹. ``ok`` is the factorisations' success if already read (else
    read here); on failure the clamped eigendecomposition is used instead."""
    (c_root, c_inverse), (chol_root, chol_inv) = f.dampings, f.chols
    if ok or bool(f.ok):  # a failed batch reads each factorisation's own flag
        eye = torch.eye(f.x.shape[-1], dtype=f.x.dtype, device=f.x.device)
        root = torch.linalg.solve_triangular(chol_root.mT, eye.expand_as(f.x), upper=True)
        inverse = torch.cholesky_inverse(chol_inv)
    else:
        evals, evecs = torch.linalg.eigh(f.x)
        evals = evals.clamp(min=0).unsqueeze(-2)
        root = evecs * (evals + c_root).rsqrt()
        inverse = (evecs / (evals + c_inverse)) @ evecs.mT
    return root.to(f.dtype), inverse.to(f.dtype)


def inverse(f: Factorisation, ok: bool | None = None) -> Tensor:
    """(X + c·I)⁻¹ from ``factorise(x, c)`` (``ok`` as for :func:`roots_and_inverse`)."""
    (c,), (chol,) = f.dampings, f.chols
    if ok or bool(f.ok):
        return torch.cholesky_inverse(chol).to(f.dtype)
    evals, evecs = torch.linalg.eigh(f.x)
    return ((evecs / (evals.clamp(min=0).unsqueeze(-2) + c)) @ evecs.mT).to(f.dtype)


def damped_inverses(x: Tensor, c_root: Tensor, c_inverse: Tensor) -> tuple[Tensor, Tensor]:
    """(B, (X + c_inverse·I)⁻¹) for a batch x [G, d, d] of PSD matrices; c_* are [G] dampings > 0.

    B is the inverse transpose of the Cholesky factor of X + c_root·I, so BBᵀ = (X + c_root·I)⁻¹ (the
    sampling root); where a factorisation fails, the clamped eigendecomposition is used instead.

    Args:
        x: PSD matrices [G, d, d].
        c_root: the dampings [G] of the sampling root.
        c_inverse: the dampings [G] of the inverse.
    """
    return roots_and_inverse(factorise(x, c_root, c_inverse))


def damped_inverse(x: Tensor, c: Tensor) -> Tensor:
    """(X + c·I)⁻¹ alone, for a batch x [G, d, d] of PSD matrices and dampings c [G] > 0 (K-FAC's update
    needs no sampling root): one Cholesky factorisation, or the clamped eigendecomposition if it fails."""
    return inverse(factorise(x, c))
