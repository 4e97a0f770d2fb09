"""Noisy K-FAC's per-layer cores (matrix products, not element-wise: eager only)."""

from __future__ import annotations

from torch import Tensor


def kfac_factor_ema(
    a: Tensor, s: Tensor, a_hat: Tensor, s_hat: Tensor, weight: float
) -> tuple[Tensor, Tensor]:
    r"""NNG eq. 12, out of place: :math:`A \leftarrow (1-w)A + w\hat A`,
    :math:`S \leftarrow (1-w)S + w\hat S`."""
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
    step = s_inv @ v @ a_inv
    if momentum and buffer is not None:
        step = buffer.mul(momentum).add_(step)
    return step
