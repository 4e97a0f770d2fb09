r"""Per-example curvature from one ordinary forward and backward pass, through module hooks.

VOGN needs the mean of squared per-example gradients, ĥ = (1/M) Σᵢ (∇fᵢ)², and noisy K-FAC the Kronecker
factors A = E[āāᵀ] and S = E[δδᵀ] of each layer. Both come from what a layer sees anyway: its input a and
the gradient δ at its output. :class:`CurvatureHooks` records them for every nn.Linear and nn.Conv2d (and
nn.LayerNorm / nn.GroupNorm, whose affine weights are one 1×1 layer per element) of any module tree;
:mod:`.statistics` turns them into

* Σᵢ gᵢ² = (δ²)ᵀ(a²) for a Linear layer (Goodfellow 2015) — one extra matrix product, no per-example
  gradients;
* Σᵢ (Σₜ δᵢₜ aᵢₜᵀ)² for layers with several positions per example (Conv2d from unfolded patches, sequences,
  layers used twice), a chunk of examples at a time so the memory stays bounded;
* the K-FAC / KFC factors A and S.

:mod:`.likelihoods` samples targets from the model's predictive for the true-Fisher ("fisher") variant, and
:mod:`.optimizer` is the glue used by :class:`ngvi.VOGN` and :class:`ngvi.NoisyKFAC` (closure contract,
hooks only during a training sample, pickling).
"""

from .hooks import CurvatureHooks, HookedLayer, find_layers
from .kfac import damped_inverse, damped_inverses, pi_split
from .likelihoods import Bernoulli, Categorical, Gaussian, Likelihood, make_likelihood

__all__ = [
    "Bernoulli",
    "Categorical",
    "CurvatureHooks",
    "Gaussian",
    "HookedLayer",
    "Likelihood",
    "damped_inverse",
    "damped_inverses",
    "find_layers",
    "make_likelihood",
    "pi_split",
]
