"""Published UCI results, copied from the papers' tables (mean ± standard error over splits).

* ``khan2018``: Khan et al. 2018, Table 1 — MC-Dropout (numbers from Gal & Ghahramani 2016), BBVI, Vadam;
  20 splits of Gal & Ghahramani, the same as ours (see ``../shared/data/MANIFEST.md``).
* ``zhang2018``: Zhang et al. 2018, Table 1 — BBB, PBP, NNG-FFG (noisy Adam), NNG-MVG (noisy K-FAC). These
  follow Hernández-Lobato & Adams' protocol; Khan et al. note the splits differ from Gal's: compare with
  care.

Values are (mean, standard error); RMSE in the targets' units, log-likelihood per test point.
"""

from __future__ import annotations

Entry = tuple[float, float]

KHAN2018: dict[str, dict[str, dict[str, Entry]]] = {
    "rmse": {
        "MC-Dropout": {
            "bostonHousing": (2.97, 0.19),
            "concrete": (5.23, 0.12),
            "energy": (1.66, 0.04),
            "kin8nm": (0.10, 0.00),
            "naval-propulsion-plant": (0.01, 0.00),
            "power-plant": (4.02, 0.04),
            "wine-quality-red": (0.62, 0.01),
            "yacht": (1.11, 0.09),
        },
        "BBVI": {
            "bostonHousing": (3.58, 0.21),
            "concrete": (6.14, 0.13),
            "energy": (2.79, 0.06),
            "kin8nm": (0.09, 0.00),
            "naval-propulsion-plant": (0.00, 0.00),
            "power-plant": (4.31, 0.03),
            "wine-quality-red": (0.65, 0.01),
            "yacht": (2.05, 0.06),
        },
        "Vadam": {
            "bostonHousing": (3.93, 0.26),
            "concrete": (6.85, 0.09),
            "energy": (1.55, 0.08),
            "kin8nm": (0.10, 0.00),
            "naval-propulsion-plant": (0.00, 0.00),
            "power-plant": (4.28, 0.03),
            "wine-quality-red": (0.66, 0.01),
            "yacht": (1.32, 0.10),
        },
    },
    "loglik": {
        "MC-Dropout": {
            "bostonHousing": (-2.46, 0.06),
            "concrete": (-3.04, 0.02),
            "energy": (-1.99, 0.02),
            "kin8nm": (0.95, 0.01),
            "naval-propulsion-plant": (3.80, 0.01),
            "power-plant": (-2.80, 0.01),
            "wine-quality-red": (-0.93, 0.01),
            "yacht": (-1.55, 0.03),
        },
        "BBVI": {
            "bostonHousing": (-2.73, 0.05),
            "concrete": (-3.24, 0.02),
            "energy": (-2.47, 0.02),
            "kin8nm": (0.95, 0.01),
            "naval-propulsion-plant": (4.46, 0.03),
            "power-plant": (-2.88, 0.01),
            "wine-quality-red": (-1.00, 0.01),
            "yacht": (-2.41, 0.02),
        },
        "Vadam": {
            "bostonHousing": (-2.85, 0.07),
            "concrete": (-3.39, 0.02),
            "energy": (-2.15, 0.07),
            "kin8nm": (0.76, 0.00),
            "naval-propulsion-plant": (4.72, 0.22),
            "power-plant": (-2.88, 0.01),
            "wine-quality-red": (-1.01, 0.01),
            "yacht": (-1.70, 0.03),
        },
    },
}

ZHANG2018: dict[str, dict[str, dict[str, Entry]]] = {
    "rmse": {
        "BBB": {
            "bostonHousing": (3.171, 0.149),
            "concrete": (5.678, 0.087),
            "energy": (0.565, 0.018),
            "kin8nm": (0.080, 0.001),
            "naval-propulsion-plant": (0.000, 0.000),
            "power-plant": (4.023, 0.036),
            "protein-tertiary-structure": (4.321, 0.017),
            "wine-quality-red": (0.643, 0.012),
            "yacht": (1.174, 0.086),
        },
        "PBP": {
            "bostonHousing": (3.014, 0.180),
            "concrete": (5.667, 0.093),
            "energy": (1.804, 0.048),
            "kin8nm": (0.098, 0.001),
            "naval-propulsion-plant": (0.006, 0.000),
            "power-plant": (4.124, 0.035),
            "protein-tertiary-structure": (4.732, 0.013),
            "wine-quality-red": (0.635, 0.008),
            "yacht": (1.015, 0.054),
        },
        "NNG-FFG": {
            "bostonHousing": (3.031, 0.155),
            "concrete": (5.613, 0.113),
            "energy": (0.839, 0.046),
            "kin8nm": (0.079, 0.001),
            "naval-propulsion-plant": (0.001, 0.000),
            "power-plant": (4.002, 0.039),
            "protein-tertiary-structure": (4.380, 0.016),
            "wine-quality-red": (0.644, 0.011),
            "yacht": (1.289, 0.069),
        },
        "NNG-MVG": {
            "bostonHousing": (2.742, 0.125),
            "concrete": (5.019, 0.127),
            "energy": (0.485, 0.023),
            "kin8nm": (0.076, 0.001),
            "naval-propulsion-plant": (0.000, 0.000),
            "power-plant": (3.886, 0.041),
            "protein-tertiary-structure": (4.097, 0.009),
            "wine-quality-red": (0.637, 0.011),
            "yacht": (0.979, 0.077),
        },
    },
    "loglik": {
        "BBB": {
            "bostonHousing": (-2.602, 0.031),
            "concrete": (-3.149, 0.018),
            "energy": (-1.500, 0.006),
            "kin8nm": (1.111, 0.007),
            "naval-propulsion-plant": (6.143, 0.032),
            "power-plant": (-2.807, 0.010),
            "protein-tertiary-structure": (-2.882, 0.004),
            "wine-quality-red": (-0.977, 0.017),
            "yacht": (-2.408, 0.007),
        },
        "PBP": {
            "bostonHousing": (-2.574, 0.089),
            "concrete": (-3.161, 0.019),
            "energy": (-2.042, 0.019),
            "kin8nm": (0.896, 0.006),
            "naval-propulsion-plant": (3.731, 0.006),
            "power-plant": (-2.837, 0.009),
            "protein-tertiary-structure": (-2.973, 0.003),
            "wine-quality-red": (-0.968, 0.014),
            "yacht": (-1.634, 0.016),
        },
        "NNG-FFG": {
            "bostonHousing": (-2.558, 0.032),
            "concrete": (-3.145, 0.023),
            "energy": (-1.629, 0.020),
            "kin8nm": (1.112, 0.008),
            "naval-propulsion-plant": (6.231, 0.041),
            "power-plant": (-2.803, 0.010),
            "protein-tertiary-structure": (-2.896, 0.004),
            "wine-quality-red": (-0.976, 0.016),
            "yacht": (-2.412, 0.006),
        },
        "NNG-MVG": {
            "bostonHousing": (-2.446, 0.029),
            "concrete": (-3.039, 0.025),
            "energy": (-1.421, 0.005),
            "kin8nm": (1.148, 0.007),
            "naval-propulsion-plant": (7.079, 0.034),
            "power-plant": (-2.776, 0.011),
            "protein-tertiary-structure": (-2.836, 0.002),
            "wine-quality-red": (-0.969, 0.014),
            "yacht": (-2.316, 0.006),
        },
    },
}

SOURCES = {"khan2018": ("Khan et al. 2018", KHAN2018), "zhang2018": ("Zhang et al. 2018", ZHANG2018)}
#: decimals printed in each paper's table
DECIMALS = {"khan2018": 2, "zhang2018": 3}


def published(source: str, row: str, metric: str, dataset: str) -> Entry | None:
    return SOURCES[source][1][metric].get(row, {}).get(dataset)
