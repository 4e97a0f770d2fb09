"""Noisy K-FAC's per-layer cores (matrix products, not element-wise: eager only)."""

from __future__ import annotations

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
    grad: Tensor,
    mean: Tensor,
    a_inv: Tensor,
    s_inv: Tensor,
    *,
    gamma_in: float,
    momentum: float = 0.0,
    buffer: Tensor | None = None,
) -> Tensor:
    r"""NNG Alg. 2's preconditioned step for one layer block [G, rows, cols], out of place (``grad`` is
    consumed): :math:`V = \hat g + \gamma_{in}M`, step :math:`= [S^\gamma]^{-1} V [A^\gamma]^{-1}`, and with
    momentum the heavy-ball buffer m·buf + step (the new buffer is the returned step)."""
    v = grad.add_(mean, alpha=gamma_in)  # V = ĝ + γ_in M
    step = kfac_precondition(v, a_inv, s_inv)
    if momentum and buffer is not None:
        step = buffer.mul(momentum).add_(step)
    return step


def kfac_precondition(v: Tensor, a_inv: Tensor, s_inv: Tensor) -> Tensor:
    r""":math:`[S^\gamma]^{-1} V [A^\gamma]^{-1}` for a layer block V [G, rows, cols]."""
    return s_inv @ v @ a_inv
