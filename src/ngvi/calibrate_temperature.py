r"""A posterior temperature for the families whose prior :func:`ngvi.calibrate` cannot refit (issue 44).

What :func:`ngvi.calibrate` fits, per family:

* **the diagonal rules with an additive prior** (Vadam, Vprop, VON, VOGN, BAdam, IVON, noisy Adam): the
  prior precision λ (:data:`ngvi.calibrate.PRIOR_KEYS`), which moves each weight's precision by the same
  amount, so a weight the data constrain keeps its variance and a weight they do not takes the prior's.
* **the K-FAC family** (NoisyKFAC, NNGFull, NNGBlkTri): a temperature T. Their prior is damping inside the
  factors, whose roots are formed when they are inverted during training, so a new prior does not reach the
  posterior afterwards; but every draw and every covariance is scaled by κ/N at sampling time (κ =
  ``kl_weight``), so κ ← T·κ scales the whole covariance by T, exactly: Σ_T = T·Σ. It is written into the
  groups' ``kl_weight``, so ``posterior()``, :func:`ngvi.predict`, ``state_dict()`` and
  :func:`ngvi.save_posterior` use it (continuing to train then optimises the ELBO with its KL weighted by
  T·κ: a tempered posterior).
* **BBVI**: a temperature T, σ ← √T·σ in its ``log_std`` state (log σ + ½ log T), which is what BBVI's
  posterior is.

T is chosen as λ is: the held-out NLL of the Monte-Carlo predictive with the same ε for every candidate, over
0.01…100 (eight points a decade, extended by four decades at a best end, twice at most), then a
golden-section search on log T; for regression the noise s.d. is fitted at each T. T > 1 widens the
posterior, T < 1 narrows it; T = 1 is the trained one (always a candidate, so the NLL after is never above
the NLL before on the validation data).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

from .baselines.bbvi import BBVI
from .optim.diagnostics import PosteriorWarning
from .optim.kronecker import KroneckerFamily

#: the temperatures tried first: 0.01 … 100, eight points a decade (extended where its best is an end)
TEMPERATURE_GRID = tuple(10.0 ** (k / 8) for k in range(-16, 17))


class TemperatureKey:
    """How a family's posterior takes a temperature T: ``write(T)`` scales the trained posterior's covariance
    by T (from the values it had when this key was made), ``restore()`` puts those values back."""

    key = ""

    def __init__(self, opt: Any) -> None:
        self.opt = opt

    def write(self, temperature: float) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        self.write(1.0)


class KLWeightTemperature(TemperatureKey):
    """The K-FAC family: κ ← T·κ₀ in every group (draws and covariances are scaled by κ/N when sampled)."""

    key = "kl_weight"

    def __init__(self, opt: Any) -> None:
        super().__init__(opt)
        self.before = [g["kl_weight"] for g in opt.param_groups]

    def write(self, temperature: float) -> None:
        for g, kappa in zip(self.opt.param_groups, self.before, strict=True):
            g["kl_weight"] = kappa if temperature == 1.0 else kappa * temperature


class LogStdTemperature(TemperatureKey):
    """BBVI: log σ ← log σ₀ + ½ log T in every parameter's state."""

    key = "log_std"

    def __init__(self, opt: Any) -> None:
        super().__init__(opt)
        self.before = {
            p: opt.state[p]["log_std"].clone()
            for g in opt.param_groups
            for p in g["params"]
            if "log_std" in opt.state.get(p, {})
        }
        if not self.before:
            raise ValueError("calibrate: BBVI has no posterior yet (no step was taken): train it first")

    def write(self, temperature: float) -> None:
        shift = 0.5 * math.log(temperature)
        for p, log_std in self.before.items():
            self.opt.state[p]["log_std"].copy_(log_std).add_(shift)


def temperature_key(opt: Any) -> TemperatureKey | None:
    """The family's temperature, or None for the families whose λ calibrate fits (or that have neither)."""
    if isinstance(opt, KroneckerFamily) and all("kl_weight" in g for g in opt.param_groups):
        return KLWeightTemperature(opt)  # (plain K-FAC, a point estimate, has no kl_weight)
    if isinstance(opt, BBVI):
        return LogStdTemperature(opt)
    return None


def at_grid_end(value: float, grid: Sequence[float]) -> bool:
    """Whether ``value`` is the smallest or largest of the values searched (to 10⁻⁹ relative)."""
    if len(grid) < 2:
        return False
    lo, hi = min(grid), max(grid)
    return value <= lo * (1 + 1e-9) or value >= hi * (1 - 1e-9)


def warn_at_grid_end(name: str, value: float, grid: Sequence[float], meaning: str) -> None:
    """A :class:`~ngvi.PosteriorWarning` when the fit is an end of its (extended) grid."""
    if at_grid_end(value, grid):
        warnings.warn(
            f"calibrate: the fitted {name} = {value:.3g} is at the end of the values searched "
            f"({min(grid):.3g} … {max(grid):.3g}): the held-out NLL still fell (or was flat) that way, so "
            f"it is a bound, not an optimum; {meaning}",
            PosteriorWarning,
            stacklevel=3,
        )
