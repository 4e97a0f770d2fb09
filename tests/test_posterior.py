"""DiagonalGaussian against torch.distributions (an independent implementation of the same densities)."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import Normal, kl_divergence

import ngvi


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
