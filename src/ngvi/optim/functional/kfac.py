"""Noisy K-FAC's per-layer cores (matrix products, not element-wise: eager only)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def kfac_factor_ema(
    a: Tensor, s: Tensor, a_hat: Tensor, s_hat: Tensor, weight: float, *, into_hats: bool = False
) -> tuple[Tensor, Tensor]:
    r"""NNG eq. 12, out of place: :math:`A \leftarrow (1-w)A + w\hat A`,
    :math:`S \leftarrow (1-w)S + w\hat S`. ``into_hats`` writes the results over Â and Ŝ (the same values:
    it saves allocating, and on CPU first touching, a fresh copy of each factor every step)."""
    if into_hats:
        return torch.lerp(a, a_hat, weight, out=a_hat), torch.lerp(s, s_hat, weight, out=s_hat)
    return a.lerp(a_hat, weight), s.lerp(s_hat, weight)


def kfac_natural_step(
    grads: Sequence[Tensor],
    means: Sequence[Tensor],
    a_inv: Tensor,
    s_inv: Tensor,
    *,
    gamma_in: float,
    momentum: float = 0.0,
    buffer: Tensor | None = None,
) -> Tensor:
    r"""NNG Alg. 2's preconditioned step for one layer, out of place: :math:`V = \hat g + \gamma_{in}M` as one
    block [G, rows, cols] (``grads`` and ``means``: the layer's parameters, weight then bias, each written
    into its columns: no concatenation), step :math:`= [S^\gamma]^{-1} V [A^\gamma]^{-1}`, and with momentum
    the heavy-ball buffer m·buf + step (the new buffer is the returned step)."""
    groups, rows, cols = s_inv.shape[0], s_inv.shape[-1], a_inv.shape[-1]
    v = grads[0].new_empty(groups, rows, cols)
    start = 0
    for g, m in zip(grads, means, strict=True):
        g, m = g.reshape(groups, rows, -1), m.reshape(groups, rows, -1)
        torch.add(g, m, alpha=gamma_in, out=v[..., start : start + g.shape[-1]])
        start += g.shape[-1]
    step = s_inv @ v @ a_inv
    if momentum and buffer is not None:
        step = buffer.mul(momentum).add_(step)
    return step
