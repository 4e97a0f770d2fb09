"""Vprop and Vadam converge to the gradient-magnitude fixed point of Khan et al. 2018, App. H (eq. 103).

For a quadratic f(θ) = ½(θ − θ*)ᵀA(θ − θ*) with full-batch gradients the fixed point can be written out:

    N E_q[∇f] + λμ = 0          ⇒  μ = (NA + λI)⁻¹ N A θ*
    N E_q[(∇f)²] + λ = 1/σ²     ⇒  s = m² + (A∘A) σ²,  with m = A(μ − θ*), σ² = 1/(N s + λ),

since ∇f(θ) = A(θ − θ*) and E_q[(∇f)ⱼ²] = mⱼ² + Σₖ Aⱼₖ² σₖ². The second equation is solved by fixed-point
iteration below. App. H's point is that the square root in Vprop/Vadam's preconditioner does not move it.
Decaying steps (lr ∝ 1/(1+k/50), EMA step 1/(50+k)) and 4 MC samples per step average out the sampling
noise.
Tolerances: s within 5%, μ within 0.1 σ (over seeds 0–7 the worst errors were 2.2% and 0.034 σ).
"""

from __future__ import annotations

import pytest
import torch

import ngvi

N, LAM, STEPS = 20, 3.0, 4000


def quadratic():
    gen = torch.Generator().manual_seed(3)
    B = torch.randn(3, 3, generator=gen, dtype=torch.float64)
    A = B @ B.T + 0.5 * torch.eye(3, dtype=torch.float64)
    theta_star = torch.randn(3, generator=gen, dtype=torch.float64)
    return A, theta_star


def gm_fixed_point(A, theta_star):
    mu = torch.linalg.solve(N * A + LAM * torch.eye(3, dtype=torch.float64), N * A @ theta_star)
    m = A @ (mu - theta_star)
    s = torch.ones(3, dtype=torch.float64)
    for _ in range(500):
        s = m**2 + (A * A) @ (1 / (N * s + LAM))
    assert torch.allclose(s, m**2 + (A * A) @ (1 / (N * s + LAM)), rtol=1e-12)
    return mu, s


@pytest.mark.parametrize("name", ["vprop", "vadam"])
def test_gradient_magnitude_fixed_point(name):
    A, theta_star = quadratic()
    mu_star, s_star = gm_fixed_point(A, theta_star)
    theta = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    if name == "vprop":
        opt = ngvi.Vprop(
            [theta], N, lr=0.05, beta=0.01, prior_prec=LAM, init_prec=LAM + N, mc_samples=4, seed=0
        )
    else:
        opt = ngvi.Vadam(
            [theta], N, lr=0.05, betas=(0.9, 0.99), prior_prec=LAM, init_prec=LAM + N, mc_samples=4, seed=0
        )

    def closure():
        opt.zero_grad()
        d = theta - theta_star
        loss = 0.5 * d @ A @ d
        loss.backward()
        return loss

    for t in range(STEPS):
        if t >= 1000:
            k = t - 1000
            for g in opt.param_groups:
                g["lr"] = 0.05 / (1 + k / 50)
                decay = 1 - 1 / (50 + k)
                if name == "vprop":
                    g["beta"] = 1 - decay  # Vprop's beta is the step
                else:
                    g["betas"] = (g["betas"][0], decay)
        opt.step(closure)
    state = opt.state[theta]
    s = state["exp_avg_sq"]
    sigma = 1 / torch.sqrt(N * s_star + LAM)
    assert ((s / s_star) - 1).abs().max() < 0.05, (s, s_star)
    assert ((theta.detach() - mu_star) / sigma).abs().max() < 0.1, (theta, mu_star)
