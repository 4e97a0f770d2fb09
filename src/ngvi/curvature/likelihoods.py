r"""Likelihoods for the "fisher" curvature: targets sampled from the model's own predictive.

The true Fisher is
:math:`F = \mathbb E_x\,\mathbb E_{\tilde y\sim p(y\mid x,\theta)}[\nabla f\,\nabla f^\top]`, with f the
negative log-likelihood of the sampled target ỹ (Martens 2014; NNG §3, footnote 1). For each likelihood
we need a sample ỹ and the gradient of :math:`\sum_i -\log p(\tilde y_i\mid o_i)` with respect to
the network output o — the optimizer backpropagates that gradient instead of forming a second loss.

=================  ==========================  ====================================  ========================
likelihood         output o                    ỹ                                     ∂(−log p)/∂o
=================  ==========================  ====================================  ========================
``Gaussian(τ)``    the mean, any shape         o + ε/√τ,  ε ~ N(0, I)                τ (o − ỹ)
``Bernoulli()``    logits, any shape           Bernoulli(sigmoid(o))                 sigmoid(o) − ỹ
``Categorical()``  logits [M, C, ...]          Categorical(softmax over dim 1)       softmax(o) − onehot(ỹ)
=================  ==========================  ====================================  ========================

The matching minibatch losses (mean over the M examples, as the closure returns them) are
``0.5 * τ * ((o - y)**2).flatten(1).sum(1).mean()``, ``F.binary_cross_entropy_with_logits(o, y)`` (mean over
all elements: divide by the elements per example to get the mean NLL per example, or use ``.sum() / M``),
and ``F.cross_entropy(o, y)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class Likelihood:
    """p(y | o) for a network output o: samples from it and the gradient of its NLL."""

    name: str = "likelihood"

    def sample(self, output: Tensor, generator: torch.Generator | None = None) -> Tensor:
        raise NotImplementedError

    def nll_grad(self, output: Tensor, target: Tensor) -> Tensor:
        """∂/∂o of Σᵢ −log p(yᵢ | oᵢ) (the sum over the minibatch: one example's f_i per example)."""
        raise NotImplementedError

    def nll(self, output: Tensor, target: Tensor) -> Tensor:
        """Σᵢ −log p(yᵢ | oᵢ), up to a constant (for tests and for writing the matching loss)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(vars(self).items()))))


class Gaussian(Likelihood):
    """N(y | o, 1/τ·I), τ = ``precision`` (the noise precision)."""

    name = "gaussian"

    def __init__(self, precision: float = 1.0):
        if isinstance(precision, bool) or not isinstance(precision, int | float):
            raise ValueError(f"noise_prec must be a number, got {precision!r}")
        if not (math.isfinite(precision) and precision > 0):
            raise ValueError(f"noise_prec must be > 0 and finite, got {precision!r}")
        self.precision = float(precision)

    def sample(self, output, generator=None):
        noise = torch.randn(output.shape, generator=generator, dtype=output.dtype, device=output.device)
        return output.detach() + noise / math.sqrt(self.precision)

    def nll_grad(self, output, target):
        return (output.detach() - target).mul_(self.precision)

    def nll(self, output, target):
        return 0.5 * self.precision * (output - target).square().sum()

    def __repr__(self) -> str:
        return f"Gaussian(precision={self.precision})"


class Bernoulli(Likelihood):
    """Independent Bernoulli(sigmoid(o)) for every output element."""

    name = "bernoulli"

    def sample(self, output, generator=None):
        probs = torch.sigmoid(output.detach()).nan_to_num_(0.5)  # NaN outputs: NaN curvature, not a crash
        return torch.bernoulli(probs, generator=generator)

    def nll_grad(self, output, target):
        return torch.sigmoid(output.detach()) - target

    def nll(self, output, target):
        return torch.nn.functional.binary_cross_entropy_with_logits(output, target, reduction="sum")


class Categorical(Likelihood):
    """Categorical(softmax(o)) over dim 1, the class dim of ``F.cross_entropy``: o is [M, C] or [M, C, …]."""

    name = "categorical"

    def sample(self, output, generator=None):
        logits = output.detach().movedim(1, -1)
        probs = torch.softmax(logits.reshape(-1, logits.shape[-1]), dim=-1)
        ok = torch.isfinite(probs).all(-1, keepdim=True)  # NaN outputs: NaN curvature, not a crash
        probs = torch.where(ok, probs, 1.0)
        draws = torch.multinomial(probs, 1, generator=generator)
        return draws.reshape(logits.shape[:-1])

    def nll_grad(self, output, target):
        probs = torch.softmax(output.detach(), dim=1)
        index = target.unsqueeze(1)
        return probs.scatter_add_(1, index, probs.new_full(index.shape, -1.0))

    def nll(self, output, target):
        return torch.nn.functional.cross_entropy(output, target, reduction="sum")


LIKELIHOODS = {cls.name: cls for cls in (Gaussian, Bernoulli, Categorical)}


def make_likelihood(likelihood: str | Likelihood, noise_prec: float = 1.0) -> Likelihood:
    """A likelihood from its name ("gaussian" takes ``noise_prec``) or an instance, passed through."""
    if isinstance(likelihood, Likelihood):
        return likelihood
    if likelihood not in LIKELIHOODS:
        raise ValueError(
            f"likelihood must be one of {tuple(LIKELIHOODS)} or a ngvi.curvature.Likelihood, "
            f"got {likelihood!r}"
        )
    return Gaussian(noise_prec) if likelihood == "gaussian" else LIKELIHOODS[likelihood]()
