r"""BBVI: Bayes by Backprop (Blundell et al. 2015), with local reparameterisation (Kingma et al. 2015).

The baseline of Khan et al. 2018 (App. J.1) and Zhang et al. 2018: a mean-field Gaussian
q(θ) = Πⱼ N(μⱼ, σⱼ²) whose parameters (μ, log σ) are trained by Adam on the negative ELBO per example,

.. math::
    \mathcal L(\mu, \sigma) = \mathbb E_{q}[f(\theta)] + \tfrac1N\,\mathrm{KL}(q\,\|\,p),\qquad
    p = \mathcal N(0, I/\lambda),

with f the closure's mean NLL over the minibatch. The expectation is estimated with ``mc_samples``
reparameterised draws; the KL is Gaussian-to-Gaussian, so its gradient is exact:

.. math::
    \nabla_\mu = \overline{\hat g} + \tilde\lambda\mu,\qquad
    \nabla_{\log\sigma} = \overline{\partial f/\partial\log\sigma} + (\lambda\sigma^2 - 1)/N,
    \qquad \tilde\lambda = \lambda/N.

**Reparameterisation.** For every parameter outside an ``nn.Linear`` the weights are sampled,
θ = μ + σ⊙ε, the closure's backward pass gives ĝ = ∂f/∂θ, and ∂f/∂log σ = ĝ⊙ε⊙σ. For ``nn.Linear`` layers
(``local_reparam=True``) the pre-activations are sampled instead: a forward hook turns the layer's output
x μᵀ + b_μ into

.. math::
    x\mu^\top + b_\mu + \sqrt{x^2(\sigma^2)^\top + \sigma_b^2}\odot\varepsilon,\qquad
    \varepsilon \sim \mathcal N(0, I) \text{ per example and unit},

the exact distribution of the layer's output under q, with independent weights per example. Its gradient
has a lower variance, and autograd gives ∂f/∂log σ through the hook. (A layer called several times in one
forward pass gets independent noise at each call.)

**Why log σ.** σ = exp(ρ) with ρ = log σ, rather than Blundell's softplus(ρ): Adam moves ρ by a bounded amount
per step, so σ changes by a bounded *ratio* whether it is 0.3 or 10⁻⁴ (the posterior standard deviations of a
network span orders of magnitude); the entropy term −Σ log σ is linear in ρ; and 1/σ² = exp(−2ρ) is exact
for any ρ, where softplus loses precision for small σ. σ > 0 holds by construction.

**Prediction.** ``sampled_params()`` (train=False, what :func:`ngvi.predict` uses) draws one weight sample
θ ~ q for all layers, so one forward pass is one function drawn from the posterior and outputs for
different inputs are coherent. The local trick is only used for the gradient inside ``step``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .. import _validation as check
from .._tensorlist import TensorList
from ..optim import functional as cores
from ..optim.engine.optimizer import VariationalOptimizer
from ..posterior import DiagonalGaussian
from ._local_reparam import LocalReparameterisation, LogStdGradient

__all__ = ["BBVI"]


class BBVI(VariationalOptimizer):
    """Bayes by Backprop: mean-field Gaussian VI trained by Adam on (μ, log σ).

    Args:
        model: the network; its parameters hold μ (so ``model.state_dict()`` is the posterior mean).
            Every trainable parameter gets a Gaussian posterior; frozen ones (``requires_grad=False``)
            stay fixed and are left out of ``posterior()``, which follows ``model.parameters()`` order.
        data_size: N, the number of training examples (the closure returns a mean over a minibatch).
        lr: Adam's step size for both μ and log σ.  betas: Adam's (β₁, β₂).  eps: Adam's ε.
        prior_prec: λ of the prior N(0, I/λ).
        init_prec: 1/σ² at t=0 for every weight (Khan et al. 2018, App. J.1, use 10); μ starts at the
            model's current weights.
        mc_samples: posterior samples per ``step``; the gradients are averaged.
        local_reparam: sample the pre-activations of ``nn.Linear`` layers (local reparameterisation)
            instead of their weights while training.
        **engine_kwargs: ``seed``, ``skip_nonfinite``: as for every ngvi optimizer
            (:class:`~ngvi.VariationalOptimizer`).

    Use it as every ngvi optimizer: the closure zeroes the gradients, returns the mean NLL of the minibatch
    and calls ``backward()``; ``step`` calls it ``mc_samples`` times, each at a fresh posterior sample, and
    adds KL(q‖p)/N itself. It returns the mean of the closure's losses (the NLL term of the per-example
    negative ELBO; add ``kl_divergence() / N`` for the whole objective). The manual form,
    ``with bbvi.sampled_params(train=True): ...backward()`` a few times and then ``bbvi.step()``, works too.
    ``sampled_params()`` for prediction draws one weight sample for every layer (see the module docstring).
    A checkpoint is ``model.state_dict()`` (μ) plus ``bbvi.state_dict()`` (log σ, Adam's moments, the RNG).

    Raises:
        ValueError: for a bad argument, or when ``local_reparam=True`` and a Linear layer's parameter is
            shared with another module (tied weights); pass ``local_reparam=False`` there.
    """

    curvatures = ("log_std_grad",)  # ∂f/∂log σ travels in the engine's ĥ slot (see LogStdGradient)

    @classmethod
    def builds_from_model(cls, **options: Any) -> bool:
        """True: BBVI takes the model (it hooks its Linear layers). ``takes_model`` stays False: to the engine
        and the Hugging Face Trainer it means a curvature estimator that hooks the model for per-example
        statistics (one backward pass per sample), which BBVI's ∂f/∂log σ is not."""
        return True

    def __init__(
        self,
        model: nn.Module,
        data_size: int,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        prior_prec: float = 1.0,
        init_prec: float = 10.0,
        mc_samples: int = 1,
        *,
        local_reparam: bool = True,
        eps: float = 1e-8,
        **engine_kwargs: Any,
    ):
        check.model(model, "BBVI", "so that it can hook its Linear layers")
        if not isinstance(local_reparam, bool):
            raise ValueError(f"local_reparam must be a bool, got {local_reparam!r}")
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("model has no trainable parameters")
        defaults = dict(
            data_size=data_size, lr=lr, betas=betas, prior_prec=prior_prec, init_prec=init_prec, eps=eps
        )
        self.local_reparam = local_reparam
        self.local_trick = LocalReparameterisation(_linear_layers(model) if local_reparam else [])
        estimator = LogStdGradient(self.local_trick)
        super().__init__(
            params,
            defaults,
            mc_samples=mc_samples,
            curvature=estimator,
            plugins=(self.local_trick,),
            **engine_kwargs,
        )
        self.local_trick.bind(self)

    # ------------------------------------------------------------------------------------------------
    # The rule
    # ------------------------------------------------------------------------------------------------
    def _check_group(self, group):
        check.data_size(group["data_size"])
        check.nonnegative("lr", group["lr"])
        check.betas("betas", group["betas"])
        check.positive("prior_prec", group["prior_prec"])
        check.positive("init_prec", group["init_prec"])
        check.positive("eps", group["eps"])

    def _init_state(self, group, p, state):
        state["log_std"] = torch.full_like(p, -0.5 * math.log(group["init_prec"]))
        state["exp_avg"] = torch.zeros_like(p)
        state["exp_avg_sq"] = torch.zeros_like(p)
        state["log_std_exp_avg"] = torch.zeros_like(p)
        state["log_std_exp_avg_sq"] = torch.zeros_like(p)

    @staticmethod
    def _std(states: list[dict[str, Any]]) -> TensorList:
        return TensorList(torch._foreach_exp([st["log_std"] for st in states]))

    def _precision_core(self, group, states):
        return cores.exp_precision, ([st["log_std"] for st in states],), {}

    def unsampled(self, p: Tensor, train: bool) -> bool:
        return train and p in self.local_trick.params  # sampled through its layer's outputs: no weight noise

    def _perturb(self, group, params, noise, states):
        """θ ← μ + σ⊙ε (the engine leaves out the Linear layers the local trick samples while training)."""
        params.addcmul_(noise, self._std(states))

    def _update(self, group, means, grads, curvs, states):
        beta1, beta2 = group["betas"]
        cores.run_core(
            cores.bbvi_update_,
            means,
            [st["log_std"] for st in states],
            grads,
            curvs,  # ∂f/∂log σ
            *([st[k] for st in states] for k in _ADAM_STATE),
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            eps=group["eps"],
            prior_prec=group["prior_prec"],
            data_size=float(group["data_size"]),
            bias1=cores.bias_corrections(beta1, states),
            bias2=cores.bias_corrections(beta2, states),
            compile=self.compile,
        )

    # ------------------------------------------------------------------------------------------------
    # The objective
    # ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def kl_divergence(self) -> Tensor:
        """KL(q‖p) summed over all weights (float64); the per-example negative ELBO is loss + KL/N."""
        total = torch.zeros((), dtype=torch.float64)
        for group in self.param_groups:
            params = self.trainable(group)
            if not params:
                continue
            states = [self.state_of(group, p) for p in params]
            q = DiagonalGaussian([self.mean_of(p) for p in params], list(self._std(states).square()))
            prior = DiagonalGaussian.isotropic(q.mean, group["prior_prec"])
            total = total + q.kl(prior).cpu()
        return total


def _linear_layers(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The model's Linear layers with a trainable parameter; refuses parameters shared with other modules."""
    layers = [
        (name or type(model).__name__, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and any(p.requires_grad for p in m.parameters(recurse=False))
    ]
    owner = {p: name for name, m in layers for p in m.parameters(recurse=False)}
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            continue
        for pname, p in m.named_parameters(recurse=False):
            if p in owner:
                raise ValueError(
                    f"parameter '{name}.{pname}' is shared with Linear layer '{owner[p]}'; the local "
                    "reparameterisation samples that layer's outputs, not its weights, so a shared weight "
                    "would go unsampled elsewhere. Create BBVI(..., local_reparam=False)"
                )
    return layers


# Adam's moments of μ and of log σ, in the order bbvi_update_ takes them (the Adam step itself is the shared
# block ngvi.optim.functional.adam_moments_ / adam_step_, in torch.optim.Adam's rounding order)
_ADAM_STATE = ("exp_avg", "exp_avg_sq", "log_std_exp_avg", "log_std_exp_avg_sq")
