"""ngvi.calibrate for every posterior family (issue 44, item 3): the K-FAC family and BBVI get a posterior
temperature T (covariance × T), checked against the exact Gaussian predictive of a linear model; a fit at
the end of its grid warns; the Calibration repr is short.

The linear model is test_calibrate's: y = x·w + 0.5 + 0.1ε on 8 features, trained on 16 points with the
loss mse/2 (noise taken as 1 instead of 0.1), so the posterior is far too wide and the held-out optimum of T
is below 1 (NNG-full: 0.216; BBVI, whose σ is still moving after 300 steps: 0.586). With the noise s.d.
given (``fit_noise=False``) the predictive of q_T = N(μ, T·Σ) is y ~ N(xᵀμ, T·xᵀΣx + σ²) exactly; its
held-out NLL is minimised over log T by brute force (a grid of 4,001 points on 10⁻⁶…10²), and the fitted T
(from 256 Monte-Carlo draws) must be within 25% of it (the tolerance of test_calibrate's λ against its exact
optimum; seen: 0.236 against 0.216, 0.538 against 0.586).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import ngvi
from ngvi.baselines import BBVI
from ngvi.calibrate_temperature import TEMPERATURE_GRID, at_grid_end
from test_calibrate import linear_data, trained

FAMILIES = {
    "NoisyKFAC": lambda m, n: ngvi.NoisyKFAC(m, n, seed=0),
    "NNGFull": lambda m, n: ngvi.NNGFull(m, n, seed=0),
    "NNGBlkTri": lambda m, n: ngvi.NNGBlkTri(m, n, seed=0),
    "BBVI": lambda m, n: BBVI(m, n, lr=1e-2, seed=0),
}
NOISE = 0.1


def flat_covariance(opt) -> torch.Tensor:
    """Σ over [weight, bias] in the posterior's order: NNG-full's dense one, BBVI's diagonal."""
    post = opt.posterior()
    if hasattr(post, "covariance"):
        return post.covariance
    return torch.diag(torch.cat([v.reshape(-1) for v in post.variance]).double())


def exact_optimum(model, opt, x, y) -> float:
    """argmin_T of the held-out NLL of N(xᵀμ, T·xᵀΣx + σ²) (σ the true noise), on a fine log grid."""
    post = opt.posterior()
    design = torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], 1)
    mean = torch.cat([m.reshape(-1) for m in post.mean]).double()
    var_f = ((design @ flat_covariance(opt)) * design).sum(1)
    err2 = (y[:, 0].double() - design @ mean).square()
    temps = torch.logspace(-6, 2, 4001, dtype=torch.float64)
    var = temps[:, None] * var_f[None] + NOISE**2
    nll = 0.5 * (err2[None] / var + var.log()).mean(1)
    return float(temps[nll.argmin()])


@pytest.mark.parametrize("name", ["NNGFull", "BBVI"])
def test_the_fitted_temperature_matches_the_exact_predictive(name):
    model, opt = trained(FAMILIES[name], 16, noise=NOISE, loss_noise=1.0, steps=300)
    x, y = linear_data(400, 2, NOISE)
    truth = exact_optimum(model, opt, x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ngvi.PosteriorWarning)  # inside the grid: no warning
        cal = ngvi.calibrate(model, opt, (x, y), fit_noise=False, noise_std=NOISE, samples=256)
    assert cal.prior_prec is None and cal.temperature is not None
    assert 1e-4 < truth < 1 / 1.5, truth  # a posterior too wide (docstring), the optimum inside the grid
    assert abs(math.log(cal.temperature / truth)) < math.log(1.25), (cal.temperature, truth)
    assert cal.nll_after < cal.nll_before


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_temperature_scales_the_covariance_exactly_and_is_kept(name, tmp_path):
    """Σ_T = T·Σ for every marginal (K-FAC family: κ ← Tκ; BBVI: σ ← √T σ), written where the posterior,
    predict and state_dict read it; the mean is unchanged."""
    model, opt = trained(FAMILIES[name], 16, noise=NOISE, loss_noise=1.0, steps=50)
    before = opt.posterior()
    cal = ngvi.calibrate(model, opt, linear_data(200, 2, NOISE), fit_noise=False, noise_std=NOISE, samples=16)
    after = opt.posterior()
    for v0, v1, m0, m1 in zip(before.variance, after.variance, before.mean, after.mean, strict=True):
        torch.testing.assert_close(v1.double(), cal.temperature * v0.double(), rtol=1e-5, atol=0)
        assert torch.equal(m0, m1)
    state = opt.state_dict()
    _, opt2 = trained(FAMILIES[name], 16, noise=NOISE, loss_noise=1.0, steps=50)
    opt2.load_state_dict(state)
    for v1, v2 in zip(after.variance, opt2.posterior().variance, strict=True):
        torch.testing.assert_close(v2, v1)
    assert cal.key == ("log_std" if name == "BBVI" else "kl_weight")


def test_a_fit_at_the_end_of_its_grid_warns():
    """A grid of [1, 2] where the optimum is far below: the fit is 1, the end, and a PosteriorWarning says
    it is a bound; the same for λ on a diagonal rule whose optimum is beyond the given grid."""
    model, opt = trained(FAMILIES["NNGFull"], 16, noise=NOISE, loss_noise=1.0, steps=100)
    data = linear_data(200, 2, NOISE)
    with pytest.warns(ngvi.PosteriorWarning, match="at the end of the values searched"):
        cal = ngvi.calibrate(model, opt, data, fit_noise=False, noise_std=NOISE, grid=[1.0, 2.0], samples=16)
    assert cal.temperature == 1.0
    make = lambda m, n: ngvi.Vadam(m.parameters(), n, lr=1e-2, seed=0)  # noqa: E731
    model, opt = trained(make, 16, noise=NOISE, loss_noise=1.0)
    with pytest.warns(ngvi.PosteriorWarning, match="fitted λ"):
        ngvi.calibrate(model, opt, data, fit_noise=False, noise_std=NOISE, grid=[1e-3, 1e-2], samples=16)
    assert at_grid_end(0.01, TEMPERATURE_GRID) and not at_grid_end(1.0, TEMPERATURE_GRID)


def test_the_repr_is_short():
    model, opt = trained(FAMILIES["NNGFull"], 16, noise=NOISE, loss_noise=1.0, steps=50)
    cal = ngvi.calibrate(model, opt, linear_data(200, 2, NOISE), samples=16)
    text = repr(cal)
    assert len(text) < 200 and "grid_nll" not in text and "temperature=" in text and "noise_std=" in text


def test_families_without_a_temperature_are_still_refused():
    """Plain K-FAC is a point estimate; VadaGrad has no prior (and no temperature here)."""
    for make, words in (
        (lambda m, n: ngvi.baselines.KFAC(m, n), "not supported for KFAC"),
        (lambda m, n: ngvi.VadaGrad(m.parameters(), seed=0), "VadaGrad has no prior"),
    ):
        model, opt = trained(make, 16, noise=NOISE, loss_noise=1.0, steps=5)
        with pytest.raises(TypeError, match=words):
            ngvi.calibrate(model, opt, linear_data(50, 2, NOISE))
