"""The posterior families against torch.distributions (independent implementations of the same densities):
DiagonalGaussian against Normal, KroneckerGaussian against a dense MultivariateNormal of the same blocks."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import MultivariateNormal, Normal, kl_divergence

import ngvi
from ngvi import DiagonalGaussian, KroneckerGaussian
from ngvi.posterior import KroneckerBlock


# ------------------------------------------------------------------------------------------------------------
# DiagonalGaussian
# ------------------------------------------------------------------------------------------------------------
def posterior(seed=0):
    gen = torch.Generator().manual_seed(seed)
    mean = [
        torch.randn(3, 2, generator=gen, dtype=torch.float64),
        torch.randn(4, generator=gen, dtype=torch.float64),
    ]
    var = [
        torch.rand(3, 2, generator=gen, dtype=torch.float64) + 0.1,
        torch.rand(4, generator=gen, dtype=torch.float64) + 0.1,
    ]
    return ngvi.DiagonalGaussian(mean, var)


def reference(q):
    return [Normal(m, v.sqrt()) for m, v in zip(q.mean, q.variance, strict=True)]


def test_log_prob_entropy_kl_match_torch_distributions():
    q, r = posterior(0), posterior(1)
    x = q.sample(generator=torch.Generator().manual_seed(5))
    expected = sum(d.log_prob(t).sum() for d, t in zip(reference(q), x, strict=True))
    torch.testing.assert_close(q.log_prob(x), expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(q.entropy(), sum(d.entropy().sum() for d in reference(q)), rtol=1e-12, atol=0)
    expected_kl = sum(kl_divergence(a, b).sum() for a, b in zip(reference(q), reference(r), strict=True))
    torch.testing.assert_close(q.kl(r), expected_kl, rtol=1e-12, atol=0)
    assert float(q.kl(q)) == pytest.approx(0.0, abs=1e-12)


def test_batched_samples_and_log_prob():
    q = posterior()
    xs = q.sample(7)
    assert [t.shape for t in xs] == [(7, 3, 2), (7, 4)]
    lp = q.log_prob(xs)
    assert lp.shape == (7,)
    torch.testing.assert_close(lp[3], q.log_prob([t[3] for t in xs]))
    assert [t.shape for t in q.sample()] == [(3, 2), (4,)]


def test_sample_moments():
    q = posterior()
    xs = q.sample(20000, generator=torch.Generator().manual_seed(0))
    for x, m, v in zip(xs, q.mean, q.variance, strict=True):
        se = (v / 20000).sqrt()
        assert ((x.mean(0) - m).abs() < 5 * se).all()
        assert ((x.var(0) / v - 1).abs() < 5 * (2 / 20000) ** 0.5).all()


def test_snr_std_precision():
    q = posterior()
    for snr, m, v in zip(q.snr(), q.mean, q.variance, strict=True):
        torch.testing.assert_close(snr, m.abs() / v.sqrt())
    for p, v in zip(q.precision, q.variance, strict=True):
        torch.testing.assert_close(p, 1 / v)


def test_isotropic_prior_and_kl_to_prior():
    q = posterior()
    prior = ngvi.DiagonalGaussian.isotropic(q.mean, precision=2.0)
    # KL(q‖N(0, I/λ)) = ½ Σ [λσ² + λμ² − 1 − log(λσ²)]
    lam = 2.0
    expected = sum(
        0.5 * (lam * v + lam * m**2 - 1 - torch.log(lam * v)).sum()
        for m, v in zip(q.mean, q.variance, strict=True)
    )
    torch.testing.assert_close(q.kl(prior), expected)


def test_symmetric_kl_matches_the_dense_formula():
    """ngvi.symmetric_kl = ½[KL(p‖q) + KL(q‖p)] against the general Gaussian KL of Khan et al.'s KL.m,
    ½[tr(Σ₁⁻¹Σ₀) + (μ₁−μ₀)ᵀΣ₁⁻¹(μ₁−μ₀) − k − log det(Σ₁⁻¹Σ₀)], on dense diagonal covariances; it is
    symmetric, zero for a posterior and its copy, and refuses what is not a posterior."""
    p, q = posterior(0), posterior(1)

    def dense_kl(a, b):
        m0, m1 = torch.cat([m.flatten() for m in a.mean]), torch.cat([m.flatten() for m in b.mean])
        s0, s1 = (
            torch.diag(torch.cat([v.flatten() for v in a.variance])),
            torch.diag(torch.cat([v.flatten() for v in b.variance])),
        )
        ratio = torch.linalg.solve(s1, s0)
        d = m1 - m0
        return 0.5 * (torch.trace(ratio) + d @ torch.linalg.solve(s1, d) - len(d) - torch.logdet(ratio))

    expected = 0.5 * (dense_kl(p, q) + dense_kl(q, p))
    torch.testing.assert_close(ngvi.symmetric_kl(p, q), expected, rtol=1e-12, atol=0.0)
    torch.testing.assert_close(ngvi.symmetric_kl(q, p), expected, rtol=1e-12, atol=0.0)
    assert ngvi.symmetric_kl(p, posterior(0)).item() == 0.0
    with pytest.raises(TypeError, match="GaussianPosterior"):
        ngvi.symmetric_kl(p, p.mean)


def test_bad_inputs():
    q = posterior()
    with pytest.raises(ValueError, match="positive"):
        ngvi.DiagonalGaussian([torch.zeros(2)], [torch.tensor([1.0, 0.0])])
    with pytest.raises(ValueError, match="shape"):
        ngvi.DiagonalGaussian([torch.zeros(2)], [torch.ones(3)])
    with pytest.raises(ValueError, match="expected"):
        q.log_prob([torch.zeros(3, 3), torch.zeros(4)])
    with pytest.raises(ValueError, match="tensors"):
        q.log_prob([torch.zeros(3, 2)])
    with pytest.raises(ValueError, match="n must be"):
        q.sample(0)


def test_posterior_is_a_snapshot():
    model = torch.nn.Linear(2, 1)
    opt = ngvi.Vadam(model.parameters(), data_size=10, init_prec=30.0)
    post = opt.posterior()
    with torch.no_grad():
        model.weight.add_(1.0)
    assert not torch.equal(post.mean[0], model.weight)
    assert post.variance[0].shape == model.weight.shape
    torch.testing.assert_close(post.variance[0], torch.full((1, 2), 1 / 30.0))


# ------------------------------------------------------------------------------------------------------------
# KroneckerGaussian
# ------------------------------------------------------------------------------------------------------------
def spd(g: int, n: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(g, n, n, generator=gen, dtype=torch.float64)
    return x @ x.mT / n + 0.3 * torch.eye(n, dtype=torch.float64)


def kronecker_example(seed: int = 0) -> tuple[KroneckerGaussian, torch.Tensor, torch.Tensor]:
    """Two blocks: a Linear (weight [3, 4] + bias [3]) and a 2-group conv (weight [4, 1, 2, 2] + bias [4]),
    with the parameter order interleaved; returns the posterior, its dense mean and covariance."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (4, 1, 2, 2), (3,), (4,)]
    mean = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    blocks = [
        KroneckerBlock((0, 2), spd(1, 3, gen), spd(1, 5, gen)),
        KroneckerBlock((1, 3), spd(2, 2, gen), spd(2, 5, gen)),
    ]
    post = KroneckerGaussian(mean, blocks)
    # Dense reference: the flat index of every weight, laid out like the block, then Cov = U_g[i,k] V_g[j,l].
    offsets = torch.tensor([0, *torch.cumsum(torch.tensor([m.numel() for m in mean]), 0).tolist()])
    index = [torch.arange(offsets[i], offsets[i + 1]).reshape(m.shape) for i, m in enumerate(mean)]
    dim = int(offsets[-1])
    cov = torch.zeros(dim, dim, dtype=torch.float64)
    for b in blocks:
        g, r = b.row_cov.shape[:2]
        idx = torch.cat([index[i].reshape(g, r, -1) for i in b.params], dim=-1)
        for k in range(g):
            flat = idx[k].reshape(-1)
            cov[flat[:, None], flat[None, :]] = torch.kron(b.row_cov[k], b.col_cov[k])
    return post, torch.cat([m.reshape(-1) for m in mean]), cov


def flat(tensors, batched=False):
    return torch.cat([t.reshape(t.shape[0], -1) if batched else t.reshape(-1) for t in tensors], -1)


def test_marginal_variances_and_densities_match_the_dense_gaussian():
    post, mean, cov = kronecker_example()
    dense = MultivariateNormal(mean, cov)
    torch.testing.assert_close(flat(post.variance), cov.diagonal())
    torch.testing.assert_close(post.entropy(), dense.entropy())
    draws = post.sample(5, generator=torch.Generator().manual_seed(1))
    assert [d.shape[1:] for d in draws] == [m.shape for m in post.mean]
    torch.testing.assert_close(post.log_prob(draws), dense.log_prob(flat(draws, batched=True)))
    one = post.sample()
    assert [d.shape for d in one] == [m.shape for m in post.mean]
    torch.testing.assert_close(post.log_prob(one), dense.log_prob(flat(one)))
    torch.testing.assert_close(flat(post.snr()), mean.abs() / cov.diagonal().sqrt())


def test_samples_have_the_kronecker_covariance():
    post, mean, cov = kronecker_example(seed=2)
    draws = flat(post.sample(40000, generator=torch.Generator().manual_seed(0)), batched=True)
    emp = torch.cov(draws.T)
    assert (emp - cov).norm() / cov.norm() < 0.03
    assert ((draws.mean(0) - mean).abs() / cov.diagonal().sqrt()).max() < 0.03


def test_kl_matches_the_dense_gaussian():
    (p, mp, cp), (q, mq, cq) = kronecker_example(0), kronecker_example(3)
    expected = torch.distributions.kl_divergence(MultivariateNormal(mp, cp), MultivariateNormal(mq, cq))
    torch.testing.assert_close(p.kl(q), expected)
    torch.testing.assert_close(p.kl(p), torch.zeros((), dtype=torch.float64), atol=1e-10, rtol=0)
    prior = DiagonalGaussian.isotropic(p.mean, precision=2.0)
    dense_prior = MultivariateNormal(torch.zeros_like(mp), torch.eye(len(mp), dtype=torch.float64) / 2.0)
    torch.testing.assert_close(
        p.kl(prior), torch.distributions.kl_divergence(MultivariateNormal(mp, cp), dense_prior)
    )


def test_invalid_blocks_are_rejected():
    gen = torch.Generator().manual_seed(0)
    mean = [torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)]
    good_row, good_col = spd(1, 2, gen), spd(1, 4, gen)
    with pytest.raises(ValueError, match="exactly once"):
        KroneckerGaussian(mean, [KroneckerBlock((0,), good_row, good_col)])
    with pytest.raises(ValueError, match="weights"):
        KroneckerGaussian(mean, [KroneckerBlock((0, 1), good_row, spd(1, 3, gen))])
    with pytest.raises(ValueError, match="positive definite"):
        KroneckerGaussian(mean, [KroneckerBlock((0, 1), -good_row, good_col)])
    post = KroneckerGaussian(mean, [KroneckerBlock((0, 1), good_row, good_col)])
    with pytest.raises(ValueError, match="shape"):
        post.log_prob([torch.zeros(3, 2), torch.zeros(2)])
    with pytest.raises(ValueError, match="n must be"):
        post.sample(0)


# ------------------------------------------------------------------------------------------------------------
# one protocol, four families (ngvi/posterior/)
# ------------------------------------------------------------------------------------------------------------
FAMILIES = [ngvi.DiagonalGaussian, ngvi.KroneckerGaussian, ngvi.FullGaussian, ngvi.BlockTridiagonalGaussian]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda c: c.__name__)
def test_every_family_implements_the_protocol(family):
    assert issubclass(family, ngvi.GaussianPosterior)
    for name in ("sample", "log_prob", "entropy", "kl"):
        assert getattr(family, name) is not getattr(ngvi.GaussianPosterior, name), f"{family.__name__}.{name}"
    for name in ("std", "snr", "prune_masks", "numel"):  # shared, from mean and variance
        assert getattr(family, name) is getattr(ngvi.GaussianPosterior, name)


def test_the_old_import_paths_still_name_the_same_classes():
    import ngvi.posterior as package

    assert ngvi.posterior is package
    for name in ("DiagonalGaussian", "KroneckerGaussian", "FullGaussian", "BlockTridiagonalGaussian"):
        assert getattr(package, name) is getattr(ngvi, name)
    assert package.join_block is package.kronecker.join_block
    assert package.dense_covariance is package.full.dense_covariance


def test_a_posterior_without_the_protocol_says_which_method_is_missing():
    class Partial(ngvi.GaussianPosterior):
        def __init__(self):
            self.mean, self.variance = [torch.zeros(2)], [torch.ones(2)]

    q = Partial()
    torch.testing.assert_close(q.snr()[0], torch.zeros(2))  # what follows from mean and variance works
    with pytest.raises(NotImplementedError, match="Partial does not implement kl"):
        q.kl(q)
