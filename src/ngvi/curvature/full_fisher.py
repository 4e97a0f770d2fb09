r"""Per-example gradients of a whole (small) model from its layer hooks, and their outer products.

For the full-covariance noisy natural gradient (NNG-full) the curvature is the dense Fisher over all
parameters, estimated from the per-example gradients gᵢ of one minibatch,

.. math::
    \hat F = \frac1M\sum_{i=1}^M g_i g_i^\top \in \mathbb R^{D\times D},

with the targets of the closure ("ef") or targets sampled from the model ("fisher", the true Fisher). The
gradients come from the same hooks as VOGN's and K-FAC's statistics (:mod:`.hooks`): for a layer with input
positions t (one for a plain Linear layer), gᵢ(W) = Σₜ δᵢₜ aᵢₜᵀ and gᵢ(b) = Σₜ δᵢₜ, in the layout of
:mod:`.layers` (:func:`per_example_grads`). D² numbers are formed per step, so this is for models of a few
thousand parameters.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .._tensorlist import TensorList
from .estimators import CurvatureInput
from .hooks import CurvatureHooks
from .layer import LayerCurvature

__all__ = ["PerExampleOuterProducts", "per_example_grads"]


def per_example_grads(hooks: CurvatureHooks) -> dict[Tensor, Tensor]:
    """{parameter: [M, *shape]} per-example gradients ∇fᵢ of every hooked layer that got a gradient in the
    current recording (positions and repeated calls of a layer summed per example)."""
    scale = hooks._scale(hooks.batch_size())
    out: dict[Tensor, Tensor] = {}
    for i, layer in enumerate(hooks.layers):
        calls = hooks._calls(i)
        if not calls:
            continue
        module, kind = layer.module, layer.kind
        dtype = module.weight.dtype
        batch = calls[0].x.shape[0]
        w_sum = b_sum = None
        for call in calls:
            g = kind.grads(module, call.grad.to(dtype)) * scale  # [M, G, T, o]
            if layer.weight is not None:
                a = kind.acts(module, call.x, 0, batch).to(dtype)  # [M, G, T, d]
                w = torch.einsum("mgto,mgtd->mgod", g, a)
                w_sum = w if w_sum is None else w_sum + w
            if layer.bias is not None:
                b = g.sum(2)
                b_sum = b if b_sum is None else b_sum + b
        if w_sum is not None:
            out[layer.weight] = w_sum.reshape(batch, *layer.weight.shape)
        if b_sum is not None:
            out[layer.bias] = b_sum.reshape(batch, *layer.bias.shape)
    return out


class PerExampleOuterProducts(LayerCurvature):
    """F̂ = (1/M) Σᵢ gᵢgᵢᵀ over all of the optimizer's parameters (in its order), flattened, travelling with
    the first parameter (the others carry a one-element placeholder), as the engine's ĥ."""

    owner = "NNGFull"

    def __init__(self, model: nn.Module, targets: str = "ef", **kwargs: Any) -> None:
        super().__init__(model, targets, **kwargs)

    def estimate(self, sample: CurvatureInput) -> TensorList:
        self.require_all(sample)
        self.mean_gradient_(sample.grads)
        grads = per_example_grads(self.hooks)
        missing = [p for p in sample.params if p not in grads]
        if missing:
            raise self.missing(missing)
        flat = torch.cat([grads[p].reshape(grads[p].shape[0], -1) for p in sample.params], dim=1)
        fisher = (flat.mT @ flat).div_(flat.shape[0])
        return TensorList([fisher.reshape(-1), *(p.new_zeros(1) for p in sample.params[1:])])
