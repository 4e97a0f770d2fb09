r"""Where a posterior starts: s₀ from the prior and the initial precision.

``init_prec`` takes three kinds of value in every rule with a curvature state s (Vadam, Vprop, VON, VOGN;
noisy Adam's f and noisy K-FAC's factors follow the same convention):

* ``"auto"`` (the default): one unit of curvature per example, s₀ = 1, so q₀ has precision N + λ and
  σ₀ ≈ 1/√N (IVON's ``hess_init=1``). Weights then start with little noise and the variance is learned at
  the rate of the curvature EMA (docs/CHOOSING.md).
* ``None``: q₀ is the prior, s₀ = 0 (the papers' and the authors' code's start).
* a number: that precision, s₀ = (init_prec − λ)/N.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

#: ``init_prec="auto"``: s₀ = 1, one unit of curvature per example
AUTO = "auto"


def initial_curvature_value(group: dict[str, Any]) -> float:
    """s₀ of ``group``: 1 for ``init_prec="auto"``, 0 for ``None``, else (init_prec − λ)/N."""
    init, prior, n = group["init_prec"], group["prior_prec"], group["data_size"]
    if init is None:
        return 0.0
    if init == AUTO:
        return 1.0
    return (init - prior) / n


def initial_precision(group: dict[str, Any]) -> float:
    """The precision of q₀, N·s₀ + λ."""
    return group["data_size"] * initial_curvature_value(group) + group["prior_prec"]


def initial_curvature(group: dict[str, Any], p: Tensor) -> Tensor:
    """s₀ shaped like p (:func:`initial_curvature_value`), so that q₀ has precision N(s₀ + λ/N)."""
    return torch.full_like(p, initial_curvature_value(group))


#: κ of ``kl_clip="auto"``: the trust region of ngvi's starts (docs/CHOOSING.md, the loss's scale). With the
#: preconditioner at one unit of curvature per example it caps the first step at ‖Δμ‖ ≤ √κ = 0.1, the step
#: α = 0.1 takes on a unit-scale gradient.
KL_CLIP = 1e-2


def kl_clip_of(group: dict[str, Any]) -> float | None:
    """κ of a rule's trust region on its natural step, or None for none: the one meaning of ``"auto"`` for
    every rule and family (docs/CHOOSING.md, "The trust region").

    ``"auto"`` is :data:`KL_CLIP` for every start but the papers' (``init_prec=None``, q₀ the prior, which
    the golden trajectories and the experiments' protocols pin with their own step sizes): ngvi's start
    (``"auto"``), a number, IVON's ``hess_init`` and VadaGrad's ``init_prec``. A number is κ; None: no region.
    A checkpoint saved before its rule had ``kl_clip`` resumes with None: the region it never had."""
    kappa = group.get("kl_clip", AUTO)
    if isinstance(kappa, str) and kappa == AUTO:
        return None if "init_prec" in group and group["init_prec"] is None else KL_CLIP
    return kappa


def check_kl_clip(group: dict[str, Any]) -> None:
    """``kl_clip``: ``"auto"``, None or a positive number (inf: no cap)."""
    kappa = group.get("kl_clip", AUTO)
    if kappa is None or (isinstance(kappa, str) and kappa == AUTO):
        return
    if isinstance(kappa, bool) or not isinstance(kappa, int | float) or not kappa > 0:
        raise ValueError(f"kl_clip must be 'auto', None or a positive number, got {kappa!r}")
