r"""How a curvature state forgets its start (issue 44): ``forget_start``.

Every diagonal rule keeps its curvature as an average, s ← (1 − ρ)s + ρĥ with a constant weight ρ (VON's and
VOGN's β = 10⁻³, Vprop's β, 1 − β₂ for Vadam, noisy Adam and IVON: 10⁻³, 10⁻³ and 10⁻⁵). After t steps the
start s₀ still has the weight (1 − ρ)ᵗ: e^{−2} after 2,000 steps at ρ = 10⁻³, and 0.94 after 6,000 at IVON's
ρ = 10⁻⁵. For a weight the data do not constrain (ĥ = 0, e.g. the output weight of a unit that is never
active on the training inputs) the precision stays N(1 − ρ)ᵗs₀ + λ instead of the prior's λ: with ngvi's
start s₀ = 1 and N = 200 that is 27 + λ after 2,000 steps of VON and 189 + λ after 6,000 of IVON.

``forget_start`` = ρₑ is a faster weight for the first steps, long enough to forget the start:

.. math::
    \rho_t = \max(\rho, \rho_e)\ \text{for}\ t \le T_e,\quad \rho\ \text{after};\qquad
    T_e = \Big\lceil \ln(N s_0 / (r\lambda)) \,/\, {-\ln(1-\rho_e)} \Big\rceil,

so at T_e the start's part of the precision, N·s₀·(1 − ρₑ)^{T_e}, is r = 1% of the prior's λ (0 steps where
it is already). The early estimates are forgotten at the same exponential rate, which a running average
(ρ_t = 1/(t₀ + t), Adam's bias correction) does not do: it keeps the estimates made while the mean was still
far from the data with weight ~1/t (measured: ``benchmarks/forget_start.py``; docs/CHOOSING.md, "Defaults
that forget their start"). The rule's fixed point is unchanged (ρ_t = ρ after T_e). For N·s₀/λ = 200 and
ρₑ = 3·10⁻³, T_e = 3,300 steps.

ρₑ is a floor while t ≤ T_e: a schedule of the rule's own weight (β, β₂) below it is overridden then, so
pass ``forget_start=None`` when you schedule the curvature weight yourself.

``forget_start="auto"`` is :data:`EARLY_RATE` with ngvi's start (``init_prec="auto"``; IVON, which has no
``init_prec``, always) and the rule's constant weight with a start the caller chose (``init_prec=None``, the
papers', or a number: what the golden trajectories and the experiments' protocols pin; ``kl_clip="auto"``
stays on for a number); ``None`` is the constant weight; a number in (0, 1] is ρₑ.

**Per rule** (docs/CHOOSING.md has the numbers): ``"auto"`` is the default of IVON (whose β₂ = 0.99999 keeps
h₀ for ~10⁵ steps), noisy Adam and Vprop; VON, VOGN and Vadam keep their constant weight by default
(``forget_start=None``), which forgets s₀ as e^{−10⁻³t}: on the issue's toy MLP (N = 512, 200 steps) the
faster forgetting widened their posterior towards its true width early, and their train loss at the mean
went from at most 2.7–3.1× Adam's to 3.4–4.5× (the bounds tests/optim/test_defaults.py keeps: 3×, VOGN
3.5×); pass ``forget_start="auto"`` to have it. The K-FAC family (NoisyKFAC, NNGBlkTri, NNGFull) takes it
too, on its factors' weight, off by default: with it NNG-full reaches the exact posterior of a linear
regression, while noisy K-FAC's factored damping keeps an unconstrained weight far from the prior either way.
"""

from __future__ import annotations

import math
from typing import Any

from .engine.prior import initial_curvature_value

AUTO = "auto"
#: ρₑ of ``forget_start="auto"`` (docs/CHOOSING.md, "Defaults that forget their start"): 10⁻² forgot
#: faster still, but cost every rule its training speed on the toy MLP
EARLY_RATE = 3e-3
#: the start's part of the precision at the end of the early phase, as a fraction of the prior's
RESIDUAL = 1e-2
#: the start/prior ratio used when the prior precision is 0 (no prior: forget to 10⁻¹⁰ of the start)
_NO_PRIOR_RATIO = 1e8


def early_rate_of(group: dict[str, Any]) -> float | None:
    """ρₑ of a group, or None for the rule's constant weight (module docstring). A group without the key
    (a checkpoint saved before it existed) is ``"auto"``; a group without ``init_prec`` (IVON) has ngvi's
    start."""
    rate = group.get("forget_start", AUTO)
    if isinstance(rate, str) and rate == AUTO:
        init = group.get("init_prec", AUTO)
        return EARLY_RATE if isinstance(init, str) and init == AUTO else None
    return rate


def check_forget_start(group: dict[str, Any]) -> None:
    """``forget_start``: ``"auto"``, None or a number in (0, 1]."""
    rate = group.get("forget_start", AUTO)
    if rate is None or (isinstance(rate, str) and rate == AUTO):
        return
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1:
        raise ValueError(
            f"forget_start must be 'auto', None or the early curvature weight in (0, 1] (e.g. 0.01), "
            f"got {rate!r}"
        )


def early_steps(rate: float, start_over_prior: float) -> int:
    """T_e: steps at weight ``rate`` that take the start's precision from ``start_over_prior`` times the
    prior's to :data:`RESIDUAL` times it (0 if it is there already; the whole start if ``rate`` = 1)."""
    ratio = start_over_prior / RESIDUAL
    if not ratio > 1:
        return 0
    if rate >= 1:
        return 1
    return math.ceil(math.log(ratio) / -math.log1p(-rate))


def update_weight(rate: float, step: int, group: dict[str, Any], start: float, prior: float) -> float:
    """ρ_t for the ``step``-th update (t ≥ 1) of a state whose start contributes ``start`` to the precision
    against the prior's ``prior`` (any common unit): ρₑ while t ≤ T_e and ρₑ > ρ, else ``rate`` itself (the
    same object, so that the update is bitwise the constant-weight one)."""
    early = early_rate_of(group)
    if early is None or early <= rate or start <= 0:
        return rate
    ratio = start / prior if prior > 0 else _NO_PRIOR_RATIO
    return early if step <= early_steps(early, ratio) else rate


def decay(decay: float, step: int, group: dict[str, Any], start: float, prior: float) -> float:
    """The same for a rule written with the decay 1 − ρ (β₂): 1 − ρ_t, or ``decay`` itself."""
    rate = 1.0 - decay
    weight = update_weight(rate, step, group, start, prior)
    return decay if weight is rate else 1.0 - weight


def start_of(group: dict[str, Any]) -> tuple[float, float]:
    """(N·s₀, λ) of a rule whose precision is N(s + λ/N) (Vadam, Vprop, VON, VOGN): the start's and the
    prior's parts of q₀'s precision."""
    return group["data_size"] * initial_curvature_value(group), group["prior_prec"]


class ForgetsStart:
    """Mixin of the rules that take ``forget_start``: a group saved before it existed resumes with the
    constant weight it was trained with (``None``), so an old checkpoint continues as it did."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
        if isinstance(groups, list):
            groups = [{"forget_start": None, **g} if isinstance(g, dict) else g for g in groups]
            state_dict = {**state_dict, "param_groups": groups}
        super().load_state_dict(state_dict)  # type: ignore[misc]


def step_of(states: list[dict[str, Any]]) -> int:
    """The step count t of the update being made (the engine counts it before the update); tensors of a
    group step together, so the first state's."""
    return int(states[0]["step"])
