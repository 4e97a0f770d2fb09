r"""The 2-D toy of Khan et al. 2018, Fig. 2a (App. I.1): Murphy (2012), Fig. 8.6.

Two Gaussian classes of 30 points each, as the authors' ``get_data_log_reg.m`` (case ``murphy_synth``)
draws them: y = 1 from N((1, 5), I) and y = 0 from N((−5, 1), 2.2² I). No bias, prior precision λ = 0.01.
The true posterior is tabulated on a grid; MF-Exact, VOGN-1 and Vadam are drawn as ellipses over it.

App. I.1: all methods start at w = (1, 1) with precision 1 + λ, use 1 MC sample and the decay of eq. 104
with α₀ = 0.1 and β₀ = 0.1 (γ₂ = 1 − βₜ); Vadam takes minibatches of M = 10 and VOGN-1 of M = 1, both for
500,000 iterations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .protocol import Recipe, vadam_recipe, vogn1_recipe

PRIOR_PREC = 0.01
PER_CLASS = 30
DATA_SIZE = 2 * PER_CLASS
ALPHA0 = BETA0 = 0.1
VADAM_BATCH = 10
STEPS = 500_000
START = (1.0, 1.0)


def murphy_data(seed: int = 0) -> tuple[Tensor, Tensor]:
    """(X [60, 2], y [60]) in float64: 30 points of class 1 around (1, 5), then 30 of class 0 around
    (−5, 1)."""
    rng = np.random.default_rng(seed)
    ones = rng.standard_normal((PER_CLASS, 2)) + np.array([1.0, 5.0])
    zeros = 2.2 * rng.standard_normal((PER_CLASS, 2)) + np.array([-5.0, 1.0])
    x = torch.as_tensor(np.vstack([ones, zeros]), dtype=torch.float64)
    y = torch.cat([torch.ones(PER_CLASS), torch.zeros(PER_CLASS)]).double()
    return x, y


def toy_recipe(name: str) -> Recipe:
    if name == "vadam":
        return vadam_recipe(DATA_SIZE, VADAM_BATCH, alpha0=ALPHA0, beta0=BETA0)
    if name == "vogn":
        return vogn1_recipe(step=ALPHA0, beta=BETA0, decayed=True)
    raise ValueError(f"the toy runs vadam and vogn, not {name!r}")


@dataclass
class PosteriorGrid:
    """The unnormalised log posterior on a grid, with its normalised density, mean, covariance and MAP."""

    w1: np.ndarray  # [G1]
    w2: np.ndarray  # [G2]
    density: np.ndarray  # [G2, G1], sums to 1 over the grid
    mean: np.ndarray  # [2]
    cov: np.ndarray  # [2, 2]
    map: np.ndarray  # [2]


def true_posterior(
    x: Tensor, y: Tensor, w1: np.ndarray, w2: np.ndarray, prior_prec: float = PRIOR_PREC
) -> PosteriorGrid:
    """p(w | data) ∝ Πᵢ sigmoid(sᵢ xᵢᵀw) N(w | 0, I/λ) on the grid w1 × w2 (moments by summing over it)."""
    g1, g2 = np.meshgrid(w1, w2)  # [G2, G1]
    w = torch.as_tensor(np.stack([g1.ravel(), g2.ravel()], 1), dtype=torch.float64)
    s = torch.where(y > 0, 1.0, -1.0).double()
    log_joint = torch.nn.functional.logsigmoid(s * (w @ x.T)).sum(1) - 0.5 * prior_prec * w.square().sum(1)
    log_joint = log_joint.numpy().reshape(g1.shape)
    density = np.exp(log_joint - log_joint.max())
    density /= density.sum()
    points = np.stack([g1, g2], -1)  # [G2, G1, 2]
    mean = (density[..., None] * points).sum((0, 1))
    centred = points - mean
    cov = np.einsum("ab,abi,abj->ij", density, centred, centred)
    i, j = np.unravel_index(np.argmax(log_joint), log_joint.shape)
    return PosteriorGrid(w1, w2, density, mean, cov, np.array([g1[i, j], g2[i, j]]))
