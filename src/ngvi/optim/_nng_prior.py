r"""NNG's prior convention, shared by noisy Adam and the Kronecker family (Zhang et al. 2018, §3).

The prior is N(0, ηI) (``prior_var`` η, or ``prior_prec`` = 1/η) and the KL term carries the weight λ
(``kl_weight``); in the curvature's units it is the intrinsic damping γ_in = λ/(Nη), added to the gradient
(γ_in·μ) and to the curvature (q's precision is (N/λ)(F + γ_in)). ``init_prec`` sets the curvature q starts
from: ``"auto"`` F₀ = 1 (one unit per example), ``None`` F₀ = 0 (the prior), a number c the precision c,
F₀ = λc/N − γ_in.
"""

from __future__ import annotations

from typing import Any

from .. import _validation as check
from .engine.prior import AUTO


def check_prior(group: dict[str, Any]) -> None:
    """prior_var > 0, kl_weight > 0, damping ≥ 0 and an init_prec no wider than the prior."""
    check.positive("prior_var", group["prior_var"])
    check.positive("kl_weight", group["kl_weight"])
    check.nonnegative("damping", group["damping"])
    check.init_prec(group["init_prec"], 1.0 / group["prior_var"])


def intrinsic_damping(group: dict[str, Any]) -> float:
    """γ_in = λ/(Nη)."""
    return group["kl_weight"] / (group["data_size"] * group["prior_var"])


def initial_curvature(group: dict[str, Any]) -> float:
    """F₀: 1 for ``init_prec="auto"``, 0 for ``None``, else λc/N − γ_in for a precision c."""
    init = group["init_prec"]
    if init is None:
        return 0.0
    if init == AUTO:
        return 1.0
    return max(group["kl_weight"] * init / group["data_size"] - intrinsic_damping(group), 0.0)
