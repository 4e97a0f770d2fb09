r"""The observation noise of NNG's regression protocol: a Gamma posterior over the noise precision τ.

Hernández-Lobato & Adams (2015, PBP, §3) put a Gamma(6, 6) prior on the precision τ of the Gaussian
likelihood y ~ N(f(x; w), 1/τ) (standardised targets) and infer it with the weights. Louizos & Welling
(2016, §4, their regression experiments) keep a Gamma posterior q(τ) = Gamma(a, b) beside the weights'
and maximise the ELBO over (a, b) by gradient steps, and the code released with NNG's regression experiments
does the same: q(τ) starts at the prior, log a and log b follow Adam (step 10⁻³) on the per-example terms
of the negative ELBO that involve τ,

.. math::
    J(a, b) = \tfrac12\,\mathbb E_q[\tau]\,\overline{r^2} - \tfrac12\,\mathbb E_q[\log\tau]
        + \tfrac1N\,\mathrm{KL}\big(\mathrm{Gamma}(a, b)\,\|\,\mathrm{Gamma}(6, 6)\big),
    \qquad \mathbb E_q[\tau] = a/b,\ \ \mathbb E_q[\log\tau] = \psi(a) - \log b,

where r̄² is the mean squared residual of the step's minibatch under the step's weight samples. We follow
that choice. The weights see the likelihood through E_q[τ]: the loss (½ E_q[τ] r² per example) is linear in
τ, so its gradient is the expectation over q(τ) of the gradient at a sampled τ, without that sample's noise;
for the same reason the true-Fisher targets are drawn with precision E_q[τ] (E_q[τ JᵀJ] = E_q[τ] JᵀJ).
The predictive density integrates τ too: each of the test samples pairs a weight draw with a draw τₛ ~ q(τ).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

PRIOR_SHAPE = PRIOR_RATE = 6.0
NOISE_LR = 1e-3


class GammaNoise:
    r"""q(τ) = Gamma(a, b) over the noise precision (standardised units), trained by Adam on J(a, b).

    The two parameters are log a and log b; J's gradient is in closed form (ψ' is the trigamma function),

    .. math::
        \partial J/\partial a = \frac{\overline{r^2}}{2b} - \frac{\psi'(a)}2
            + \frac1N\big[(a - a_0)\psi'(a) + b_0/b - 1\big],\qquad
        \partial J/\partial b = -\frac{a\overline{r^2}}{2b^2} + \frac1{2b} + \frac1N\Big[\frac{a_0}b
            - \frac{a b_0}{b^2}\Big],

    and Adam (β = 0.9, 0.999, ε = 10⁻⁸, bias-corrected, as torch.optim.Adam) runs on plain floats: the
    update costs microseconds per step.
    """

    betas = (0.9, 0.999)
    eps = 1e-8

    def __init__(
        self, data_size: int, lr: float = NOISE_LR, shape: float = PRIOR_SHAPE, rate: float = PRIOR_RATE
    ) -> None:
        self.data_size = data_size
        self.lr = lr
        self.prior = (shape, rate)
        self.log_params = [math.log(shape), math.log(rate)]
        self._moments = [[0.0, 0.0], [0.0, 0.0]]
        self._steps = 0

    @property
    def shape(self) -> float:
        return math.exp(self.log_params[0])

    @property
    def rate(self) -> float:
        return math.exp(self.log_params[1])

    def mean(self) -> float:
        """E_q[τ] = a/b."""
        return self.shape / self.rate

    def gradient(self, mean_sq_residual: float) -> tuple[float, float]:
        """(∂J/∂log a, ∂J/∂log b)."""
        from scipy.special import polygamma

        a, b, (a0, b0), n, r = self.shape, self.rate, self.prior, self.data_size, mean_sq_residual
        trigamma = float(polygamma(1, a))
        d_a = 0.5 * r / b - 0.5 * trigamma + ((a - a0) * trigamma + b0 / b - 1.0) / n
        d_b = -0.5 * a * r / b**2 + 0.5 / b + (a0 / b - a * b0 / b**2) / n
        return a * d_a, b * d_b

    def update(self, mean_sq_residual: float) -> None:
        """One Adam step on J(a, b) for the minibatch's mean squared residual r̄²."""
        self._steps += 1
        beta1, beta2 = self.betas
        for k, g in enumerate(self.gradient(mean_sq_residual)):
            m = self._moments[k]
            m[0] = beta1 * m[0] + (1 - beta1) * g
            m[1] = beta2 * m[1] + (1 - beta2) * g * g
            m_hat = m[0] / (1 - beta1**self._steps)
            v_hat = m[1] / (1 - beta2**self._steps)
            self.log_params[k] -= self.lr * m_hat / (math.sqrt(v_hat) + self.eps)

    def objective(self, mean_sq_residual: float) -> float:
        """J(a, b) itself (for tests)."""
        from scipy.special import digamma, gammaln

        a, b, (a0, b0), n = self.shape, self.rate, self.prior, self.data_size
        kl = (
            (a - a0) * digamma(a)
            - gammaln(a)
            + gammaln(a0)
            + a0 * (math.log(b) - math.log(b0))
            + a * (b0 - b) / b
        )
        return float(0.5 * a / b * mean_sq_residual - 0.5 * (digamma(a) - math.log(b)) + kl / n)

    def sample(self, n: int, rng: np.random.Generator) -> Tensor:
        """n draws τ ~ Gamma(a, b) (float64)."""
        return torch.as_tensor(rng.gamma(self.shape, 1.0 / self.rate, size=n), dtype=torch.float64)
