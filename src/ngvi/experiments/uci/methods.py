"""The UCI protocol's settings for each method of :data:`ngvi.experiments.core.METHODS` (which builds them).

Shared by every method (Khan et al. 2018, App. J.1, and the authors' code): a 1-hidden-layer ReLU MLP, step
size 0.01, Adam-style moments (0.9, 0.99). Train MC samples: 10 on the four small sets and 5 on the others for
the weight-perturbation methods, 20/10 for BBVI. Vadam-style methods start at init_prec = prior_prec (the
authors' code); BBVI at precision 10 (App. J.1). λ (``prior_prec``) and τ (``noise_prec``, in standardised
target units) come from tuning; MC dropout follows Gal's code instead: λ = 10⁻⁴ fixed (length-scale 10⁻²),
with τ and its dropout rate tuned (the rate over Gal's grid). VOGN and noisy K-FAC take their curvature from
the true Fisher (NNG's choice), and VOGN starts at s₀ = 1 (see ``VOGN_INIT_CURVATURE``). Every rule runs as
its paper writes it (:data:`PAPER_RULES` pins the options whose ngvi defaults differ).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.methods import ProtocolMethod

LR, BETAS = 0.01, (0.9, 0.99)
#: Gal & Ghahramani's code fixes the prior length-scale l = 10⁻² (prior precision λ = l²) and tunes τ and p
GAL_LENGTH_SCALE = 1e-2
SMALL_SETS = ("bostonHousing", "concrete", "energy", "yacht")
#: VOGN's s₀ (init_prec = λ + N·s₀): with s₀ = 0 and β = 0.01 its first steps are near-Newton steps on a
#: curvature average that has barely started, and they diverge at τ ≈ 100; noisy K-FAC debiases its factors
VOGN_INIT_CURVATURE = 1.0


@dataclass(frozen=True)
class Setting:
    """Everything a method needs for one fit."""

    data_size: int
    prior_prec: float
    noise_prec: float
    mc_samples: int


def _vadam_style(s: Setting) -> dict[str, Any]:  # Vadam, Vprop, VON: start at the prior (authors' code)
    return {"init_prec": s.prior_prec}


#: the papers' rules where ngvi's defaults differ from them (docs/CHOOSING.md): Fig. 1's and eq. 14's step,
#: independent noise, no natural momentum, Alg. 1's and Alg. 2's start at the prior
PAPER_RULES: dict[str, dict[str, Any]] = {
    "vadam": {"step_moment": "paper"},
    "vprop": {"step_moment": "paper", "noise": "normal"},
    "von": {"momentum": 0.0},
    "vogn": {"momentum": 0.0},
    "noisy_adam": {"init_prec": None},
    "noisy_kfac": {"init_prec": None, "momentum": 0.0},
}


def _true_fisher(s: Setting) -> dict[str, Any]:
    """VOGN's and noisy K-FAC's curvature here: the true Fisher, from targets sampled from N(f(x), 1/τ)
    (NNG §3: "throughout our experiments"; for this likelihood its mean is the Gauss-Newton matrix τJᵀJ).
    The empirical Fisher of the closure's own targets scales as τ²r² for residuals r instead of τ, so at a
    tuned τ ≈ 100 the early natural-gradient steps shrink about 100-fold and 40 epochs do not converge
    (docs/results/uci/README.md)."""
    return {"curvature": "fisher", "likelihood": "gaussian", "noise_prec": s.noise_prec}


def _noisy_kfac(s: Setting) -> dict[str, Any]:
    """The true Fisher, and Alg. 2's weight draw shared by the minibatch (the form this protocol's committed
    table and golden run use; NoisyKFAC's default samples Linear pre-activations per example instead)."""
    return {**_true_fisher(s), "sampling": "weights"}


def _vogn(s: Setting) -> dict[str, Any]:
    return {"init_prec": s.prior_prec + s.data_size * VOGN_INIT_CURVATURE, **_true_fisher(s)}


@dataclass(frozen=True)
class UCIMethod(ProtocolMethod):
    """A method of the registry with the protocol's options (besides lr, prior_prec and mc_samples)."""

    name: str
    options: Callable[[Setting], dict[str, Any]] = lambda s: {}
    mc_samples: tuple[int, int] = (1, 1)  # (the four small sets, the others)
    published: dict[str, str] = field(default_factory=dict)  # source -> row in that paper's table
    tunes_dropout: bool = False
    fixed: dict[str, float] = field(default_factory=dict)  # hyperparameters the protocol fixes (not tuned)
    # Draw the train MC samples as copies of the minibatch in one forward pass: for an all-Linear model
    # under the local reparameterisation every row gets independent noise, so the mean loss over S copies
    # of B rows is the S-sample estimator itself, at the cost of one large pass instead of S small ones.
    samples_in_batch: bool = False

    def train_samples(self, dataset: str) -> int:
        return self.mc_samples[0] if dataset in SMALL_SETS else self.mc_samples[1]

    def trainer_options(self, s: Setting) -> dict[str, Any]:
        """Every keyword of the trainer: the protocol's shared ones, the step sizes and the method's own."""
        steps = {"beta": 1 - BETAS[1]} if self.name in _BETA_STEP else {"betas": BETAS}
        paper = PAPER_RULES.get(self.name, {})
        shared = {"lr": LR, **steps, "prior_prec": s.prior_prec, "mc_samples": s.mc_samples}
        return {**shared, **paper, **self.options(s)}


#: the methods whose β is an EMA step (VON's family, and Vprop's since the vocabulary change)
_BETA_STEP = ("vprop", "von", "vogn", "noisy_kfac")

METHODS: dict[str, UCIMethod] = {
    m.name: m
    for m in [
        UCIMethod("vadam", _vadam_style, (10, 5), {"khan2018": "Vadam"}),
        UCIMethod("vprop", _vadam_style, (10, 5)),
        UCIMethod("von", _vadam_style, (10, 5)),
        UCIMethod("ivon", lambda s: {"hess_init": 1.0}, (10, 5)),
        UCIMethod("noisy_adam", mc_samples=(10, 5), published={"zhang2018": "NNG-FFG"}),
        UCIMethod("badam"),
        # VOGN is the mean-field noisy natural gradient with per-example (GGN) curvature: NNG-FFG's family
        UCIMethod("vogn", _vogn, (10, 5), {"zhang2018": "NNG-FFG"}),
        UCIMethod("noisy_kfac", _noisy_kfac, (10, 5), {"zhang2018": "NNG-MVG"}),
        UCIMethod(
            "bbvi",
            lambda s: {"init_prec": 10.0},
            (20, 10),
            {"khan2018": "BBVI", "zhang2018": "BBB"},
            samples_in_batch=True,
        ),
        UCIMethod(
            "mc_dropout",
            published={"khan2018": "MC-Dropout"},
            tunes_dropout=True,
            fixed={"prior_prec": GAL_LENGTH_SCALE**2},
        ),
        UCIMethod("map"),
    ]
}
