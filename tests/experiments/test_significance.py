"""ngvi.experiments.significance against textbook and closed-form values (issue 48)."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from ngvi.experiments.significance import (
    holm,
    inverse_normal,
    one_sided_p,
    sequential_rejection_rate,
    stagewise_p,
    t_critical,
    t_sf,
    t_test_p,
    tost_p,
)

PHI = NormalDist().cdf


def _t2_cdf(t: float) -> float:
    """Student's t with 2 degrees of freedom has the closed-form CDF 1/2 + t / (2√(2 + t²))."""
    return 0.5 + t / (2.0 * math.sqrt(2.0 + t * t))


@pytest.mark.parametrize("t", [-3.0, -0.7, 0.0, 0.4, 1.9, 4.3])
def test_t_sf_matches_the_closed_form_at_two_degrees_of_freedom(t: float) -> None:
    assert t_sf(t, 2) == pytest.approx(1.0 - _t2_cdf(t), abs=1e-12)


@pytest.mark.parametrize(("crit", "df"), [(12.706, 1), (4.303, 2), (2.228, 10), (2.042, 30)])
def test_t_critical_is_the_tables_5_percent_point(crit: float, df: int) -> None:
    assert t_critical(0.05, df) == pytest.approx(crit, abs=1e-3)


def test_t_test_p_of_three_points_is_the_closed_form() -> None:
    x = [1.0, 2.0, 4.0]  # mean 7/3, s.d. √(7/3): t = 7/3 / √(7/9) = √7
    t = math.sqrt(7.0)
    assert t_test_p(x) == pytest.approx(2.0 * (1.0 - _t2_cdf(t)), abs=1e-12)
    assert one_sided_p(x) == pytest.approx(1.0 - _t2_cdf(t), abs=1e-12)


def test_identical_differences_have_p_1_at_zero_and_0_elsewhere() -> None:
    assert t_test_p([0.0, 0.0, 0.0]) == 1.0
    assert t_test_p([0.25, 0.25, 0.25]) == 0.0 and one_sided_p([-0.25, -0.25]) == 1.0


def test_holm_on_a_known_vector() -> None:
    # sorted 0.005, 0.01, 0.03, 0.04 → 4·0.005, 3·0.01, 2·0.03, max(0.06, 1·0.04), back in input order
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.02]) == pytest.approx([0.02])  # a family of one is not adjusted


def test_holm_rejects_what_the_step_down_procedure_rejects() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        p = rng.uniform(0, 0.1, size=6)
        rejected = set()
        for i, k in enumerate(np.argsort(p)):  # reject while p₍ᵢ₎ < α / (m − i), stop at the first failure
            if p[k] >= 0.05 / (6 - i):
                break
            rejected.add(int(k))
        assert {int(k) for k in np.flatnonzero(holm(p) < 0.05)} == rejected


def test_holm_refuses_a_value_that_is_not_a_p() -> None:
    with pytest.raises(ValueError, match="p-values in"):
        holm([0.1, 1.5])


def test_inverse_normal_of_known_stage_ps() -> None:
    # stages whose z-scores are 1 and 1: Z = 2/√2 = √2
    p = 1.0 - PHI(1.0)
    assert inverse_normal([p, p]) == pytest.approx(1.0 - PHI(math.sqrt(2.0)), abs=1e-12)
    # weights 3 and 4 on z = 2 and z = 0.5: Z = (6 + 2)/5 = 1.6
    assert inverse_normal([1 - PHI(2.0), 1 - PHI(0.5)], [3.0, 4.0]) == pytest.approx(1 - PHI(1.6), abs=1e-12)
    # one stage is its own p
    assert inverse_normal([0.03]) == pytest.approx(0.03, abs=1e-12)
    with pytest.raises(ValueError, match="in \\(0, 1\\)"):
        inverse_normal([0.0, 0.5])


def test_tost_on_three_points_is_the_closed_form() -> None:
    x = [1.0, 2.0, 4.0]  # mean 7/3, s.e. √(7/9)
    se = math.sqrt(7.0 / 9.0)
    for margin in (1.0, 3.0, 5.0):
        lower = 1.0 - _t2_cdf((7.0 / 3.0 + margin) / se)  # H0: mean ≤ −margin
        upper = _t2_cdf((7.0 / 3.0 - margin) / se)  # H0: mean ≥ +margin
        assert tost_p(x, margin) == pytest.approx(max(lower, upper), abs=1e-12)
    with pytest.raises(ValueError, match="margin > 0"):
        tost_p(x, 0.0)


def test_tost_is_the_90_percent_interval_inside_the_margin() -> None:
    # TOST at α = 0.05 rejects exactly when the 90% t-interval lies within ±margin
    rng = np.random.default_rng(2)
    for _ in range(100):
        x = rng.normal(0.1, 1.0, size=8)
        se = float(np.std(x, ddof=1)) / math.sqrt(8)
        half = t_critical(0.10, 7) * se
        margin = float(rng.uniform(0.2, 1.5))
        inside = abs(float(np.mean(x))) + half < margin
        assert (tost_p(x, margin) < 0.05) == inside


def test_one_look_rejects_at_alpha() -> None:
    # a single t-test at α on normal data has size α exactly; 200,000 paths: Monte Carlo s.e. ≈ 0.0005
    assert sequential_rejection_rate([10], 0.05) == pytest.approx(0.05, abs=0.002)


def _two_looks_z(c: float, rho: float) -> float:
    """P(|Z₁| > c or |Z₂| > c) for a standard bivariate normal with correlation rho, by quadrature."""
    z1 = np.linspace(-c, c, 20001)
    dens = np.exp(-0.5 * z1**2) / math.sqrt(2 * math.pi)
    s = math.sqrt(1 - rho * rho)
    inner = np.array([PHI((c - rho * z) / s) - PHI((-c - rho * z) / s) for z in z1])
    return 1.0 - float(np.trapezoid(dens * inner, z1))


def test_repeated_z_tests_match_the_analytic_and_published_rates() -> None:
    # Two looks at n and 2n: the cumulative z's have correlation √(1/2); by quadrature ≈ 0.083
    exact = _two_looks_z(NormalDist().inv_cdf(0.975), math.sqrt(0.5))
    assert exact == pytest.approx(0.083, abs=0.001)  # Armitage, McPherson and Rowe (1969)
    assert sequential_rejection_rate([10, 20], known_variance=True) == pytest.approx(exact, abs=0.003)
    # Three equally spaced looks: 0.107 in the same table (Pocock 1977, Table 1, rounds it to 0.11)
    assert sequential_rejection_rate([10, 20, 30], known_variance=True) == pytest.approx(0.107, abs=0.003)


def test_stagewise_p_of_one_look_is_the_t_tests_p() -> None:
    x = np.random.default_rng(3).normal(0.5, 1.0, size=12)
    assert stagewise_p([12], x) == pytest.approx(t_test_p(x), abs=0.003)


def test_stagewise_p_adds_the_earlier_looks_chances() -> None:
    x = np.array([1.0, -1.0] * 15)
    x[20:] += 1.5  # mean 0 at 10 and 20 (no crossing), 0.5 at 30 (a crossing)
    looks = [10, 20, 30]
    assert all(t_test_p(x[:n]) >= 0.05 for n in looks[:-1]) and t_test_p(x) < 0.05
    p = stagewise_p(looks, x)
    # at least the chance of stopping at the first two looks, at most that plus the last look's naive p
    earlier = sequential_rejection_rate([10, 20])
    assert earlier - 0.003 < p < earlier + t_test_p(x) + 0.003
    with pytest.raises(ValueError, match="stopped there"):
        stagewise_p([10, 30], np.r_[np.full(10, 1.0) + np.arange(10) * 0.01, x[10:]])
