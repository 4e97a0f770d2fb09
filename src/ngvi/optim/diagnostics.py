r"""Is the posterior variance being learned? ``opt.diagnostics()`` and the warnings the engine gives.

The commonest silent failure of these methods is a posterior precision that never leaves its start (IVON's
"the Hessian stays at hess_init"): curvature updates of relative size β (10⁻³–10⁻⁵ per step) round away in a
bfloat16 state, or the curvature step is 0. Precisions can also overflow (a float16 state holds at most
65504, less than N·s for N > 65504) or collapse. :func:`report` summarises a trainer in one pass over its
state:

* ``precision_moved``: the fraction of weights whose curvature state differs from its value at t = 0 (the
  state entry a rule names in its class attribute ``_curvature_state``, e.g. Vadam's second moment, IVON's h;
  for rules that name none, the posterior precision itself: NoisyKFAC's marginal precisions, BBVI's);
* quantiles of σ = 1/√precision and of the signal-to-noise ratio |μ|/σ (on at most 2²⁰ weights, evenly
  strided, so a large model costs one pass and no copy of all weights); point estimates (batch norm under
  VOGN and noisy K-FAC) are left out of every figure;
* the effective data size N of each parameter group, the step count and the skipped (non-finite) steps;
* ``at_float_limit``: weights whose precision is not finite, not positive, or within a factor 2 of the
  largest number of the state's dtype.

:func:`after_step` runs inside ``step()``: at the first step it warns if a low-precision state cannot hold
the curvature updates (step β below the dtype's resolution), and at steps 100, 1000, 10⁴, … it warns if
less than 1% of the precisions have moved or if any sit at the float limits. Each warning
(:class:`PosteriorWarning`, filterable with :mod:`warnings`) is given once per optimizer and names the fix.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .engine import empirical_bayes, mixed_precision, sharded

__all__ = ["Diagnostics", "PosteriorWarning", "after_step", "report"]

#: the quantiles of σ and of the SNR that :class:`Diagnostics` reports
QUANTILES = (0.01, 0.1, 0.5, 0.9, 0.99)
#: the steps after which the dynamic checks run (then every further factor 10)
FIRST_CHECK = 100
#: below this fraction of moved precisions the posterior counts as frozen
FROZEN_FRACTION = 0.01
_MAX_SAMPLE = 2**20


class PosteriorWarning(UserWarning):
    """The posterior variance is not being learned, or has hit the limits of its floating-point type."""


@dataclass(frozen=True)
class Diagnostics:
    """A cheap summary of a trainer's posterior (see the module docstring). Fields that a trainer without a
    Gaussian posterior (MAP, MC dropout) cannot fill are None.

    ``optimizer``: the trainer's class name; ``steps`` and ``skipped_steps``: the steps taken and those
    skipped for a non-finite gradient; ``data_size``: N of each parameter group; ``precision_moved``: the
    fraction of weights whose curvature state differs from its value at t = 0 (below 1%: frozen, a
    :class:`PosteriorWarning`); ``sigma_quantiles`` and ``snr_quantiles``: σ and |μ|/σ at the quantiles
    ``QUANTILES``; ``at_float_limit``: the fraction of weights whose precision is not finite, not positive,
    or within a factor 2 of its dtype's largest number;
    ``state_dtypes``: the dtypes of the curvature state; ``learned_prior_prec``: λ of each group where it
    is learned in training (``empirical_bayes=``), else None."""

    optimizer: str
    steps: int
    skipped_steps: int
    data_size: list[int]
    precision_moved: float | None = None
    sigma_quantiles: dict[float, float] | None = None
    snr_quantiles: dict[float, float] | None = None
    at_float_limit: float | None = None
    state_dtypes: list[str] = field(default_factory=list)
    #: λ of each parameter group where it is learned during training (``empirical_bayes=``), else None
    learned_prior_prec: list[float] | None = None

    def __str__(self) -> str:
        def q(values: dict[float, float] | None) -> str:
            if values is None:
                return "n/a"
            return ", ".join(f"q{round(100 * k)}={v:.3g}" for k, v in values.items())

        moved = "n/a" if self.precision_moved is None else f"{100 * self.precision_moved:.1f}%"
        state = ", ".join(self.state_dtypes) or "n/a"
        limit = "n/a" if self.at_float_limit is None else f"{100 * self.at_float_limit:.2g}%"
        return "\n".join(
            [
                f"{self.optimizer}: {self.steps} steps ({self.skipped_steps} skipped), "
                f"data size {', '.join(map(str, self.data_size)) or 'n/a'}, state {state}",
                f"  precision moved from its start: {moved};  at float limits: {limit}",
                f"  sigma: {q(self.sigma_quantiles)}",
                f"  SNR |mu|/sigma: {q(self.snr_quantiles)}",
                *(
                    []
                    if self.learned_prior_prec is None
                    else [
                        "  learned prior precision: " + ", ".join(f"{v:.4g}" for v in self.learned_prior_prec)
                    ]
                ),
            ]
        )


# ------------------------------------------------------------------------------------------------------------
# The report
# ------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def report(opt: Any) -> Diagnostics:
    """:class:`Diagnostics` of a :class:`~ngvi.VariationalOptimizer` (one pass over its state)."""
    moved = total = limit = 0
    sigmas: list[Tensor] = []
    snrs: list[Tensor] = []
    dtypes: set[str] = set()
    for group in opt.param_groups:
        params = opt.trainable(group)
        if not params:
            continue
        states = [opt.state_of(group, p) for p in params]
        precisions = list(opt._precision(group, states))
        changed = _moved(opt, group, params, states, precisions)
        for p, st, prec, ch in zip(params, states, precisions, changed, strict=True):
            if opt.point_estimate(p):  # no posterior variance (batch norm under VOGN and noisy K-FAC)
                continue
            dtypes.update(str(t.dtype).replace("torch.", "") for t in _tensors(st))
            moved += int(ch.sum())
            total += ch.numel()
            limit += int(_at_limit(prec).sum())
            sigma = prec.float().rsqrt().flatten()
            sigmas.append(_strided(sigma))
            mean = sharded.local(opt.mean_of(p))  # under FSDP2 the report covers this rank's shards
            snrs.append(_strided(mean.float().abs().flatten() / sigma))
    return Diagnostics(
        optimizer=type(opt).__name__,
        steps=opt.num_steps,
        skipped_steps=opt.skipped_steps,
        data_size=data_sizes(opt),
        precision_moved=moved / total if total else None,
        sigma_quantiles=_quantiles(sigmas),
        snr_quantiles=_quantiles(snrs),
        at_float_limit=limit / total if total else None,
        state_dtypes=sorted(dtypes),
        learned_prior_prec=(
            None if getattr(opt, "empirical_bayes", None) is None else empirical_bayes.prior_precisions(opt)
        ),
    )


def data_sizes(opt: Any) -> list[int]:
    """The effective data size N of each parameter group (IVON's ess; none for VadaGrad)."""
    sizes = [g.get("data_size", getattr(opt, "data_size", None)) for g in opt.param_groups]
    return [int(n) for n in sizes if n is not None]


def _tensors(state: dict[str, Any]) -> list[Tensor]:
    return [t for t in state.values() if isinstance(t, Tensor) and t.is_floating_point()]


def _moved(
    opt: Any, group: dict[str, Any], params: list[Tensor], states: list[dict], precisions: list[Tensor]
) -> list[Tensor]:
    """Per weight: has its curvature state left the value it had at t = 0? Element-wise rules declare the
    state (``_curvature_state``) and start it at a constant, which is read off a one-element copy; for the
    others (NoisyKFAC's factors) the precision is compared with that of a fresh state of the group."""
    key = getattr(opt, "_curvature_state", None)
    if key is not None and opt._elementwise:
        return [st[key] != _initial_value(opt, group, p, key) for p, st in zip(params, states, strict=True)]
    fresh = []
    for p in params:
        st: dict[str, Any] = {}
        mixed_precision.init_state(opt, group, p, st)
        st["step"] = 0
        fresh.append(st)
    return [now != start for now, start in zip(precisions, opt._precision(group, fresh), strict=True)]


def _initial_value(opt: Any, group: dict[str, Any], p: Tensor, key: str) -> Tensor:
    """The constant that ``key`` of p's state starts at, in the state's dtype (a one-element tensor)."""
    data, fresh = p.data, {}
    dtype = torch.float32 if mixed_precision.promoted(opt, p) else p.dtype
    if sharded.is_sharded(p):  # an element-wise rule (the others refuse shards): a plain stand-in will do
        opt._init_state(group, torch.nn.Parameter(torch.zeros(1, dtype=dtype, device=data.device)), fresh)
        return sharded.local(fresh[key])
    p.data = torch.zeros(1, dtype=dtype, device=p.device)
    try:
        opt._init_state(group, p, fresh)
    finally:
        p.data = data
    return fresh[key]


def _at_limit(precision: Tensor) -> Tensor:
    big = torch.finfo(precision.dtype).max / 2
    return ~torch.isfinite(precision) | (precision <= 0) | (precision >= big)


def _strided(t: Tensor) -> Tensor:
    stride = max(1, math.ceil(t.numel() / _MAX_SAMPLE))
    return t[::stride].cpu()


def _quantiles(parts: list[Tensor]) -> dict[float, float] | None:
    if not parts:
        return None
    values = _strided(torch.cat(parts))
    values = values[torch.isfinite(values)]
    if not values.numel():
        return None
    qs = torch.quantile(values.double(), torch.tensor(QUANTILES, dtype=torch.float64))
    return {q: float(v) for q, v in zip(QUANTILES, qs, strict=True)}


# ------------------------------------------------------------------------------------------------------------
# The warnings
# ------------------------------------------------------------------------------------------------------------
def curvature_step(group: dict[str, Any]) -> float | None:
    """The relative step of the curvature state per update: β, or 1 − β₂ for rules with Adam's betas."""
    if "beta" in group:
        return float(group["beta"])
    if "betas" in group:
        return 1.0 - float(group["betas"][1])
    return None


def after_step(opt: Any) -> None:
    """The engine's checks after a step (cheap: a dictionary lookup on most steps)."""
    t = opt.num_steps
    if t == 1:
        _check_resolution(opt)
    if t >= FIRST_CHECK and _is_checkpoint(t):
        _check_moving(opt)


def _is_checkpoint(t: int) -> bool:
    k = t / FIRST_CHECK
    return k == 10 ** round(math.log10(k))


def _warn_once(opt: Any, kind: str, message: str) -> None:
    warned = opt.__dict__.setdefault("_posterior_warnings", set())
    if kind in warned:
        return
    warned.add(kind)
    warnings.warn(message, PosteriorWarning, stacklevel=7)  # the frame that called opt.step()


def _low_precision_state(opt: Any) -> list[tuple[dict[str, Any], torch.dtype]]:
    """(group, dtype) for each group whose state has a bfloat16/float16 tensor."""
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            dtypes = {t.dtype for t in _tensors(opt.state.get(p, {}))}
            low = [d for d in dtypes if d in mixed_precision.LOW_PRECISION]
            if low:
                out.append((group, low[0]))
                break
    return out


def _fix_low_precision(opt: Any) -> str:
    return (
        "keep the state in float32 with fp32_state=True (the default: a float32 copy of the state and of μ, "
        f"{type(opt).__name__}(..., fp32_state=True)) or train float32 parameters (under torch.autocast for "
        "bfloat16 compute)"
    )


def _check_resolution(opt: Any) -> None:
    for group, dtype in _low_precision_state(opt):
        step = curvature_step(group)
        eps = torch.finfo(dtype).eps
        name = str(dtype).replace("torch.", "")
        if step is not None and 0 < step < eps:
            _warn_once(
                opt,
                "frozen",  # the frozen check would later say the same
                f"{type(opt).__name__}: the posterior precision is updated by a fraction {step:.3g} of "
                f"itself per step, below the resolution of its {name} state ({eps:.3g}): these updates round "
                f"away, so the variance freezes (or its average can no longer decay). Fix: "
                f"{_fix_low_precision(opt)}.",
            )
            return


def _check_moving(opt: Any) -> None:
    d = report(opt)
    name = type(opt).__name__
    if d.precision_moved is not None and d.precision_moved < FROZEN_FRACTION:
        steps = [curvature_step(g) for g in opt.param_groups]
        low = _low_precision_state(opt)
        if any(s == 0 for s in steps):
            cause = "its curvature step is 0 (beta=0, or betas[1]=1), so the precision never moves"
            fix = "pass a positive curvature step (e.g. beta=1e-3, betas=(0.9, 0.999))"
        elif low:
            cause = f"its updates round away in the {str(low[0][1]).replace('torch.', '')} state"
            fix = _fix_low_precision(opt)
        else:
            cause = "its updates are below the resolution of the state (a large init_prec or a tiny step)"
            fix = "a smaller init_prec (or hess_init), a larger curvature step, or float64 parameters"
        _warn_once(
            opt,
            "frozen",
            f"{name}: after {d.steps} steps the posterior precision of only {100 * d.precision_moved:.2g}% "
            f"of the weights has moved from its initial value: {cause}. Fix: {fix}. "
            "(opt.diagnostics() shows the details.)",
        )
    if d.at_float_limit:
        dtypes = ", ".join(d.state_dtypes)
        _warn_once(
            opt,
            "limits",
            f"{name}: after {d.steps} steps the posterior precision of {100 * d.at_float_limit:.2g}% of the "
            f"weights is not finite, not positive or near the largest {dtypes} number: σ there is 0 or "
            "undefined. Fix: a float32 state (fp32_state=True, float32 parameters), a larger prior_prec or a "
            "smaller init_prec; for float16 note that N·s above 65504 overflows.",
        )
