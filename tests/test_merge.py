"""``ngvi.merge`` against the truth: exact posteriors of Bayesian linear regression on disjoint splits, and
the nearest Kronecker product by brute force (a dense SVD of the rearranged sum)."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import ngvi
from conftest import fit_full_batch_regression
from ngvi.baselines.exact import linear_regression_mean_field, linear_regression_posterior
from ngvi.merge import nearest_kronecker
from ngvi.posterior import KroneckerBlock, dense_covariance, flatten

TAU, LAM = 2.0, 0.5


def _data(n: int = 300, d: int = 4, seed: int = 0, correlated: bool = True):
    gen = torch.Generator().manual_seed(seed)
    mix = torch.eye(d) + (0.6 * torch.randn(d, d, generator=gen) if correlated else 0)
    x = (torch.randn(n, d, generator=gen) @ mix).double()
    y = x @ torch.randn(d, generator=gen).double() + torch.randn(n, generator=gen).double() / TAU**0.5
    return x, y


def _splits(x, y, k: int):
    return [(x[i::k], y[i::k]) for i in range(k)]


def test_merging_exact_full_posteriors_of_disjoint_splits_is_the_joint_posterior():
    """Πₖ qₖ / p^{K−1} is Bayes' rule: to round-off (1e-10 relative) for K = 4 splits."""
    x, y = _data()
    parts = []
    for xs, ys in _splits(x, y, 4):
        mean, cov = linear_regression_posterior(xs, ys, TAU, LAM)
        parts.append(ngvi.FullGaussian([mean], cov))
    merged = ngvi.merge(parts, prior=LAM)
    mean, cov = linear_regression_posterior(x, y, TAU, LAM)
    torch.testing.assert_close(merged.mean[0], mean, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(merged.covariance, cov, rtol=1e-10, atol=1e-12)


def test_merging_nng_full_posteriors_fitted_on_disjoint_splits_reaches_the_joint_posterior():
    """NNG-full (true Fisher) fitted on each of two halves under N(0, ηI), merged with the prior counted
    once: the joint exact posterior, covariance within 10% (relative Frobenius) and mean within 0.15
    posterior s.d. (measured: 0.75% and 0.043 s.d.; each fit alone is held to 10% and 0.1 s.d. in
    tests/optim/test_nng.py)."""
    x, y = _data(n=200)
    prior_var = 10.0
    posts = []
    for xs, ys in _splits(x, y, 2):
        make = functools.partial(
            ngvi.NNGFull, data_size=len(xs), lr=0.5, beta=0.02, prior_var=prior_var, damping=0.0, mc_samples=2
        )
        posts.append(fit_full_batch_regression(make, xs, ys[:, None], TAU, steps=300, decay=0.98))
    merged = ngvi.merge(posts, prior=1 / prior_var)
    xb = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    mean, cov = linear_regression_posterior(xb, y, TAU, 1 / prior_var)
    assert (merged.covariance - cov).norm() / cov.norm() < 0.1
    assert ((flatten(merged.mean) - mean).abs() / cov.diagonal().sqrt()).max() < 0.15


def test_merging_mean_field_posteriors_is_exact_in_the_precision_and_approximate_in_the_mean():
    """Mean-field optima of the splits: the merged precision is the joint mean-field precision diag(P) to
    round-off; the mean is the per-weight precision-weighted average, which is the joint mean for
    uncorrelated (orthogonal) features and off by a measured amount for correlated ones."""
    x, y = _data()
    parts = [linear_regression_mean_field(xs, ys, TAU, LAM) for xs, ys in _splits(x, y, 3)]
    merged = ngvi.merge(parts, prior=LAM)
    joint = linear_regression_mean_field(x, y, TAU, LAM)
    torch.testing.assert_close(merged.variance[0], joint.variance[0], rtol=1e-10, atol=0)
    precision = sum(1 / q.variance[0] for q in parts) - 2 * LAM  # the prior counted once
    stated = sum(q.mean[0] / q.variance[0] for q in parts) / precision
    torch.testing.assert_close(merged.mean[0], stated, rtol=1e-12, atol=1e-12)
    off = ((merged.mean[0] - joint.mean[0]).abs() / joint.variance[0].sqrt()).max()
    assert off > 0.1  # correlated features: the diagonal merge is not the joint mean (here by > 0.1 s.d.)

    # orthogonal columns in every split: each XₖᵀXₖ is diagonal, so is the joint XᵀX, and the merge is the
    # joint posterior, mean included
    gen = torch.Generator().manual_seed(1)
    scales = torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=torch.float64)
    splits = [
        (torch.linalg.qr(torch.randn(100, 4, generator=gen).double())[0] * scales, ys)
        for _, ys in _splits(x, y, 3)
    ]
    parts = [linear_regression_mean_field(xs, ys, TAU, LAM) for xs, ys in splits]
    merged = ngvi.merge(parts, prior=LAM)
    mean, cov = linear_regression_posterior(
        torch.cat([xs for xs, _ in splits]), torch.cat([ys for _, ys in splits]), TAU, LAM
    )
    torch.testing.assert_close(merged.mean[0], mean, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(merged.variance[0], cov.diagonal(), rtol=1e-10, atol=1e-14)


def _kron_posterior(mean: torch.Tensor, row_prec: torch.Tensor, col_prec: torch.Tensor):
    block = KroneckerBlock((0,), torch.linalg.inv(row_prec)[None], torch.linalg.inv(col_prec)[None])
    return ngvi.KroneckerGaussian([mean], [block])


def _spd(n: int, gen: torch.Generator) -> torch.Tensor:
    a = torch.randn(n, n, generator=gen).double()
    return a @ a.T + n * torch.eye(n, dtype=torch.float64)


def test_kronecker_merge_is_exact_for_shared_factors_and_the_nearest_kronecker_product_otherwise():
    gen = torch.Generator().manual_seed(0)
    r, c = 3, 4
    row, col = _spd(r, gen), _spd(c, gen)
    means = [torch.randn(r, c, generator=gen).double() for _ in range(3)]
    # shared factors up to scale: Σ sₖ U⁻¹⊗V⁻¹ − 2λI is not Kronecker once λ ≠ 0, so check with λ → none
    parts = [_kron_posterior(m, s * row, col) for m, s in zip(means, (1.0, 2.0, 0.5), strict=True)]
    merged = ngvi.merge(parts)
    prec = sum(torch.kron(s * row, col) for s in (1.0, 2.0, 0.5))
    info = sum(torch.kron(s * row, col) @ m.reshape(-1) for m, s in zip(means, (1.0, 2.0, 0.5), strict=True))
    torch.testing.assert_close(dense_covariance(merged), torch.linalg.inv(prec), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(
        merged.mean[0].reshape(-1), torch.linalg.solve(prec, info), rtol=1e-10, atol=1e-12
    )

    # distinct factors and an isotropic prior subtracted twice: the precision is the Frobenius-nearest
    # Kronecker product (brute force: the dense rearranged sum's leading singular pair), the mean solves it
    rows, cols = (
        [_spd(r, gen) + 5 * torch.eye(r, dtype=torch.float64) for _ in range(3)],
        [_spd(c, gen) for _ in range(3)],
    )
    parts = [_kron_posterior(m, u, v) for m, u, v in zip(means, rows, cols, strict=True)]
    merged = ngvi.merge(parts, prior=LAM)
    exact = sum(torch.kron(u, v) for u, v in zip(rows, cols, strict=True)) - 2 * LAM * torch.eye(
        r * c, dtype=torch.float64
    )
    rearranged = exact.reshape(r, c, r, c).permute(0, 2, 1, 3).reshape(r * r, c * c)
    u_, s_, vh_ = torch.linalg.svd(rearranged)
    brute = torch.kron((u_[:, 0] * s_[0]).reshape(r, r), vh_[0].reshape(c, c))
    approx = torch.linalg.inv(dense_covariance(merged))
    torch.testing.assert_close(approx, brute, rtol=1e-8, atol=1e-8)
    info = sum(torch.kron(u, v) @ m.reshape(-1) for m, u, v in zip(means, rows, cols, strict=True))
    torch.testing.assert_close(
        merged.mean[0].reshape(-1), torch.linalg.solve(brute, info), rtol=1e-8, atol=1e-8
    )
    rel = (approx - exact).norm() / exact.norm()
    assert rel < 0.1  # how far the Kronecker approximation is from the exact sum here (measured 0.047)


def test_nearest_kronecker_of_one_product_is_that_product():
    gen = torch.Generator().manual_seed(3)
    a, b = _spd(2, gen), _spd(3, gen)
    a2, b2 = nearest_kronecker([a], [b], [1.0])
    torch.testing.assert_close(torch.kron(a2, b2), torch.kron(a, b), rtol=1e-10, atol=1e-10)


def test_a_merged_posterior_predicts_saves_and_is_a_prior(tmp_path):
    """The merge of two optimizers' posteriors (with names) goes to ngvi.PosteriorSampler + predict,
    save/load, and set_prior; mismatched inputs are refused in one line."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    posts = []
    for seed in (0, 1):
        opt = ngvi.Vadam(model.parameters(), 50, seed=seed)
        posts.append(ngvi.posterior_of(model, opt))
    merged = ngvi.merge(posts, prior=1.0)
    assert merged.names == posts[0].names
    out = ngvi.predict(model, ngvi.PosteriorSampler(model, merged, seed=0), torch.randn(5, 3), samples=4)
    assert out.shape == (4, 5, 2)
    back = ngvi.load_posterior(merged.save(tmp_path / "m.safetensors"), model)
    torch.testing.assert_close(back.mean[0], merged.mean[0])
    opt = ngvi.Vadam(model.parameters(), 50, seed=0)
    opt.set_prior(back, model=model)
    with pytest.raises(ValueError, match="other shapes"):
        ngvi.merge([posts[0], ngvi.DiagonalGaussian(posts[0].mean[:2], posts[0].variance[:2])])
    with pytest.raises(TypeError, match="one family"):
        ngvi.merge([posts[0], ngvi.FullGaussian([m.reshape(-1) for m in posts[0].mean][:1], torch.eye(12))])
    with pytest.raises(ValueError, match="not positive"):
        ngvi.merge(posts, prior=1e6)
