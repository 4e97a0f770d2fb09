"""Precision cores: q = N(μ, 1/precision); they return new tensors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..._tensorlist import TensorList
from ._capture import Num, Nums, Tensors, _add, _add_, _div, _mul


def scaled_precision(state: Tensors, *, scale: Num, shift: Num) -> list[Tensor]:
    """scale·s + shift, e.g. Vadam and Vprop: N·s + λ (the multiplication first: their rounding)."""
    return _add_(_mul(TensorList(state), scale), shift).tensors


def shifted_precision(state: Tensors, *, shift: Num, scale: Num) -> list[Tensor]:
    """(s + shift)·scale, e.g. VON: N(s + λ̃), IVON: N(h + δ), noisy Adam: (N/λ)(f + γ_in)."""
    return _add(TensorList(state), shift).mul_(scale).tensors


def identity_precision(state: Tensors) -> list[Tensor]:
    """A copy of s (VadaGrad: 1/σ² = s)."""
    return [t.clone() for t in state]


def exp_precision(log_std: Tensors) -> list[Tensor]:
    """1/σ² = 1/exp(ρ)² (BBVI's log-σ parametrisation)."""
    return TensorList(torch._foreach_exp(list(log_std))).square().reciprocal_().tensors


def laplace_precision(
    exp_avg_sq: Tensors, *, bias2: Nums, eps: Num, data_size: Num, prior_prec: Num
) -> list[Tensor]:
    r"""BADAM eq. 12 plus the prior: N(√v̂ + ε) + λ with v̂ = v/(1−β₂ᵗ), ``bias2`` = 1−β₂ᵗ per tensor (1 at
    t = 0, where v = 0: v/1 is v exactly). Division is correctly rounded, so the foreach division is bitwise
    the per-tensor one it replaced."""
    v_hat = _div(TensorList(exp_avg_sq), bias2)
    return _add_(_add_(v_hat.sqrt_(), eps).mul_(data_size), prior_prec).tensors


def diagonal_sigma(
    *lists: Tensors, precision: Callable[..., list[Tensor]], keep_sqrt: bool = False, **hyper: Any
) -> tuple[list[Tensor] | None, list[Tensor]]:
    r"""σ = 1/√precision of a diagonal posterior, from a precision core and its arguments, as the engine's
    weight draw computes it (``precision(...)`` → ``sqrt_`` → ``reciprocal``), so the eager call is bitwise
    the engine's. Returns (√precision if ``keep_sqrt`` else None, σ). Through :func:`run_core` with
    ``compile=True`` the whole chain is one fused loop::

        run_core(diagonal_sigma, s, precision=scaled_precision, scale=N, shift=prior, compile=True)
    """
    sqrt_prec = TensorList(precision(*lists, **hyper)).sqrt_()
    if keep_sqrt:
        return sqrt_prec.tensors, sqrt_prec.reciprocal().tensors
    return None, sqrt_prec.reciprocal_().tensors
