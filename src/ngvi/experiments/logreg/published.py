"""The paper's numbers for Fig. 2, read off the authors' MATLAB figure files.

Khan et al. 2018 give Fig. 2 only as plots. The figure files of their code,
``matlab/figures/figure_two_{a,b,c}.fig`` in github.com/emtiyaz/vadam (commit d8ea6bdc), are MAT files: the
box plots' medians and quartiles and the toy's ellipses below were read from them with ``scipy.io.loadmat``
(the boxes' ``Median`` and ``Box`` lines, the ``VOGN-1`` reference lines, the ellipses' centres).
"""

from __future__ import annotations

SOURCE = "github.com/emtiyaz/vadam matlab/figures/figure_two_{a,b,c}.fig (commit d8ea6bdc)"

#: Fig. 2b, USPS 3-vs-5, 20 random splits: metric -> method -> (median, first quartile, third quartile).
#: Negative ELBO per training example, test log-loss in nats (the authors' log2 loss / log2(e)), symmetric KL.
FIG2B_USPS: dict[str, dict[str, tuple[float, float, float]]] = {
    "neg_elbo": {
        "mf_exact": (0.2682, 0.2549, 0.2749),
        "vogn": (0.2825, 0.2701, 0.2959),
        "vadam": (0.2941, 0.2798, 0.3015),
    },
    "log_loss": {
        "mf_exact": (0.1380, 0.1318, 0.1484),
        "vogn": (0.1430, 0.1350, 0.1512),
        "vadam": (0.1434, 0.1372, 0.1531),
    },
    "sym_kl": {
        "mf_exact": (0.0, 0.0, 0.0),
        "vogn": (8.0424, 6.5535, 11.0131),
        "vadam": (26.3444, 24.2083, 29.1145),
    },
}

#: Fig. 2c, breast-cancer, one split, 20 runs each: Vadam's symmetric KL to MF-Exact per minibatch size M,
#: (median, first quartile, third quartile)
FIG2C_VADAM: dict[int, tuple[float, float, float]] = {
    1: (0.5091, 0.4905, 0.5178),
    8: (5.5632, 5.5347, 5.5883),
    16: (6.8990, 6.8805, 6.9219),
    32: (8.0954, 8.0662, 8.1415),
    64: (9.8188, 9.7688, 9.9108),
}
#: VOGN-1 in Fig. 2c: the mean line and the two quartile lines
FIG2C_VOGN1 = {"mean": 0.8709, "q1": 0.7203, "q3": 0.9915}

#: Fig. 2a (the authors' own draw of the toy data): the ellipses' centres
FIG2A_MEANS = {"mf_exact": (12.2454, 4.4211), "vadam": (15.4985, 5.8802), "vogn": (9.2905, 3.5337)}
