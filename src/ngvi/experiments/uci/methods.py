"""The methods of the UCI benchmark and how each is built, with the protocol's fixed settings.

Shared by every method (Khan et al. 2018, App. J.1, and the authors' code): a 1-hidden-layer ReLU MLP, step
size 0.01, Adam-style moments (0.9, 0.99). Train MC samples: 10 on the four small sets and 5 on the others for
the weight-perturbation methods, 20/10 for BBVI. Vadam-style methods start at init_prec = prior_prec (the
authors' code); BBVI at precision 10 (App. J.1). λ (``prior_prec``) and τ (``noise_prec``, in standardised
target units) come from tuning; MC dropout follows Gal's code instead: λ = 10⁻⁴ fixed (length-scale 10⁻²),
with τ and its dropout rate tuned (the rate over Gal's grid). VOGN and noisy K-FAC take their curvature from
the true Fisher (NNG's choice), and VOGN starts at s₀ = 1 (see ``VOGN_INIT_CURVATURE``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

import ngvi

LR, BETAS = 0.01, (0.9, 0.99)
#: Gal & Ghahramani's code fixes the prior length-scale l = 10⁻² (prior precision λ = l²) and tunes τ and p
GAL_LENGTH_SCALE = 1e-2
SMALL_SETS = ("bostonHousing", "concrete", "energy", "yacht")


@dataclass(frozen=True)
class Setting:
    """Everything a method needs to build its model and trainer for one fit."""

    in_features: int
    hidden: int
    data_size: int
    prior_prec: float
    noise_prec: float
    mc_samples: int
    dropout: float = 0.05


@dataclass(frozen=True)
class UCIMethod:
    name: str
    label: str
    build: Callable[[Setting], tuple[nn.Module, Any]]
    mc_samples: tuple[int, int] = (1, 1)  # (the four small sets, the others)
    published: dict[str, str] = field(default_factory=dict)  # source -> row in that paper's table
    linearized: bool = False  # predictive: linearised around the mean (BADAM) instead of MC
    tunes_dropout: bool = False
    fixed: dict[str, float] = field(default_factory=dict)  # hyperparameters the protocol fixes (not tuned)
    requires: str = ""  # attribute of ngvi that must exist (methods merged later)
    true_fisher: bool = False  # the closure returns (loss, output) and the optimizer samples targets
    # Draw the train MC samples as copies of the minibatch in one forward pass: for an all-Linear model
    # under the local reparameterisation every row gets independent noise, so the mean loss over S copies
    # of B rows is the S-sample estimator itself, at the cost of one large pass instead of S small ones.
    samples_in_batch: bool = False

    def available(self) -> bool:
        target: Any = ngvi
        for part in filter(None, self.requires.split(".")):
            target = getattr(target, part, None)
            if target is None:
                return False
        return True

    def train_samples(self, dataset: str) -> int:
        return self.mc_samples[0] if dataset in SMALL_SETS else self.mc_samples[1]


def mlp(s: Setting) -> nn.Module:
    return nn.Sequential(nn.Linear(s.in_features, s.hidden), nn.ReLU(), nn.Linear(s.hidden, 1))


def _vadam(s: Setting):
    m = mlp(s)
    return m, ngvi.Vadam(
        m.parameters(),
        s.data_size,
        lr=LR,
        betas=BETAS,
        prior_prec=s.prior_prec,
        init_prec=s.prior_prec,
        mc_samples=s.mc_samples,
    )


def _vprop(s: Setting):
    m = mlp(s)
    return m, ngvi.Vprop(
        m.parameters(),
        s.data_size,
        lr=LR,
        beta=1 - BETAS[1],  # MERGE: Vprop beta (the step, since the vocabulary change)
        prior_prec=s.prior_prec,
        init_prec=s.prior_prec,
        mc_samples=s.mc_samples,
    )


def _von(s: Setting):
    m = mlp(s)
    return m, ngvi.VON(
        m.parameters(),
        s.data_size,
        lr=LR,
        beta=1 - BETAS[1],
        prior_prec=s.prior_prec,
        init_prec=s.prior_prec,
        mc_samples=s.mc_samples,
    )


def _ivon(s: Setting):
    m = mlp(s)
    return m, ngvi.IVON(
        m.parameters(),
        s.data_size,
        lr=LR,
        betas=BETAS,
        weight_decay=s.prior_prec / s.data_size,
        hess_init=1.0,
        mc_samples=s.mc_samples,
    )


def _noisy_adam(s: Setting):
    m = mlp(s)
    return m, ngvi.NoisyAdam(
        m.parameters(), s.data_size, lr=LR, betas=BETAS, prior_var=1.0 / s.prior_prec, mc_samples=s.mc_samples
    )


def _badam(s: Setting):
    m = mlp(s)
    return m, ngvi.BAdam(m.parameters(), s.data_size, lr=LR, betas=BETAS, prior_prec=s.prior_prec)


#: VOGN's s₀ (init_prec = λ + N·s₀): with s₀ = 0 and β = 0.01 its first steps are near-Newton steps on a
#: curvature average that has barely started, and they diverge at τ ≈ 100; noisy K-FAC debiases its factors
VOGN_INIT_CURVATURE = 1.0


def _true_fisher(s: Setting) -> dict[str, Any]:
    """VOGN's and noisy K-FAC's curvature here: the true Fisher, from targets sampled from N(f(x), 1/τ)
    (NNG §3: "throughout our experiments"; for this likelihood its mean is the Gauss-Newton matrix τJᵀJ).
    The empirical Fisher of the closure's own targets scales as τ²r² for residuals r instead of τ, so at a
    tuned τ ≈ 100 the early natural-gradient steps shrink about 100-fold and 40 epochs do not converge
    (docs/results/uci/README.md)."""
    return dict(curvature="fisher", likelihood="gaussian", noise_prec=s.noise_prec)


def _vogn(s: Setting):
    m = mlp(s)
    return m, ngvi.VOGN(
        m,
        s.data_size,
        lr=LR,
        beta=1 - BETAS[1],
        prior_prec=s.prior_prec,
        init_prec=s.prior_prec + s.data_size * VOGN_INIT_CURVATURE,
        mc_samples=s.mc_samples,
        **_true_fisher(s),
    )


def _noisy_kfac(s: Setting):
    m = mlp(s)
    return m, ngvi.NoisyKFAC(
        m,
        s.data_size,
        lr=LR,
        beta=1 - BETAS[1],
        prior_var=1.0 / s.prior_prec,
        mc_samples=s.mc_samples,
        **_true_fisher(s),
    )


def _bbvi(s: Setting):
    m = mlp(s)
    return m, ngvi.baselines.BBVI(
        m, s.data_size, lr=LR, betas=BETAS, prior_prec=s.prior_prec, init_prec=10.0, mc_samples=s.mc_samples
    )


def _mc_dropout(s: Setting):
    m = ngvi.baselines.mc_dropout_mlp(s.in_features, 1, s.hidden, p=s.dropout)
    return m, ngvi.baselines.MCDropout(m, s.data_size, lr=LR, betas=BETAS, prior_prec=s.prior_prec)


def _map(s: Setting):
    m = mlp(s)
    return m, ngvi.baselines.MAP(m, s.data_size, lr=LR, betas=BETAS, prior_prec=s.prior_prec)


METHODS: dict[str, UCIMethod] = {
    m.name: m
    for m in [
        UCIMethod("vadam", "Vadam", _vadam, (10, 5), {"khan2018": "Vadam"}),
        UCIMethod("vprop", "Vprop", _vprop, (10, 5)),
        UCIMethod("von", "VON", _von, (10, 5)),
        UCIMethod("ivon", "IVON", _ivon, (10, 5)),
        UCIMethod("noisy_adam", "Noisy Adam", _noisy_adam, (10, 5), {"zhang2018": "NNG-FFG"}),
        UCIMethod("badam", "BAdam", _badam, linearized=True),
        # VOGN is the mean-field noisy natural gradient with per-example (GGN) curvature: NNG-FFG's family
        UCIMethod(
            "vogn", "VOGN", _vogn, (10, 5), {"zhang2018": "NNG-FFG"}, requires="VOGN", true_fisher=True
        ),
        UCIMethod(
            "noisy_kfac",
            "Noisy K-FAC",
            _noisy_kfac,
            (10, 5),
            {"zhang2018": "NNG-MVG"},
            requires="NoisyKFAC",
            true_fisher=True,
        ),
        UCIMethod(
            "bbvi",
            "BBVI",
            _bbvi,
            (20, 10),
            {"khan2018": "BBVI", "zhang2018": "BBB"},
            requires="baselines.BBVI",
            samples_in_batch=True,
        ),
        UCIMethod(
            "mc_dropout",
            "MC dropout",
            _mc_dropout,
            published={"khan2018": "MC-Dropout"},
            tunes_dropout=True,
            fixed={"prior_prec": GAL_LENGTH_SCALE**2},
            requires="baselines.MCDropout",
        ),
        UCIMethod("map", "MAP", _map, requires="baselines.MAP"),
    ]
}


def get_methods(names: list[str]) -> list[UCIMethod]:
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)} (see `ngvi list`)")
    missing = [n for n in names if not METHODS[n].available()]
    if missing:
        raise ValueError(f"method(s) {missing} are not available in this build of ngvi")
    return [METHODS[n] for n in names]
