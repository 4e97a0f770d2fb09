r"""Per-example squared gradients and Kronecker factors of one layer, from its recorded calls.

Notation of :mod:`ngvi.curvature.layers`: for example i, position t and group g the layer maps
:math:`a_{i,t}\in\mathbb R^d` to :math:`s_{i,t}\in\mathbb R^o`, and
:math:`\delta_{i,t}=\partial f_i/\partial s_{i,t}`.
Positions of all calls of a layer used several times are pooled (T = their total).
A backward pass of the minibatch loss leaves :math:`c\,\delta_{i,t}` at the layer output, so the recorded
gradient is multiplied by ``scale`` = 1/c (M for a mean loss, 1 for a sum or a sampled-target pass).

**Diagonal (VOGN).** The per-example gradient is :math:`G_i = \sum_t \delta_{i,t} a_{i,t}^\top` and
VOGN's curvature is :math:`\hat h = \frac1M\sum_i G_i\odot G_i`.

* One position per example (a plain Linear layer): :math:`\sum_i G_i^{\odot 2} = (\delta^{\odot 2})^\top
  (a^{\odot 2})`, one matrix product as large as the weight gradient's (Goodfellow 2015). No per-example
  gradient is formed.
* Several positions (Conv2d, sequences, a layer used twice): :math:`G_i` must be summed over t before it is
  squared. It is formed for a chunk of examples at a time, from the unfolded inputs of that chunk only,
  so the extra memory stays below ``chunk_bytes`` whatever the batch size.

The bias is the weight of a constant input 1: :math:`\hat h_b = \frac1M\sum_i(\sum_t\delta_{i,t})^{\odot 2}`.

**Kronecker factors (noisy K-FAC; KFC for convolutions, Grosse & Martens 2016).**

.. math::
    A = \frac1M\sum_i\sum_t \bar a_{i,t}\bar a_{i,t}^\top, \qquad
    S = \frac1{MT}\sum_i\sum_t \delta_{i,t}\delta_{i,t}^\top,

with :math:`\bar a = (a, 1)` when the bias is trained, so that weight and bias share one factor pair. For one
position per example these are K-FAC's E[āāᵀ] and E[δδᵀ]; for convolutions, KFC's Ω = E[Σₜ āāᵀ] and
Γ = E[(1/T) Σₜ δδᵀ], whose Kronecker product approximates the Fisher block of the whole layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .layers import LayerKind


@dataclass
class Call:
    """One forward call of a hooked layer: its input and the gradient that reached its output."""

    x: Tensor
    grad: Tensor | None = None


def mean_sq_grads(
    kind: LayerKind,
    module: nn.Module,
    calls: list[Call],
    *,
    scale: float,
    weight: bool,
    bias: bool,
    chunk_bytes: int,
) -> tuple[Tensor | None, Tensor | None]:
    r"""(1/M) Σᵢ Gᵢ² for the weight and for the bias (each None when not asked for), shaped like them."""
    dtype = module.weight.dtype
    batch = calls[0].x.shape[0]
    groups, rows, cols = kind.weight_block(module)
    grads = [kind.grads(module, c.grad.to(dtype)) for c in calls]  # [M, G, T, o]
    coef = scale * scale / batch
    w_sq = b_sq = None
    if len(calls) == 1 and groups == 1 and grads[0].shape[2] == 1:  # Goodfellow: no per-example gradients
        g2 = grads[0].reshape(batch, rows).square().mul_(coef)  # scaled here: M×o, not o×d, numbers
        if weight:
            a = kind.acts(module, calls[0].x, 0, batch).reshape(batch, cols).to(dtype)
            w_sq = torch.mm(g2.t(), a.square())
        if bias:
            b_sq = g2.sum(0)
    else:
        positions = sum(g.shape[2] for g in grads)
        per_example = groups * (2 * positions * cols + rows * cols + rows)  # patches (+ a copy), Gᵢ
        chunk = max(1, chunk_bytes // (per_example * torch.finfo(dtype).bits // 8))
        w_acc = grads[0].new_zeros(groups, rows, cols) if weight else None
        b_acc = grads[0].new_zeros(groups, rows) if bias else None
        for start in range(0, batch, chunk):
            stop = min(batch, start + chunk)
            if weight:
                per_ex = None  # Gᵢ for i in [start, stop): [m, G, o, d]
                for call, g in zip(calls, grads, strict=True):
                    a = kind.acts(module, call.x, start, stop).to(dtype)
                    if rows == cols == 1:  # normalisation layers: Σₜ δ·x̂ per element
                        term = (g[start:stop] * a).sum(2, keepdim=True)
                    else:
                        term = torch.matmul(g[start:stop].transpose(-1, -2), a)
                    per_ex = term if per_ex is None else per_ex.add_(term)
                w_acc.add_(per_ex.square_().sum(0))
            if bias:
                b_acc.add_(sum(g[start:stop].sum(2) for g in grads).square().sum(0))
        w_sq = w_acc.mul_(coef) if weight else None
        b_sq = b_acc.mul_(coef) if bias else None
    return (
        None if w_sq is None else w_sq.reshape(module.weight.shape),
        None if b_sq is None else b_sq.reshape(module.bias.shape),
    )


def kfac_factors(
    kind: LayerKind,
    module: nn.Module,
    calls: list[Call],
    *,
    scale: float,
    weight: bool,
    bias: bool,
    chunk_bytes: int,
) -> tuple[Tensor, Tensor]:
    """A [G, d', d'] and S [G, o, o]; d' = d (weight) + 1 (bias), counting only the trained parameters.

    Both are views of one buffer [vec A, vec S] (:func:`flat_factors` returns it), filled in place: no zero
    fill, no concatenation of the bias row and column, and (one call, one chunk: Linear layers) not even a
    copy of āᵀā, whose product writes into A's block."""
    dtype = module.weight.dtype
    device = calls[0].x.device
    batch = calls[0].x.shape[0]
    groups, rows, cols = kind.weight_block(module)
    width = (cols if weight else 0) + bias
    flat = torch.empty(groups * (width * width + rows * rows), dtype=dtype, device=device)
    a_out = flat[: groups * width * width].view(groups, width, width)
    s_acc = flat[groups * width * width :].view(groups, rows, rows)
    chunks = [_chunk(kind, module, c, groups * cols, dtype, chunk_bytes) for c in calls]
    single = len(calls) == 1 and chunks[0] >= batch
    # one product writes straight into A's block; several accumulate in a contiguous block (baddbmm_ on a
    # strided view would copy it for each product), copied into A once
    aa = None if not weight else a_out[:, :cols, :cols] if single or not bias else None
    a_sum = None  # Σ a (the bias cross-term)
    positions = 0
    for call, chunk in zip(calls, chunks, strict=True):
        g = kind.grads(module, call.grad.to(dtype))
        t = g.shape[2]
        flat_g = g.transpose(0, 1).reshape(groups, batch * t, rows)
        _accumulate(s_acc, flat_g.transpose(1, 2), flat_g, first=positions == 0)
        if weight:
            for start in range(0, batch, chunk):
                stop = min(batch, start + chunk)
                a = kind.acts(module, call.x, start, stop).to(dtype)
                a = a.transpose(0, 1).reshape(groups, (stop - start) * t, cols)
                if aa is None:
                    aa = torch.bmm(a.transpose(1, 2), a)
                else:
                    _accumulate(aa, a.transpose(1, 2), a, first=positions == 0 and start == 0)
                if bias:
                    a_sum = a.sum(1) if a_sum is None else a_sum.add_(a.sum(1))
        positions += t
    if weight and aa.data_ptr() != a_out.data_ptr():
        a_out[:, :cols, :cols] = aa
    s_acc.mul_(scale * scale / (batch * positions))
    if bias:
        a_out[:, width - 1, width - 1] = float(batch * positions)  # Σᵢ Σₜ 1·1
        if weight:
            a_out[:, :cols, cols] = a_sum
            a_out[:, cols, :cols] = a_sum
    return a_out.div_(batch), s_acc


def _chunk(kind: LayerKind, module: nn.Module, call: Call, width: int, dtype: torch.dtype, limit: int) -> int:
    """Examples per product so that a chunk of unfolded inputs (and its copy) stays within ``limit`` bytes."""
    positions = kind.grads(module, call.grad).shape[2]
    return max(1, limit // (2 * positions * width * torch.finfo(dtype).bits // 8))


def _accumulate(out: Tensor, x: Tensor, y: Tensor, *, first: bool) -> None:
    """out ← x @ y on the first product (no zero fill), out += x @ y after (bitwise 0 + x @ y, then the
    same baddbmm_)."""
    if first:
        torch.bmm(x, y, out=out)
    else:
        out.baddbmm_(x, y)


def flat_factors(a: Tensor, s: Tensor) -> Tensor:
    """[vec A, vec S]: the buffer that :func:`kfac_factors` wrote them into, or a copy of other factors."""
    base = a._base
    if (
        base is not None
        and s._base is base
        and base.numel() == a.numel() + s.numel()
        and a.data_ptr() == base.data_ptr()
        and a.is_contiguous()
        and s.is_contiguous()
    ):
        return base
    return torch.cat([a.reshape(-1), s.reshape(-1)])
