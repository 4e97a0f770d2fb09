r"""Precision-weighted merging of K posteriors of one model fitted apart (``ngvi.merge``).

If K posteriors qₖ ∝ p(θ)·p(Dₖ|θ) were fitted on disjoint data Dₖ under the same prior p, Bayes' rule gives
the posterior of all the data as Πₖ qₖ / p^{K−1}. For Gaussians this is exact in natural parameters:

.. math::
    P = \textstyle\sum_k P_k - c\,P_0,\qquad
    P\mu = \textstyle\sum_k P_k\mu_k - c\,P_0\mu_0,

with c = K − 1 (the prior counted once; ``prior_count`` says otherwise, ``prior=None`` subtracts nothing).
It is the combination of Daheim et al. (2024) and of the IVON paper's merging of fine-tunes.

**Full** (:class:`~ngvi.FullGaussian`): dense Pₖ; exact where each qₖ is the exact posterior of its part
(Bayesian linear regression: the joint posterior, tests/test_merge.py).

**Diagonal** (:class:`~ngvi.DiagonalGaussian`): Pₖ = diag(1/σₖ²), weight by weight. Each mean-field qₖ
keeps only the diagonal of its precision, so the merged mean Σ Pₖμₖ / P is a per-weight precision-weighted
average: it equals the joint mean where the data's precisions are diagonal (uncorrelated features) and is
otherwise an approximation whose error the tests measure; the merged precision is the joint mean-field
precision exactly when each qₖ is its part's mean-field optimum (both are diag(XᵀX)-sums plus the prior).

**Kronecker** (:class:`~ngvi.KroneckerGaussian`, one block per layer, Pₖ = Uₖ⁻¹ ⊗ Vₖ⁻¹): a sum of
Kronecker products is not one. The information vector Σ Pₖμₖ − cP₀μ₀ = Σ vec(Uₖ⁻¹MₖVₖ⁻¹) − cλ vec(M₀) is
summed exactly; the precision sum is replaced by its nearest Kronecker product A ⊗ B in the Frobenius norm
(Van Loan & Pitsianis 1993: the leading singular pair of the rearranged sum, found from the K + 1 factor
pairs without forming any rc × rc matrix), and the mean is (A ⊗ B)⁻¹ times that information vector. This
is exact where the K precisions (and the prior) share their factors up to scale; the prior must then be
isotropic, N(m₀, I/λ) (a number λ, or an isotropic DiagonalGaussian), whose precision λI = (√λ I) ⊗ (√λ I)
is itself Kronecker. A merged precision that is not positive definite (the prior subtracted more often
than the data added) is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .posterior import (
    DiagonalGaussian,
    FullGaussian,
    GaussianPosterior,
    KroneckerBlock,
    KroneckerGaussian,
    flatten,
    unflatten,
)

__all__ = ["merge", "nearest_kronecker"]


def merge(
    posteriors: Sequence[GaussianPosterior],
    prior: GaussianPosterior | float | None = None,
    *,
    prior_count: float | None = None,
) -> GaussianPosterior:
    """The precision-weighted combination of ``posteriors`` (the module docstring gives the maths).

    Args:
        posteriors: K ≥ 1 posteriors of one family over parameters of the same shapes (diagonal, full or
            Kronecker with the same blocks).
        prior: the prior they were all fitted under: a number λ for N(0, I/λ), a posterior (a
            DiagonalGaussian, or a FullGaussian for the full family), or None to subtract nothing.
        prior_count: how many times the prior is subtracted (default K − 1: Bayes' rule).

    Returns:
        A posterior of the same family, in float64, with the names of the inputs (when they agree), which
        :func:`ngvi.predict` (through :class:`ngvi.PosteriorSampler`), :func:`ngvi.save_posterior` / ``save``
        and ``opt.set_prior`` accept.
    """
    posteriors = list(posteriors)
    if not posteriors or not all(isinstance(q, GaussianPosterior) for q in posteriors):
        raise TypeError("merge takes a non-empty list of posteriors (opt.posterior(), ngvi.load_posterior)")
    kinds = {type(q) for q in posteriors}
    if len(kinds) != 1:
        raise TypeError(
            f"merge: the posteriors must be of one family, got {sorted(k.__name__ for k in kinds)}"
        )
    shapes = [tuple(m.shape) for m in posteriors[0].mean]
    for k, q in enumerate(posteriors[1:], 1):
        if [tuple(m.shape) for m in q.mean] != shapes:
            raise ValueError(f"merge: posterior {k} covers parameters of other shapes than posterior 0")
        if q.point != posteriors[0].point:
            raise ValueError(f"merge: posterior {k} has other point estimates than posterior 0")
    count = float(len(posteriors) - 1) if prior_count is None else float(prior_count)
    if prior is None:
        count = 0.0
    family = posteriors[0]
    if isinstance(family, DiagonalGaussian):
        out = _merge_diagonal(posteriors, _diagonal_prior(prior, family), count)
    elif isinstance(family, FullGaussian):
        out = _merge_full(posteriors, prior, count)
    elif isinstance(family, KroneckerGaussian):
        out = _merge_kronecker(posteriors, prior, count)
    else:
        raise TypeError(
            f"merge: the {type(family).__name__} family is not supported (diagonal, full, Kronecker)"
        )
    names = [q.names for q in posteriors]
    if names[0] and all(n == names[0] for n in names):
        out.annotate(names=names[0], rule=family.rule)
    return out


def _diagonal_prior(prior: Any, like: GaussianPosterior) -> tuple[list[Tensor], list[Tensor]] | None:
    """(mean, precision) per tensor of a scalar or diagonal prior, float64; None for no prior."""
    if prior is None:
        return None
    if isinstance(prior, int | float) and not isinstance(prior, bool):
        if not prior > 0:
            raise ValueError(f"merge: a prior precision must be positive, got {prior}")
        return [torch.zeros_like(m, dtype=torch.float64) for m in like.mean], [
            torch.full_like(m, float(prior), dtype=torch.float64) for m in like.mean
        ]
    if not isinstance(prior, DiagonalGaussian):
        raise TypeError(
            f"merge: prior must be a number, a DiagonalGaussian or None, got {type(prior).__name__}"
        )
    if [m.shape for m in prior.mean] != [m.shape for m in like.mean]:
        raise ValueError("merge: the prior covers parameters of other shapes than the posteriors")
    return [m.double() for m in prior.mean], [
        torch.zeros_like(v, dtype=torch.float64) if i in prior.point else v.double().reciprocal()
        for i, v in enumerate(prior.variance)
    ]


def _merge_diagonal(
    posteriors: list[GaussianPosterior], prior: tuple[list[Tensor], list[Tensor]] | None, count: float
) -> DiagonalGaussian:
    point = posteriors[0].point
    means, variances = [], []
    for i in range(len(posteriors[0].mean)):
        if i in point:  # a point estimate: the plain average of the means, variance 0
            means.append(sum(q.mean[i].double() for q in posteriors) / len(posteriors))
            variances.append(torch.zeros_like(means[-1]))
            continue
        prec = sum(q.variance[i].double().reciprocal() for q in posteriors)
        info = sum(q.mean[i].double() / q.variance[i].double() for q in posteriors)
        if prior is not None:
            prec = prec - count * prior[1][i]
            info = info - count * prior[1][i] * prior[0][i]
        if not bool((prec > 0).all()):
            raise ValueError(
                f"merge: the merged precision of tensor {i} is not positive (the prior subtracted "
                f"{count:g} times outweighs the posteriors' data): check prior= and prior_count="
            )
        means.append(info / prec)
        variances.append(prec.reciprocal())
    return DiagonalGaussian(means, variances, point=point)


def _merge_full(posteriors: list[GaussianPosterior], prior: Any, count: float) -> FullGaussian:
    precs = [q.precision for q in posteriors]
    prec = sum(precs)
    info = sum(p @ flatten([m.double() for m in q.mean]) for p, q in zip(precs, posteriors, strict=True))
    if prior is not None and count:
        k = prec.shape[0]
        if isinstance(prior, FullGaussian):
            p0, m0 = prior.precision, flatten([m.double() for m in prior.mean])
        else:
            m0_list, p0_list = _diagonal_prior(prior, posteriors[0])
            p0, m0 = torch.diag(flatten(p0_list)), flatten(m0_list)
        if p0.shape != (k, k):
            raise ValueError("merge: the prior covers parameters of other shapes than the posteriors")
        prec = prec - count * p0
        info = info - count * (p0 @ m0)
    chol, bad = torch.linalg.cholesky_ex(0.5 * (prec + prec.mT))
    if int(bad) != 0:
        raise ValueError(
            "merge: the merged precision is not positive definite: check prior= and prior_count="
        )
    mean = torch.cholesky_solve(info[:, None], chol)[:, 0]
    shapes = [m.shape for m in posteriors[0].mean]
    return FullGaussian(unflatten(mean, shapes), torch.cholesky_inverse(chol))


def nearest_kronecker(
    lefts: Sequence[Tensor], rights: Sequence[Tensor], weights: Sequence[float]
) -> tuple[Tensor, Tensor]:
    r"""(A, B) minimising ‖Σₖ wₖ Lₖ ⊗ Rₖ − A ⊗ B‖_F (Van Loan & Pitsianis): the rearrangement maps
    Lₖ ⊗ Rₖ to vec(Lₖ)vec(Rₖ)ᵀ, so the sum is 𝓛 diag(w) 𝓡ᵀ of rank ≤ K and its leading singular pair is
    found from QR factors of 𝓛 [r², K] and 𝓡 [c², K] and the SVD of a K × K matrix. The sign is chosen so
    that A's trace is positive; A and B are symmetrised. Float64."""
    left = torch.stack([x.double().reshape(-1) for x in lefts], 1)
    right = torch.stack([x.double().reshape(-1) for x in rights], 1)
    q_l, r_l = torch.linalg.qr(left)
    q_r, r_r = torch.linalg.qr(right)
    core = r_l @ torch.diag(torch.tensor(list(weights), dtype=torch.float64)) @ r_r.mT
    u, s, vh = torch.linalg.svd(core)
    a = (q_l @ u[:, 0]) * s[0].sqrt()
    b = (q_r @ vh[0]) * s[0].sqrt()
    r, c = lefts[0].shape[-1], rights[0].shape[-1]
    a, b = a.reshape(r, r), b.reshape(c, c)
    if a.trace() < 0:
        a, b = -a, -b
    return 0.5 * (a + a.mT), 0.5 * (b + b.mT)


def _isotropic_prior(prior: Any, like: GaussianPosterior) -> tuple[float, list[Tensor]]:
    """(λ, m₀) of an isotropic prior N(m₀, I/λ) (Kronecker merging needs its precision to be Kronecker)."""
    if isinstance(prior, int | float) and not isinstance(prior, bool):
        return float(prior), [torch.zeros_like(m, dtype=torch.float64) for m in like.mean]
    if isinstance(prior, DiagonalGaussian) and not prior.point:
        values = torch.cat([v.double().reshape(-1) for v in prior.variance])
        if bool((values == values[0]).all()):
            return 1.0 / float(values[0]), [m.double() for m in prior.mean]
    raise TypeError(
        "merge: Kronecker posteriors take an isotropic prior N(m0, I/lambda) (a number, or a "
        "DiagonalGaussian with one variance), whose precision is itself a Kronecker product"
    )


def _merge_kronecker(posteriors: list[GaussianPosterior], prior: Any, count: float) -> KroneckerGaussian:
    first = posteriors[0]
    for k, q in enumerate(posteriors[1:], 1):
        if [b.params for b in q.blocks] != [b.params for b in first.blocks]:
            raise ValueError(f"merge: posterior {k} has other Kronecker blocks than posterior 0")
    lam, m0 = _isotropic_prior(prior, first) if prior is not None and count else (0.0, None)
    means = [sum(q.mean[i].double() for q in posteriors) / len(posteriors) for i in range(len(first.mean))]
    blocks = []
    for j, block in enumerate(first.blocks):
        groups, r = block.row_cov.shape[:2]
        c = block.col_cov.shape[1]
        rows_out, cols_out, mean_blocks = [], [], []
        for g in range(groups):
            lefts = [torch.linalg.inv(q.blocks[j].row_cov[g].double()) for q in posteriors]
            rights = [torch.linalg.inv(q.blocks[j].col_cov[g].double()) for q in posteriors]
            info = sum(
                lft @ q._join(q.blocks[j], [q.mean[i].double() for i in block.params], ())[g] @ rgt
                for lft, rgt, q in zip(lefts, rights, posteriors, strict=True)
            )
            weights = [1.0] * len(posteriors)
            if lam:
                root = lam**0.5
                lefts.append(torch.eye(r, dtype=torch.float64) * root)
                rights.append(torch.eye(c, dtype=torch.float64) * root)
                weights.append(-count)
                info = info - count * lam * first._join(block, [m0[i] for i in block.params], ())[g]
            a, b = nearest_kronecker(lefts, rights, weights)
            chol_a, bad_a = torch.linalg.cholesky_ex(a)
            chol_b, bad_b = torch.linalg.cholesky_ex(b)
            if int(bad_a) or int(bad_b):
                raise ValueError(
                    f"merge: the merged Kronecker precision of block {j} is not positive definite: check "
                    "prior= and prior_count="
                )
            mean = torch.cholesky_solve(torch.cholesky_solve(info, chol_a).mT, chol_b).mT  # A⁻¹ N B⁻¹
            rows_out.append(torch.cholesky_inverse(chol_a))
            cols_out.append(torch.cholesky_inverse(chol_b))
            mean_blocks.append(mean)
        joined = torch.stack(mean_blocks)
        for i, part in zip(block.params, first._split(block, joined), strict=True):
            means[i] = part
        blocks.append(KroneckerBlock(block.params, torch.stack(rows_out), torch.stack(cols_out)))
    return KroneckerGaussian(means, blocks, point=first.point)
