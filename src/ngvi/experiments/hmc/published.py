"""NNG (Zhang et al. 2018) §5.3, copied from the paper: Table 4 (Pearson correlation of each method's
predictive variances with HMC's, mean ± s.e. over 10 trials) and Table 3 (average test RMSE in active
learning; R: points chosen at random, A: by largest predictive variance). Values are (mean, standard error).
"""

from __future__ import annotations

Entry = tuple[float, float]

SETS = (
    "bostonHousing",
    "concrete",
    "energy",
    "kin8nm",
    "naval-propulsion-plant",
    "power-plant",
    "wine-quality-red",
    "yacht",
)


def _rows(*columns: tuple[float, ...]) -> dict[str, Entry]:
    means, ses = columns
    return dict(zip(SETS, zip(means, ses, strict=True), strict=True))


#: Table 4: column -> data set -> (mean, s.e.)
TABLE4: dict[str, dict[str, Entry]] = {
    "PBP": _rows(
        (0.761, 0.817, 0.471, 0.587, 0.270, 0.509, 0.883, 0.620),
        (0.032, 0.028, 0.076, 0.021, 0.098, 0.068, 0.042, 0.053),
    ),
    "NNG-FFG": _rows(
        (0.718, 0.811, 0.438, 0.659, 0.321, 0.618, 0.918, 0.597),
        (0.035, 0.028, 0.075, 0.015, 0.087, 0.050, 0.014, 0.063),
    ),
    "NNG-MVG": _rows(
        (0.891, 0.913, 0.617, 0.731, 0.596, 0.829, 0.957, 0.717),
        (0.021, 0.010, 0.087, 0.021, 0.073, 0.020, 0.009, 0.072),
    ),
    "NNG-BlkTri": _rows(
        (0.889, 0.922, 0.646, 0.759, 0.598, 0.853, 0.964, 0.727),
        (0.024, 0.006, 0.088, 0.023, 0.070, 0.020, 0.006, 0.070),
    ),
}

#: our method -> its column in the paper's tables
PAPER_COLUMN = {"noisy_adam": "NNG-FFG", "noisy_kfac": "NNG-MVG", "nng_blktri": "NNG-BlkTri", "hmc": "HMC"}

#: Table 3: "<column> <R|A>" -> data set -> (mean test RMSE, s.e.), in the targets' original units
TABLE3: dict[str, dict[str, Entry]] = {
    "PBP R": _rows(
        (6.716, 12.417, 3.743, 0.259, 0.015, 5.312, 0.945, 5.388),
        (0.500, 0.392, 0.121, 0.006, 0.000, 0.108, 0.044, 0.339),
    ),
    "PBP A": _rows(
        (5.480, 11.894, 3.399, 0.254, 0.016, 5.068, 0.809, 4.508),
        (0.175, 0.254, 0.064, 0.005, 0.000, 0.082, 0.011, 0.158),
    ),
    "NNG-FFG R": _rows(
        (5.911, 12.583, 4.011, 0.246, 0.013, 5.812, 0.730, 7.381),
        (0.250, 0.168, 0.087, 0.004, 0.000, 0.119, 0.011, 0.309),
    ),
    "NNG-FFG A": _rows(
        (5.435, 12.563, 3.761, 0.252, 0.013, 5.423, 0.748, 6.583),
        (0.132, 0.142, 0.068, 0.003, 0.000, 0.111, 0.008, 0.264),
    ),
    "NNG-MVG R": _rows(
        (5.831, 12.301, 3.635, 0.243, 0.010, 5.377, 0.752, 7.192),
        (0.177, 0.203, 0.084, 0.003, 0.000, 0.133, 0.014, 0.280),
    ),
    "NNG-MVG A": _rows(
        (5.220, 11.671, 3.211, 0.244, 0.009, 4.974, 0.746, 6.371),
        (0.132, 0.175, 0.076, 0.003, 0.000, 0.078, 0.009, 0.204),
    ),
    "HMC R": _rows(
        (5.750, 10.564, 3.264, 0.226, 0.013, 5.229, 0.740, 4.644),
        (0.222, 0.198, 0.067, 0.004, 0.000, 0.097, 0.011, 0.237),
    ),
    "HMC A": _rows(
        (5.156, 11.484, 3.118, 0.223, 0.012, 4.800, 0.749, 3.211),
        (0.150, 0.191, 0.062, 0.003, 0.000, 0.074, 0.010, 0.120),
    ),
}
