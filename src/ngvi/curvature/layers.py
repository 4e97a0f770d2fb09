r"""What each supported layer type contributes to per-example statistics.

Every supported layer computes, for example i and "position" t (a pixel of a conv output, a step of a
sequence, or a separate call of a layer used twice), per group g of a grouped conv,

.. math::
    s_{i,t} = W_g\, a_{i,t} + b_g, \qquad W_g \in \mathbb R^{o\times d},

so the gradient of example i's loss f_i is :math:`\nabla_{W_g} f_i = \sum_t \delta_{i,t}\, a_{i,t}^\top` with
:math:`\delta_{i,t} = \partial f_i/\partial s_{i,t}`. A :class:`LayerKind` only says how to view the recorded
layer input as activations ``a`` of shape [m, G, T, d] and the recorded output gradient as ``δ`` of shape
[M, G, T, o]; :mod:`ngvi.curvature.statistics` does the maths once for all kinds.

* ``nn.Linear`` (input [M, ..., d_in]): G = 1, T = the product of the middle dims (1 for a plain batch),
  a = the input rows.
* ``nn.Conv2d`` (KFC, Grosse & Martens 2016): T = the output pixels, a = the unfolded input patches
  (im2col), d = (C_in/G)·k_h·k_w in the weight's own (channel, row, column) order. Symmetric zero padding,
  stride and dilation go to ``F.unfold``; other padding ("same" with an even kernel, reflect, replicate,
  circular) is applied explicitly first, exactly as ``nn.Conv2d`` pads.

* ``nn.LayerNorm`` / ``nn.GroupNorm`` (elementwise affine): y = x̂ ⊙ w + b is, for every element k of w,
  a 1×1 layer on its own input x̂ₖ (the normalised input, recomputed from the recorded input). So
  G = numel(w), o = d = 1: VOGN gets the exact per-example squares and noisy K-FAC a 2×2 factor A (w and b)
  per element — a diagonal posterior over w (a block-diagonal one over each (wₖ, bₖ) pair).

* ``nn.BatchNorm1d/2d/3d`` (affine): the same 1×1 view, with x̂ normalised by the statistics the forward pass
  used — the batch's in training mode, the running ones in eval mode. Its parameters are **point
  estimates** (``point_estimate``): VOGN and noisy K-FAC train them with their mean update (the
  preconditioned step, with the prior as weight decay) and draw no noise for them. Osawa et al.'s VOGN
  code for "Practical deep learning with Bayesian principles" (2019; torchsso's ``non_reg_for_bn``) likewise
  gives the batch-norm parameters no noise (there also no prior); NNG's own code (gd-zhang/noisy-K-FAC,
  ``trainable_variables``: "we don't train the params of BN") keeps the scale and shift at 1 and 0, which
  ``requires_grad_(False)`` gives here. In
  training mode the batch statistics couple the examples, so the per-example gradients of the layers before
  a batch norm are those of the batch-coupled loss (as in every K-FAC implementation with batch norm); the
  batch norm's own ∇fᵢ = Σₜ δᵢₜ x̂ᵢₜ are exact given the batch.

Patches are unfolded for a slice of examples at a time (``acts(module, x, start, stop)``), which is what
keeps the memory of conv statistics bounded.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class LayerKind:
    """Views of one layer type's input and output gradient in the [examples, G, T, features] layout."""

    module_type: type[nn.Module]
    #: its parameters are point estimates (no posterior noise; see the module docstring)
    point_estimate: bool = False

    def groups(self, module: nn.Module) -> int:
        return 1

    def weight_block(self, module: nn.Module) -> tuple[int, int, int]:
        """(G, o, d): the weight is G blocks of o×d."""
        raise NotImplementedError

    def acts(self, module: nn.Module, x: Tensor, start: int, stop: int) -> Tensor:
        """Activations of examples [start, stop) as [m, G, T, d]."""
        raise NotImplementedError

    def grads(self, module: nn.Module, grad_output: Tensor) -> Tensor:
        """Output gradients as [M, G, T, o]."""
        raise NotImplementedError


class LinearKind(LayerKind):
    module_type = nn.Linear

    def weight_block(self, module):
        return 1, module.out_features, module.in_features

    def acts(self, module, x, start, stop):
        return x[start:stop].reshape(stop - start, 1, -1, module.in_features)

    def grads(self, module, grad_output):
        return grad_output.reshape(grad_output.shape[0], 1, -1, module.out_features)


class Conv2dKind(LayerKind):
    module_type = nn.Conv2d

    def groups(self, module):
        return module.groups

    def weight_block(self, module):
        g = module.groups
        return g, module.out_channels // g, module.weight[0].numel()

    @staticmethod
    def _pads(module: nn.Conv2d) -> tuple[int, int, int, int]:
        """F.pad's (left, right, top, bottom) for the module's padding, as nn.Conv2d applies it."""
        if isinstance(module.padding, str):
            if module.padding == "valid":
                return (0, 0, 0, 0)
            pads = []  # "same": total d(k−1), the odd pixel goes right/bottom (as torch does)
            for k, d in zip(reversed(module.kernel_size), reversed(module.dilation), strict=True):
                total = d * (k - 1)
                pads += [total // 2, total - total // 2]
            return tuple(pads)
        ph, pw = module.padding
        return (pw, pw, ph, ph)

    def acts(self, module, x, start, stop):
        x = x[start:stop]
        padding: tuple[int, int] | int = 0
        if module.padding_mode == "zeros" and not isinstance(module.padding, str):
            padding = module.padding  # symmetric zero padding: let unfold do it, without a padded copy
        elif any(pads := self._pads(module)):
            mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
            x = F.pad(x, pads, mode=mode)
        cols = F.unfold(
            x, module.kernel_size, dilation=module.dilation, padding=padding, stride=module.stride
        )
        g = module.groups
        return cols.view(cols.shape[0], g, cols.shape[1] // g, cols.shape[2]).transpose(2, 3)

    def grads(self, module, grad_output):
        m, g = grad_output.shape[0], module.groups
        return grad_output.reshape(m, g, module.out_channels // g, -1).transpose(2, 3)


class _AffineNormKind(LayerKind):
    """Normalisation layers y = x̂ ⊙ w + b: every element k of w is a 1×1 "layer" on its own input x̂ₖ,
    i.e. G = numel(w) groups with o = d = 1, and the positions are the other non-batch elements."""

    def weight_block(self, module):
        return module.weight.numel(), 1, 1

    def normalized(self, module: nn.Module, x: Tensor) -> Tensor:
        """x̂ as [M, K, T]: K elements of w, T positions per example."""
        raise NotImplementedError

    def acts(self, module, x, start, stop):
        return self.normalized(module, x[start:stop]).unsqueeze(-1)

    def grads(self, module, grad_output):
        return self._layout(module, grad_output).unsqueeze(-1)

    def _layout(self, module: nn.Module, t: Tensor) -> Tensor:
        raise NotImplementedError


class LayerNormKind(_AffineNormKind):
    """``nn.LayerNorm`` over the trailing ``normalized_shape``: x̂ = layer_norm(x) without the affine map."""

    module_type = nn.LayerNorm

    def normalized(self, module, x):
        x_hat = F.layer_norm(x, module.normalized_shape, None, None, module.eps)
        return self._layout(module, x_hat)

    def _layout(self, module, t):
        k = module.weight.numel()
        return t.reshape(t.shape[0], -1, k).transpose(1, 2)


class GroupNormKind(_AffineNormKind):
    """``nn.GroupNorm`` on [M, C, ...]: x̂ = group_norm(x) without the affine map; one w per channel."""

    module_type = nn.GroupNorm

    def normalized(self, module, x):
        return self._layout(module, F.group_norm(x, module.num_groups, None, None, module.eps))

    def _layout(self, module, t):
        return t.reshape(t.shape[0], t.shape[1], -1)


class BatchNormKind(_AffineNormKind):
    """``nn.BatchNorm1d/2d/3d`` on [M, C, ...]: x̂ = (x − m)/√(v + eps) per channel, with the statistics of
    the forward pass (the whole batch's in training mode, computed before any slicing; the running ones in
    eval mode); one w per channel. Point estimates (see the module docstring)."""

    module_type = nn.modules.batchnorm._BatchNorm
    point_estimate = True

    def acts(self, module, x, start, stop):
        if module.training or module.running_mean is None:
            dims = [0, *range(2, x.dim())]
            mean = x.mean(dims, keepdim=True)
            var = x.var(dims, unbiased=False, keepdim=True)
        else:
            shape = (1, -1, *[1] * (x.dim() - 2))
            mean, var = module.running_mean.view(shape), module.running_var.view(shape)
        x_hat = (x[start:stop] - mean) * (var + module.eps).rsqrt()
        return self._layout(module, x_hat).unsqueeze(-1)

    def _layout(self, module, t):
        return t.reshape(t.shape[0], t.shape[1], -1)


KINDS: dict[type[nn.Module], LayerKind] = {
    k.module_type: k for k in (LinearKind(), Conv2dKind(), LayerNormKind(), GroupNormKind(), BatchNormKind())
}


def kind_of(module: nn.Module) -> LayerKind | None:
    """The kind of a supported layer: one of :data:`KINDS` (or a subclass that keeps the stock forward)."""
    for base, kind in KINDS.items():
        if isinstance(module, base) and type(module).forward is base.forward:
            return kind
    return None
