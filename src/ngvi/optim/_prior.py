"""Where a diagonal posterior starts: s₀ from the prior and the initial precision."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def initial_curvature(group: dict[str, Any], p: Tensor) -> Tensor:
    """s₀ = (init_prec − λ)/N, shaped like p, so that q₀ has precision N(s₀ + λ/N) = init_prec;
    zero for ``init_prec=None`` (q₀ is the prior)."""
    init, prior, n = group["init_prec"], group["prior_prec"], group["data_size"]
    return torch.full_like(p, 0.0 if init is None else (init - prior) / n)
