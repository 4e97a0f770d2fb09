"""NNG's regression protocol's settings for each method of :data:`ngvi.experiments.core.METHODS`.

NNG's regression code (released with the noisy EK-FAC follow-up, config/regression/kfac_*.json) trains
noisy K-FAC with step α = 0.01 on an exponential moving average of V (momentum 0.9, Adam-style bias
correction), factor EMA step β = 0.001, no extrinsic damping, prior variance η = 1, KL weight 1, the true
Fisher (targets sampled from the model), 10 training particles and 100 test particles. Heavy-ball momentum
m with step α(1 − m) takes the same steps once the EMA's bias correction has faded (after ~20 steps), so
the K-FAC-style methods here use lr = 0.001 with momentum 0.9. NNG's code starts the Kronecker factors at
the identity and follows the EMA from there, which is ngvi's ``init_prec="auto"`` (the default of noisy
K-FAC, NNG-BlkTri and noisy Adam: factors, or f, at 1). The other methods get their closest equivalents:

* noisy Adam (NNG-FFG, Alg. 1): α = 0.01, (β₁, β₂) = (0.9, 0.999) — the same α, momentum and Fisher EMA;
  f starts at 1. ``noisy_adam`` squares the minibatch gradient (Alg. 1 as written); ``noisy_adam_pe`` is the
  same with f from per-example squared gradients (``curvature="ef"``, eq. 11's Dw² per example), the
  per-example Fisher scale that the minibatch square underestimates ~M-fold (docs/results/uci-nng);
  ``noisy_adam_fisher`` samples those examples' targets from the model (the true Fisher, NNG's fn. 1).
* VOGN: NNG-FFG's family with per-example Gauss-Newton curvature: the K-FAC settings, s₀ = 1 (NNG's code
  starts its factors at the identity).
* NNG-BlkTri: noisy K-FAC's settings (no per-example sampling: the layers are drawn jointly).
* BBVI (Bayes by Backprop, NNG's BBB row): Adam, step 10⁻³, σ₀² = 1/10 (Khan et al. 2018, App. J.1).

``copies``: the 10 training particles are drawn as 10 copies of the minibatch in one forward pass; this is
the 10-sample estimator where every row gets independent noise: noisy K-FAC with ``sampling="local"``, BBVI's
local reparameterisation, and VOGN with :func:`ngvi.optim.sample_preactivations` (``local``; its curvature,
per-example squared gradients, averages over rows). Noisy Adam's curvature is the square of each sample's
minibatch gradient (Alg. 1), which copies would change, and NNG-BlkTri draws its layers jointly: their
particles are weight samples drawn one after another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.methods import ProtocolMethod

PRIOR_PREC = 1.0  # η = 1
TRAIN_SAMPLES = 10
#: NNG's K-FAC settings for the Kronecker family, every step-shaping keyword explicit (the family's defaults
#: may change; these runs must not)
KFAC_STYLE = {"lr": 1e-3, "momentum": 0.9, "beta": 1e-3, "damping": 0.0, "inv_every": 10, "init_prec": "auto"}
NOISY_ADAM = {"lr": 1e-2, "betas": (0.9, 0.999), "damping": 0.0}  # NNG-FFG's α, momentum and Fisher EMA


@dataclass(frozen=True)
class NNGMethod(ProtocolMethod):
    """A registry method with this protocol's options (besides prior_prec and mc_samples)."""

    name: str
    options: Callable[[int], dict[str, Any]]  # data_size -> trainer keywords
    copies: bool = False
    local: bool = False  # per-example pre-activations for a diagonal rule (ngvi.optim.sample_preactivations)
    true_fisher: bool = False  # targets sampled with precision E_q[τ] (updated every step)
    published: str | None = None  # the row of NNG's Table 1 to put beside it
    extrinsic_damping: bool = False  # takes the protocol's γ_ex (``--damping``)


def _fisher(options: dict[str, Any]) -> Callable[[int], dict[str, Any]]:
    return lambda n: {**options, "curvature": "fisher", "likelihood": "gaussian"}


METHODS: dict[str, NNGMethod] = {
    m.name: m
    for m in [
        NNGMethod(
            "noisy_kfac",
            _fisher({**KFAC_STYLE, "sampling": "local"}),
            copies=True,
            true_fisher=True,
            published="NNG-MVG",
            extrinsic_damping=True,
        ),
        NNGMethod("nng_blktri", _fisher(KFAC_STYLE), true_fisher=True, extrinsic_damping=True),
        # weight draws: its curvature ĝ² is the square of each sample's minibatch gradient
        NNGMethod("noisy_adam", lambda n: dict(NOISY_ADAM), published="NNG-FFG"),
        # the same weight draws and settings, one change: per-example squared gradients
        NNGMethod("noisy_adam_pe", lambda n: dict(NOISY_ADAM), published="NNG-FFG"),
        # ... with targets sampled from the model (true Fisher, as NNG's experiments, fn. 1)
        NNGMethod(
            "noisy_adam_fisher",
            lambda n: {**NOISY_ADAM, "likelihood": "gaussian"},
            true_fisher=True,
            published="NNG-FFG",
        ),
        NNGMethod(
            "vogn",
            lambda n: {
                "lr": 1e-3,
                "momentum": 0.9,
                "beta": 1e-3,
                "init_prec": PRIOR_PREC + n,
                "curvature": "fisher",
                "likelihood": "gaussian",
            },
            copies=True,
            local=True,
            true_fisher=True,
            published="NNG-FFG",
        ),
        NNGMethod("bbvi", lambda n: {"lr": 1e-3, "init_prec": 10.0}, copies=True, published="BBB"),
    ]
}
