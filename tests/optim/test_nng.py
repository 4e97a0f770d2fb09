"""NNG-full and NNG-BlkTri against analytic truth and brute force, their posteriors' densities, and plain
K-FAC's step. (The guarantees every trainer gives: tests/optim/test_guarantees.py and test_contract.py.)"""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ngvi
from conftest import fit_full_batch_regression
from ngvi.baselines import KFAC
from ngvi.curvature import tridiagonal
from ngvi.posterior import dense_covariance, flatten


def mvn(post) -> torch.distributions.MultivariateNormal:
    mean = flatten([m.double() for m in post.mean])
    return torch.distributions.MultivariateNormal(mean, dense_covariance(post))


def check_densities(post, n: int = 200000, tol: float = 0.03) -> None:
    """log_prob, entropy and the KL to a diagonal prior agree with torch's dense MultivariateNormal, and
    the covariance of post.sample(n) with the dense covariance (relative Frobenius error ≈ √(k/n))."""
    ref = mvn(post)
    draws = post.sample(3, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(post.log_prob(draws), ref.log_prob(flatten(draws, (3,)).double()))
    torch.testing.assert_close(post.log_prob([d[0] for d in draws]), ref.log_prob(flatten(draws, (3,))[0]))
    torch.testing.assert_close(post.entropy(), ref.entropy())
    prior = ngvi.DiagonalGaussian.isotropic(post.mean, 2.0)
    k = post.numel()
    prior_ref = torch.distributions.MultivariateNormal(
        torch.zeros(k, dtype=torch.float64), torch.eye(k, dtype=torch.float64) / 2.0
    )
    torch.testing.assert_close(post.kl(prior), torch.distributions.kl_divergence(ref, prior_ref))
    torch.testing.assert_close(post.kl(post), torch.zeros((), dtype=torch.float64), atol=1e-8, rtol=0)
    flat = flatten(post.sample(n, generator=torch.Generator().manual_seed(1)), (n,)).double()
    cov = dense_covariance(post)
    assert (torch.cov(flat.T) - cov).norm() / cov.norm() < tol
    torch.testing.assert_close(flatten([v.double() for v in post.variance]), cov.diagonal())


# ------------------------------------------------------------------------------------------------------------
# NNG-full
# ------------------------------------------------------------------------------------------------------------
def test_nng_full_reaches_the_exact_bayesian_linear_regression_posterior():
    """With the true Fisher, the fixed point of eqs. 9–10 is the exact posterior: F̄ → τX̄ᵀX̄/N, so
    (λ/N)(F̄ + γ_in I)⁻¹ = (τX̄ᵀX̄ + I/η)⁻¹ and μ its mean. The mean is within 0.1 posterior std, the
    covariance within 10% (relative Frobenius); F̄'s remaining sampling noise makes ~1% of it."""
    n, d, tau, prior_var = 200, 4, 1.5, 10.0
    gen = torch.Generator().manual_seed(0)
    mix = torch.eye(d) + 0.5 * torch.randn(d, d, generator=gen)  # strongly correlated features
    x = (torch.randn(n, d, generator=gen) @ mix).double()
    y = (
        x @ torch.randn(d, 1, generator=gen).double()
        - 0.5
        + torch.randn(n, 1, generator=gen).double() / tau**0.5
    )
    xb = torch.cat([x, torch.ones(n, 1, dtype=torch.float64)], 1)
    exact_cov = torch.linalg.inv(tau * xb.T @ xb + torch.eye(d + 1, dtype=torch.float64) / prior_var)
    exact_mean = exact_cov @ (tau * xb.T @ y).squeeze(1)

    def make(model, **true_fisher):
        return ngvi.NNGFull(
            model, n, lr=0.5, beta=0.02, prior_var=prior_var, damping=0.0, mc_samples=2, **true_fisher
        )

    post = fit_full_batch_regression(make, x, y, tau, steps=300, decay=0.98)
    assert isinstance(post, ngvi.FullGaussian)
    assert (post.covariance - exact_cov).norm() / exact_cov.norm() < 0.1
    mean = torch.cat([post.mean[0].reshape(-1), post.mean[1]])
    assert ((mean - exact_mean).abs() / exact_cov.diagonal().sqrt()).max() < 0.1


def test_nng_full_refuses_a_large_model_naming_its_size():
    with pytest.raises(
        ValueError, match=r"this model has 5,010 trainable parameters, more than max_params=4096"
    ):
        ngvi.NNGFull(nn.Linear(500, 10), 100)
    ngvi.NNGFull(nn.Linear(500, 10), 100, max_params=6000)  # raised on request


def test_per_example_fisher_matches_autograd():
    """F̂ = (1/M)Σᵢ gᵢgᵢᵀ over a conv net's parameters, against per-example gradients from autograd."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1, groups=2), nn.GroupNorm(2, 4), nn.Tanh(), nn.Flatten(), nn.Linear(64, 3)
    ).double()
    x, y = torch.randn(5, 2, 4, 4, dtype=torch.float64), torch.randint(0, 3, (5,))
    opt = ngvi.NNGFull(model, 5, lr=0.0, beta=1.0)  # β = 1: F̄ is this step's F̂
    with opt.sampled_params(train=True):
        twin = copy.deepcopy(model)  # the sampled weights, without the optimizer's hooks
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
    opt.step()
    rows = []
    for i in range(5):
        loss = F.cross_entropy(twin(x[i : i + 1]), y[i : i + 1])
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(twin.parameters()))]))
    g = torch.stack(rows)
    torch.testing.assert_close(opt.state[next(model.parameters())]["fisher"], g.T @ g / 5)


def test_full_gaussian_densities():
    torch.manual_seed(0)
    mean = [torch.randn(2, 3, dtype=torch.float64), torch.randn(2, dtype=torch.float64)]
    root = torch.randn(8, 8, dtype=torch.float64)
    post = ngvi.FullGaussian(mean, root @ root.T / 8 + 0.1 * torch.eye(8, dtype=torch.float64))
    check_densities(post)
    other = ngvi.FullGaussian([m + 0.3 for m in mean], torch.eye(8, dtype=torch.float64) * 0.5)
    torch.testing.assert_close(post.kl(other), torch.distributions.kl_divergence(mvn(post), mvn(other)))
    with pytest.raises(ValueError, match="expected \\(8, 8\\)"):
        ngvi.FullGaussian(mean, torch.eye(7, dtype=torch.float64))
    with pytest.raises(ValueError, match="positive definite"):
        ngvi.FullGaussian(mean, -torch.eye(8, dtype=torch.float64))


# ------------------------------------------------------------------------------------------------------------
# NNG-BlkTri: the block-tridiagonal posterior against brute force
# ------------------------------------------------------------------------------------------------------------
def chain_model(widths: list[int], seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1]).double()


def trained_blktri(widths: list[int], n: int = 50, prior_var: float = 0.5, damping: float = 0.01, **kw):
    model = chain_model(widths)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, widths[0], generator=gen, dtype=torch.float64)
    y = torch.randn(64, widths[-1], generator=gen, dtype=torch.float64)
    opt = ngvi.NNGBlkTri(
        model,
        n,
        lr=0.05,
        beta=0.3,
        momentum=0.0,
        prior_var=prior_var,
        damping=damping,
        inv_every=1,
        seed=0,
        **kw,
    )

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    for _ in range(4):
        opt.step(closure)
    return model, opt, closure


def block_order(model: nn.Module) -> tuple[torch.Tensor, list[int]]:
    """Indices that reorder the flattened parameters (W₁, b₁, W₂, …) into the blocks [W_i | b_i] row-major."""
    idx, base, offsets = [], 0, [0]
    for m in model:
        if isinstance(m, nn.Linear):
            o, d = m.weight.shape
            w = torch.arange(base, base + o * d).reshape(o, d)
            b = torch.arange(base + o * d, base + o * d + o)[:, None]
            idx.append(torch.cat([w, b], 1).reshape(-1))
            base += o * (d + 1)
            offsets.append(base)
    return torch.cat(idx), offsets


def damped_blocks(opt, model, damping):
    """Brute force: the dense F̃ on the tridiagonal blocks, S_ij ⊗ A_ij, with eq. 13's π-split damping on
    the diagonal blocks."""
    states = [opt.state[m.weight] for m in model if isinstance(m, nn.Linear)]
    diag, cross = [], []
    for st in states:
        a, s = st["factor_A"], st["factor_S"]
        pi = math.sqrt((a.trace() / a.shape[0]) / (s.trace() / s.shape[0]))
        eye_a, eye_s = torch.eye(a.shape[0], dtype=a.dtype), torch.eye(s.shape[0], dtype=s.dtype)
        diag.append(torch.kron(s + math.sqrt(damping) / pi * eye_s, a + pi * math.sqrt(damping) * eye_a))
        if "factor_S_next" in st:
            cross.append(torch.kron(st["factor_S_next"], st["factor_A_next"]))
    return diag, cross


def test_blktri_two_layers_is_the_damped_kronecker_fisher_inverted():
    """With two layers every block is on the tridiagonal, so the structure is exact: the posterior
    covariance is (λ/N) F̃_γin⁻¹ of the dense brute-force matrix, to rounding."""
    n, prior_var = 50, 0.5
    model, opt, _ = trained_blktri([3, 4, 2], n, prior_var)
    post = opt.posterior()
    assert isinstance(post, ngvi.BlockTridiagonalGaussian)
    diag, cross = damped_blocks(opt, model, 1 / (n * prior_var))
    dense = torch.block_diag(*diag)
    o = diag[0].shape[0]
    dense[:o, o:], dense[o:, :o] = cross[0], cross[0].T
    order, _ = block_order(model)
    cov = dense_covariance(post)[order[:, None], order[None, :]]
    torch.testing.assert_close(cov, torch.linalg.inv(dense) / n)
    check_densities(post)


def test_blktri_three_layers_has_the_block_tridiagonal_structure():
    """Martens & Grosse §4.3: F̂ agrees with F̃ on the diagonal and adjacent blocks (brute force), and its
    inverse — the posterior covariance up to λ/N — is zero beyond them."""
    n, prior_var = 50, 0.5
    model, opt, _ = trained_blktri([3, 4, 3, 2], n, prior_var)
    order, offsets = block_order(model)
    cov = dense_covariance(opt.posterior())[order[:, None], order[None, :]]
    assert cov[offsets[0] : offsets[1], offsets[2] : offsets[3]].abs().max() < 1e-14 * cov.abs().max()
    precision = torch.linalg.inv(cov) / n
    diag, cross = damped_blocks(opt, model, 1 / (n * prior_var))
    for i in range(3):
        block = precision[offsets[i] : offsets[i + 1], offsets[i] : offsets[i + 1]]
        torch.testing.assert_close(block, diag[i])
        if i < 2:
            torch.testing.assert_close(
                precision[offsets[i] : offsets[i + 1], offsets[i + 1] : offsets[i + 2]], cross[i]
            )


def test_blktri_step_is_the_natural_gradient_of_the_tridiagonal_fisher():
    """μ ← μ − α F̂_γ⁻¹(ĝ + γ_in μ), with F̂_γ the brute-force two-layer matrix damped by γ = γ_in + γ_ex."""
    n, prior_var, damping, lr = 50, 0.5, 0.01, 0.05
    model, opt, closure = trained_blktri([3, 4, 2], n, prior_var, damping)
    order, _ = block_order(model)
    mean = torch.cat([p.detach().reshape(-1) for p in model.parameters()])[order]
    with opt.sampled_params(train=True):
        closure()
        grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])[order]
    opt.step()  # the factors' update first (β = 0.3), then the inverse (inv_every = 1), then the step
    gamma_in = 1 / (n * prior_var)
    diag, cross = damped_blocks(opt, model, gamma_in + damping)
    dense = torch.block_diag(*diag)
    o = diag[0].shape[0]
    dense[:o, o:], dense[o:, :o] = cross[0], cross[0].T
    expected = mean - lr * torch.linalg.solve(dense, grad + gamma_in * mean)
    torch.testing.assert_close(
        torch.cat([p.detach().reshape(-1) for p in model.parameters()])[order], expected
    )


def test_blktri_refuses_layers_outside_a_linear_chain():
    with pytest.raises(ValueError, match=r"'0' \(nn.Conv2d\).*Use ngvi.NoisyKFAC"):
        ngvi.NNGBlkTri(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 1)), 10)


def test_blktri_draw_does_not_depend_on_the_eigenbasis_of_degenerate_factors():
    """Rε with RRᵀ = Λ: rotating K within an eigenspace of equal e (degenerate factors leave eigh's basis
    arbitrary) changes neither Λ nor the draw, so ranks with round-off-different factors draw alike."""
    gen = torch.Generator().manual_seed(0)
    x1 = torch.randn(5, 5, generator=gen, dtype=torch.float64)
    x1 = x1 @ x1.mT + torch.eye(5, dtype=torch.float64)
    v = torch.randn(5, 2, generator=gen, dtype=torch.float64)
    k_s, e_s = tridiagonal.generalized_eigh(x1, 0.1 * v @ v.mT)  # rank 2: e_s has three zeros
    u = torch.randn(3, 1, generator=gen, dtype=torch.float64)
    k_a, e_a = tridiagonal.generalized_eigh(
        2 * torch.eye(3, dtype=torch.float64), 0.5 * u @ u.mT
    )  # two zeros
    rot = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=torch.float64))[0]
    turn_s, turn_a = torch.eye(5, dtype=torch.float64), torch.eye(3, dtype=torch.float64)
    turn_s[:3, :3] = rot  # eigenvalues ascend: the zeros come first
    turn_a[:2, :2] = torch.tensor([[0.6, -0.8], [0.8, 0.6]], dtype=torch.float64)
    chains = [
        [tridiagonal.ChainLayer(k_s, k_a, e_s, e_a)],
        [tridiagonal.ChainLayer(k_s @ turn_s, k_a @ turn_a, e_s, e_a)],
    ]
    eye = torch.eye(15, dtype=torch.float64).reshape(15, 5, 3)
    dense = [tridiagonal.lam(c, [eye])[0].reshape(15, 15) for c in chains]
    torch.testing.assert_close(dense[0], dense[1], rtol=0, atol=1e-12)  # the same Λ
    roots = [tridiagonal.lam_sqrt(c, [eye])[0].reshape(15, 15).mT for c in chains]  # columns R e_j
    assert 0.3 < (e_s[:, None] * e_a).max() < 0.9  # distinct weights D beside the degenerate ones
    torch.testing.assert_close(roots[0] @ roots[0].mT, dense[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(roots[0], roots[1], rtol=0, atol=1e-12)


class Branches(nn.Module):
    """Not a chain: a and b both read x (``"branches"``), or a's output also skips b to c (``"skip"``)."""

    def __init__(self, kind: str):
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.a, self.b = nn.Linear(3, 4).double(), nn.Linear(3 if kind == "branches" else 4, 4).double()
        self.c = nn.Linear(8 if kind == "branches" else 4, 2).double()

    def forward(self, x):
        if self.kind == "branches":
            return self.c(torch.tanh(torch.cat([self.a(x), self.b(x)], dim=1)))
        h = torch.tanh(self.a(x))
        return self.c(torch.tanh(self.b(h)) + h)


@pytest.mark.parametrize(("kind", "pair"), [("branches", "'a' and 'b'"), ("skip", "'a' and 'c'")])
def test_blktri_refuses_a_model_that_is_not_a_chain(kind, pair):
    """M&G's directed model needs each layer's input to be a function of the previous layer's output only."""
    model = Branches(kind)
    opt = ngvi.NNGBlkTri(model, 10, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64)

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    with pytest.raises(ValueError, match=rf"not a chain: {pair}.*Use ngvi.NoisyKFAC"):
        opt.step(closure)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert opt.num_steps == 0 and opt.accumulator.count == 0


# ------------------------------------------------------------------------------------------------------------
# Plain K-FAC
# ------------------------------------------------------------------------------------------------------------
def test_kfac_step_is_noisy_kfacs_update_without_the_noise():
    """W ← W − α[S + √γ/π I]⁻¹(ĝ + λ̃W)[A + π√γ I]⁻¹ with γ = λ̃ + γ_ex, the gradient at W itself."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3).double()
    x, y = torch.randn(16, 4, dtype=torch.float64), torch.randn(16, 3, dtype=torch.float64)
    n, lr, prior_prec, damping = 40, 0.3, 2.0, 0.05
    opt = KFAC(model, n, lr=lr, prior_prec=prior_prec, damping=damping, init_prec=None)  # M&G's start
    w = torch.cat([model.weight.detach(), model.bias.detach()[:, None]], 1)
    loss = F.mse_loss(model(x), y)
    g = torch.autograd.grad(loss, [model.weight, model.bias])
    g = torch.cat([g[0], g[1][:, None]], 1)
    xb = torch.cat([x, torch.ones(16, 1, dtype=torch.float64)], 1)
    a = xb.T @ xb / 16
    delta = 16 * torch.autograd.functional.jacobian(lambda out: F.mse_loss(out, y), model(x)).detach()
    s = delta.T @ delta / 16

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    opt.step(closure)
    lam, gamma = prior_prec / n, prior_prec / n + damping
    pi = math.sqrt((a.trace() / 5) / (s.trace() / 3))
    a_g = a + pi * math.sqrt(gamma) * torch.eye(5, dtype=torch.float64)
    s_g = s + math.sqrt(gamma) / pi * torch.eye(3, dtype=torch.float64)
    expected = w - lr * torch.linalg.solve(s_g, g + lam * w) @ torch.linalg.inv(a_g)
    torch.testing.assert_close(torch.cat([model.weight, model.bias[:, None]], 1).detach(), expected)
