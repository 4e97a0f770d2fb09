"""The repository's significance rule for sequential and multiple tests (docs/FINDINGS.md, issue 48).

Numpy and the standard library only, so the claims checker (tests/claims_check.py) recomputes the adjusted
numbers the READMEs state without scipy's import time.

* :func:`t_test_p`: the two-sided one-sample (or paired, on differences) t-test, Student's t with n − 1
  degrees of freedom.
* :func:`holm`: Holm's step-down adjusted p-values for a family of tests on one data set.
* :func:`inverse_normal`: the weighted inverse-normal combination of independent stages' one-sided p-values,
  Z = Σ wₖ Φ⁻¹(1 − pₖ) / √(Σ wₖ²), p = 1 − Φ(Z), valid whatever the later stages' sizes, provided the
  weights are fixed before the stages they weight (Lehmacher and Wassmer 1999).
* :func:`tost_p`: Schuirmann's two one-sided tests of equivalence within a margin ±δ fixed in advance.
* :func:`sequential_rejection_rate` and :func:`stagewise_p`: a design that looks at the cumulative paired
  t-test at several sample sizes and stops at the first p < α, simulated under the null: its false-positive
  rate, and the p-value of an observed path under the stage-wise ordering (stopping at an earlier look is
  more extreme than any later one; at the same look, a larger |t| is).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

_NORMAL = NormalDist()


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), by its continued fraction (modified Lentz)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast only below this point
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = (
        math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
        / a
    )
    tiny, c, d = 1e-300, 1.0, 0.0
    f = tiny
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c
        c = c if abs(c) > tiny else tiny
        f = (f if i else 1.0) * c * d
        if abs(c * d - 1.0) < 1e-14:
            break
    return front * (f - 1.0)


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))  # P(|T| > |t|) / 2
    return tail if t >= 0 else 1.0 - tail


def t_critical(alpha: float, df: float) -> float:
    """The two-sided critical value: P(|T| > c) = ``alpha``, by bisection on :func:`t_sf`."""
    lo, hi = 0.0, 1.0
    while 2 * t_sf(hi, df) > alpha:
        hi *= 2
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if 2 * t_sf(mid, df) > alpha else (lo, mid)
    return 0.5 * (lo + hi)


def _diffs(x: Any, what: str) -> np.ndarray:
    x = np.asarray(x, dtype=float).ravel()
    if len(x) < 2 or not np.all(np.isfinite(x)):
        raise ValueError(
            f"{what} needs at least 2 finite values, got {x.tolist()}: pass the per-pair differences"
        )
    return x


def t_statistic(x: Any) -> float:
    """mean / (s.d. / √n) of the differences ``x``."""
    x = _diffs(x, "t_statistic")
    mean, sd = float(np.mean(x)), float(np.std(x, ddof=1))
    if sd == 0.0:  # identical differences: no spread to scale by (0 when they are all 0, else ±inf)
        return 0.0 if mean == 0.0 else math.copysign(math.inf, mean)
    return mean / (sd / math.sqrt(len(x)))


def t_test_p(x: Any) -> float:
    """Two-sided p of the one-sample t-test of mean 0 on ``x`` (the paired t-test on differences)."""
    x = _diffs(x, "t_test_p")
    return 2.0 * t_sf(abs(t_statistic(x)), len(x) - 1)


def holm(pvalues: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's adjusted p-values, in the input's order: with p₍₁₎ ≤ … ≤ p₍ₘ₎,
    p̃₍ᵢ₎ = max_{j ≤ i} min(1, (m − j + 1) p₍ⱼ₎). Rejecting p̃ < α controls the family-wise error at α."""
    p = np.asarray(pvalues, dtype=float).ravel()
    if len(p) == 0 or np.any((p < 0) | (p > 1)) or not np.all(np.isfinite(p)):
        raise ValueError(f"holm needs p-values in [0, 1], got {p.tolist()}")
    order = np.argsort(p, kind="stable")
    m = len(p)
    stepped = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.maximum.accumulate(stepped)
    return out


def inverse_normal(pvalues: Sequence[float], weights: Sequence[float] | None = None) -> float:
    """The one-sided p of the weighted inverse-normal combination of independent one-sided ``pvalues``
    (equal weights by default); √nₖ weights the stages as the pooled z-test would."""
    p = np.asarray(pvalues, dtype=float).ravel()
    w = np.ones_like(p) if weights is None else np.asarray(weights, dtype=float).ravel()
    if len(p) == 0 or len(w) != len(p) or np.any((p <= 0) | (p >= 1)) or np.any(w < 0) or not w.any():
        raise ValueError(f"inverse_normal needs p-values in (0, 1) and as many weights ≥ 0, got {p}, {w}")
    z = sum(wk * _NORMAL.inv_cdf(1.0 - pk) for pk, wk in zip(p, w, strict=True)) / math.sqrt(float(w @ w))
    return 1.0 - _NORMAL.cdf(z)


def one_sided_p(x: Any) -> float:
    """P(T ≥ t) of the one-sample t-test on ``x``: the one-sided p for "mean > 0"."""
    x = _diffs(x, "one_sided_p")
    return t_sf(t_statistic(x), len(x) - 1)


def tost_p(x: Any, margin: float) -> float:
    """Schuirmann's TOST p for "|mean| < margin" from the differences ``x``: the larger of the one-sided
    t-tests' p for mean > −margin and for mean < +margin. Equivalence is shown when it is below α; the
    margin must be fixed before the data are seen."""
    x = _diffs(x, "tost_p")
    if not margin > 0:
        raise ValueError(f"tost_p needs a margin > 0 fixed in advance, got {margin}")
    n = len(x)
    se = float(np.std(x, ddof=1)) / math.sqrt(n)
    mean = float(np.mean(x))
    return max(t_sf((mean + margin) / se, n - 1), t_sf((margin - mean) / se, n - 1))


def _simulated_looks(looks: Sequence[int], n_sim: int, seed: int, known_variance: bool) -> np.ndarray:
    """|statistic| at each look of ``n_sim`` null paths of standard-normal differences: shape (n_sim, K).

    Exact in distribution without drawing every point: a stage of m new points adds a sum ~ N(0, m) and,
    about its own mean, a sum of squares ~ χ²(m − 1), independent of each other and of earlier stages."""
    looks = [int(n) for n in looks]
    if not looks or looks[0] < 2 or any(b <= a for a, b in itertools.pairwise(looks)):
        raise ValueError(f"looks must be increasing sample sizes ≥ 2, got {looks}")
    rng = np.random.default_rng(seed)
    total = np.zeros(n_sim)
    squares = np.zeros(n_sim)
    stats = np.empty((n_sim, len(looks)))
    before = 0
    for k, n in enumerate(looks):
        m = n - before
        stage_sum = rng.standard_normal(n_sim) * math.sqrt(m)
        within = rng.chisquare(m - 1, n_sim) if m > 1 else np.zeros(n_sim)
        total += stage_sum
        squares += within + stage_sum**2 / m
        if known_variance:
            stats[:, k] = np.abs(total) / math.sqrt(n)
        else:
            var = (squares - total**2 / n) / (n - 1)
            stats[:, k] = np.abs(total / n) / np.sqrt(var / n)
        before = n
    return stats


def _critical(looks: Sequence[int], alpha: float, known_variance: bool) -> np.ndarray:
    if known_variance:
        return np.full(len(looks), _NORMAL.inv_cdf(1.0 - alpha / 2))
    return np.array([t_critical(alpha, n - 1) for n in looks])


def sequential_rejection_rate(
    looks: Sequence[int],
    alpha: float = 0.05,
    *,
    n_sim: int = 200_000,
    seed: int = 0,
    known_variance: bool = False,
) -> float:
    """The false-positive rate of testing the cumulative data at each of ``looks`` (sample sizes) at
    two-sided level ``alpha`` and stopping at the first rejection, under the null (mean 0), by simulation:
    Monte Carlo s.e. ≈ √(r(1 − r)/n_sim). The paired t-test by default; the z-test with ``known_variance``."""
    stats = _simulated_looks(looks, n_sim, seed, known_variance)
    return float(np.mean(np.any(stats > _critical(looks, alpha, known_variance), axis=1)))


def stagewise_p(
    looks: Sequence[int],
    observed: Any,
    alpha: float = 0.05,
    *,
    n_sim: int = 200_000,
    seed: int = 0,
) -> float:
    """The stage-wise-ordering p of a path that ran the design of :func:`sequential_rejection_rate` and
    stopped at its last look with the paired differences ``observed`` (all of them, in order, len =
    looks[-1]): P₀(reject at an earlier look) + P₀(no earlier rejection and |T_K| ≥ |t_obs|).
    The path must not have crossed α at an earlier look (else it would have stopped there)."""
    x = _diffs(observed, "stagewise_p")
    if len(x) != looks[-1]:
        raise ValueError(f"stagewise_p needs the {looks[-1]} differences of the last look, got {len(x)}")
    crossed = [k for k, n in enumerate(looks[:-1]) if t_test_p(x[:n]) < alpha]
    if crossed:
        raise ValueError(f"the path crossed α = {alpha} at look {looks[crossed[0]]}: it stopped there")
    stats = _simulated_looks(looks, n_sim, seed, known_variance=False)
    crit = _critical(looks, alpha, known_variance=False)
    earlier = np.any(stats[:, :-1] > crit[:-1], axis=1)
    return float(np.mean(earlier | (stats[:, -1] >= abs(t_statistic(x)))))
