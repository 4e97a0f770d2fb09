r"""The prior precision learned during training: empirical Bayes (type-II maximum likelihood of the ELBO).

With ``empirical_bayes=`` (off by default) every rule with a prior updates its prior precision λ while it
trains. For q(w) = N(μ, Σ) and the isotropic prior N(0, I/λ) over the P weights of a block (a parameter
group, or one parameter tensor with ``per="layer"``), the part of the ELBO that depends on λ is

.. math::
    \mathbb E_q[\log p(w)] = \tfrac P2 \log\lambda - \tfrac\lambda2 \textstyle\sum_i (\mu_i^2 + \Sigma_{ii})
    + \text{const},

maximised at λ* = P / Σᵢ(μᵢ² + Σᵢᵢ). Only the marginal variances enter (the trace of Σ), so the same update
serves the diagonal rules and the K-FAC family's matrix-variate posterior; ``opt.posterior().variance``
gives them. Alternating this with the rule's own steps on q is EM on the ELBO; where q is the exact
posterior (a linear-Gaussian model whose mean-field posterior is exact) its fixed point is MacKay's,
λ = P / Σ(μ² + σ²), a stationary point of the log evidence. A KL weight κ (noisy Adam, the K-FAC family)
scales the whole term and does not move λ*.

Every ``every`` steps from step ``start`` (default: ``every``), after the rule's update, λ ← λ* of each block,
damped in log λ by ``decay`` (log λ ← decay·log λ + (1 − decay)·log λ*; 0 is the plain EM step), clipped to
``bounds``. The value is written into the rule's own group key, as :func:`ngvi.calibrate` writes it:
``prior_prec`` (Vadam, Vprop, VON, VOGN, BAdam, BBVI, K-FAC), ``weight_decay`` = λ/N (IVON) or ``prior_var``
= 1/λ (noisy Adam, noisy K-FAC, NNG-full, NNG-BlkTri); so the next step, ``posterior()``, ``state_dict()``
and a resumed run all use it, and the numeric meaning of those keys is unchanged. Two limits keep q valid:
a number given as ``init_prec`` caps λ (q₀ may not be wider than the prior, the rules' own check), and for
the diagonal rules, whose precision is (data part) + λ and whose data part may be negative (VON's and
IVON's Hessian estimates), λ falls in one update by at most half the smallest precision, so every
precision stays positive.

``per="layer"`` gives each parameter tensor its own λ by giving it its own parameter group (a copy of its
group's hyperparameters) when the optimizer is built; the rules that take the model keep all of its
parameters in one group, so for them only ``per="group"`` is offered. Each update reads two numbers per
group back to the host (a synchronisation every ``every`` steps, none in between).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch

#: the values of ``EmpiricalBayes.per``
PER = ("group", "layer")


@dataclass(frozen=True)
class EmpiricalBayes:
    """How the prior precision is learned (module docstring).

    Args:
        per: ``"group"`` (one λ per parameter group) or ``"layer"`` (one per parameter tensor).
        every: steps between updates.  start: the first step that updates (default ``every``).
        decay: weight of the old log λ in each update, in [0, 1) (0: λ ← λ*).
        bounds: (lowest, highest) λ.
    """

    per: str = "group"
    every: int = 100
    start: int | None = None
    decay: float = 0.0
    bounds: tuple[float, float] = (1e-8, 1e8)

    def __post_init__(self) -> None:
        if self.per not in PER:
            raise ValueError(f"empirical_bayes: per must be 'group' or 'layer', got {self.per!r}")
        for name in ("every", "start"):
            value = getattr(self, name)
            if name == "start" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"empirical_bayes: {name} must be a positive int, got {value!r}")
        d = self.decay
        if isinstance(d, bool) or not isinstance(d, int | float) or not 0 <= d < 1:
            raise ValueError(f"empirical_bayes: decay must be a number in [0, 1), got {d!r}")
        lo, hi = _pair(self.bounds)
        if not (0 < lo < hi < math.inf):
            raise ValueError(
                f"empirical_bayes: bounds must be (low, high) with 0 < low < high < inf, got {self.bounds!r}"
            )

    @property
    def first(self) -> int:
        return self.every if self.start is None else self.start

    def due(self, step: int) -> bool:
        """Whether the update runs after step ``step`` (counted from 1)."""
        return step >= self.first and (step - self.first) % self.every == 0


def _pair(bounds: Any) -> tuple[float, float]:
    """Two real numbers: a string such as "1e-3" is refused here, not at the first update."""
    try:
        lo, hi = bounds
    except (TypeError, ValueError):
        raise ValueError(f"empirical_bayes: bounds must be a pair (low, high), got {bounds!r}") from None
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in (lo, hi)):
        raise ValueError(
            f"empirical_bayes: bounds must be two numbers (low, high), got {bounds!r}; write e.g. (1e-3, 1e3)"
        )
    return float(lo), float(hi)


def configure(opt: Any, value: Any, defaults: dict[str, Any]) -> EmpiricalBayes | None:
    """The option as given to the optimizer: None/False (off), True or ``"group"``, ``"layer"``, or an
    :class:`EmpiricalBayes`; a clear error for anything else and for rules without a prior."""
    if value is None or value is False:
        return None
    if value is True:
        config = EmpiricalBayes()
    elif isinstance(value, str) and value in PER:
        config = EmpiricalBayes(per=value)
    elif isinstance(value, EmpiricalBayes):
        config = value
    else:
        raise ValueError(
            "empirical_bayes must be None, True, 'group', 'layer' or an ngvi.EmpiricalBayes(...), got "
            f"{value!r}"
        )
    name = type(opt).__name__
    if _key_of(defaults) is None:
        raise ValueError(
            f"{name} has no prior whose precision could be learned (empirical_bayes=): VadaGrad minimises "
            "E_q[F] without one; use ngvi.Vadam for a posterior under a learned prior"
        )
    if not opt._has_posterior:
        raise ValueError(
            f"{name} is a point estimate: with no posterior variance, maximising over λ is the joint MAP, "
            "which is not empirical Bayes (it drives λ to P/‖w‖²); use a rule with a posterior "
            "(ngvi.NoisyKFAC for K-FAC's)"
        )
    if config.per == "layer" and opt.takes_model:
        raise ValueError(
            f"{name} takes the model and keeps its parameters in one group, so empirical_bayes per='layer' "
            "is not offered for it; use per='group' (one λ for the model), or a rule that takes parameters "
            "(Vadam, Vprop, VON, IVON, BAdam) whose groups you may split yourself"
        )
    return config


def split_layers(opt: Any) -> None:
    """One parameter group per parameter tensor (``per="layer"``), each with a copy of its group's
    hyperparameters; called before any state exists. The groups made from one keep its trust region: their
    ``"region"`` key names the group they came from, and the step takes one ν over them (:mod:`.region`)."""
    groups = enumerate(opt.param_groups)
    opt.param_groups = [{**g, "params": [p], "region": ("split", i)} for i, g in groups for p in g["params"]]


#: the group key of λ and the maps value → λ, λ → value (as ngvi.calibrate's PRIOR_KEYS)
_KEYS = (
    ("prior_var", lambda v, g: 1.0 / v, lambda lam, g: 1.0 / lam),
    ("weight_decay", lambda v, g: v * g["data_size"], lambda lam, g: lam / g["data_size"]),
    ("prior_prec", lambda v, g: v, lambda lam, g: lam),
)


def _key_of(defaults: dict[str, Any]) -> tuple[str, Any, Any] | None:
    return next((k for k in _KEYS if k[0] in defaults), None)


def prior_key(opt: Any) -> tuple[str, Any, Any] | None:
    """(key, to λ, from λ) of the rule's prior, None for a rule without one (VadaGrad)."""
    return _key_of(opt.defaults)


def prior_precisions(opt: Any) -> list[float]:
    """λ of each parameter group, read from the rule's own key."""
    key = prior_key(opt)
    return [] if key is None else [float(key[1](g[key[0]], g)) for g in opt.param_groups]


@torch.no_grad()
def after_step(opt: Any) -> None:
    """The update of the module docstring, if due after ``opt.num_steps`` steps."""
    config = getattr(opt, "empirical_bayes", None)  # None also for an optimizer pickled before the option
    if config is None or not config.due(opt.num_steps):
        return
    update(opt, config)


@torch.no_grad()
def update(opt: Any, config: EmpiricalBayes) -> list[float]:
    """λ ← λ* (damped, bounded, kept feasible) in every group; the new λ of each group."""
    key, to_prior, from_prior = prior_key(opt)
    post = opt.posterior()
    sums, i = [], 0
    for group in opt.param_groups:
        params = opt.trainable(group)
        mean, var = post.mean[i : i + len(params)], post.variance[i : i + len(params)]
        i += len(params)
        if not params:
            sums.append(None)
            continue
        total = sum(m.double().square().sum() + v.double().sum() for m, v in zip(mean, var, strict=True))
        widest = torch.stack([v.double().max() for v in var]).max()
        sums.append((torch.stack([total, widest]), sum(p.numel() for p in params)))
    host = [None if s is None else (*s[0].tolist(), s[1]) for s in sums]  # one read per group
    additive = opt._additive_prior  # diagonal precisions are (data part) + λ
    lo, hi = config.bounds
    out = []
    for group, row in zip(opt.param_groups, host, strict=True):
        old = float(to_prior(group[key], group))
        if row is None:
            out.append(old)
            continue
        total, widest_var, count = row
        target = count / total if total > 0 else hi
        lam = target
        if old > 0 and config.decay:
            lam = math.exp(config.decay * math.log(old) + (1 - config.decay) * math.log(target))
        lam = min(max(lam, lo), hi)
        init = group.get("init_prec")
        if isinstance(init, int | float) and not isinstance(init, bool):
            lam = min(lam, float(init))
        if additive and widest_var > 0:  # the smallest precision is 1/widest_var; keep half of it
            lam = max(lam, old - 0.5 / widest_var)
        group[key] = from_prior(lam, group)
        out.append(lam)
    return out
