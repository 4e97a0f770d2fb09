"""The agents of ``ngvi bandits``: Thompson sampling with each approximate posterior, greedy and uniform.

Every network agent is a method of the one registry (:data:`ngvi.experiments.core.METHODS`) on the same
2 × 100 ReLU regression network (contexts → one predicted reward per action). A **Thompson** agent acts on
one posterior draw per decision (:meth:`Agent.act`); BAdam draws from its linearised predictive, as BADAM did
(``linearized=True`` of :func:`ngvi.predict`); **greedy** acts on the mean of a MAP network (BADAM's
"NN which greedily picks each action"); **uniform** picks an action uniformly at random.

Options beside the protocol's shared ones (lr 0.1 with inverse decay, λ, N; see :mod:`.protocol`) are
chosen once for all data sets and stated here and in docs/results/bandits/README.md; the papers give none
for the bandits besides the learning rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

import ngvi

from ..core.methods import METHODS, Method

#: The papers' rules where ngvi's defaults now differ (``docs/CHOOSING.md``): Vadam starts at the prior and
#: steps with eqs. 88-93 (Khan et al.'s Fig. 1), VOGN without momentum, Noisy Adam from f₀ = 0 (NNG Alg. 1).
#: The committed runs used these.
PAPER_RULES: dict[str, dict[str, Any]] = {
    "vadam": {"init_prec": None, "step_moment": "paper"},
    "vogn": {"momentum": 0.0},
    "noisy_adam": {"init_prec": None},
}
#: BBVI starts at σ = 0.01 (precision 10⁴), near Riquelme et al.'s BBB (log σ₀ = −5: "MAP first").
BBVI_INIT_PREC = 1e4
#: VOGN starts at s₀ = 1 (init_prec = λ + N₀·1), as in the UCI protocol: with s₀ ≈ 0 its first
#: natural-gradient steps (ĝ/s) at lr 0.1 are unbounded.
VOGN_INIT_CURVATURE = 1.0
#: Noisy Adam divides its step by f + γ, not √f (NNG Alg. 1): lr 0.1 is a hundred times an Adam step and
#: diverges here; NNG's own step size is 10⁻³ (chosen from 10⁻³, 10⁻², 0.1 with damping 0.01 on a pilot seed).
NOISY_ADAM_LR = 1e-3
#: IVON's β₂ = 0.99999 suits runs of 10⁵ steps; a bandit run of 2,000 rounds trains for 5,000, and with
#: h barely moving from h₀ its Newton-like steps diverge at lr 0.1 on mushroom. β₂ = 0.999 (chosen on a pilot
#: seed from h₀ ∈ {1, 10}, lr ∈ {0.1, 0.01}, β₂ ∈ {0.99999, 0.999}).
IVON_BETAS = (0.9, 0.999)
#: MC dropout's rate: Riquelme et al.'s dropout network keeps 80% of the hidden units (inputs not dropped).
DROPOUT = 0.2
#: BADAM clips BAdam's gradient norm at 5 (App. D.3), as Riquelme et al. do for their greedy network; the
#: variational rules are not clipped: their gradient statistics are their posterior (Vadam's s = ĝ²).
CLIP_NORM = 5.0


@dataclass(frozen=True)
class Setting:
    """What an agent's trainer options may depend on: the first N, λ and the noise precision τ."""

    data_size: int
    prior_prec: float
    noise_prec: float


@dataclass(frozen=True)
class AgentSpec:
    """One agent: a registry method (None for uniform), how it acts, and its trainer options."""

    name: str
    label: str
    method: str | None
    thompson: bool = True
    options: Callable[[Setting], dict[str, Any]] = lambda s: {}
    clip_norm: float | None = None
    lr: float | None = None  # its initial step size, where the protocol's 0.1 does not apply (None: 0.1)
    published: str | None = None  # its row in BADAM Table 1

    @property
    def registered(self) -> Method | None:
        return None if self.method is None else METHODS[self.method]

    @property
    def dropout(self) -> float | None:
        m = self.registered
        return DROPOUT if m is not None and m.dropout else None


AGENTS: dict[str, AgentSpec] = {
    a.name: a
    for a in [
        AgentSpec("vadam", "Vadam", "vadam", options=lambda s: PAPER_RULES["vadam"], published="VADAM"),
        AgentSpec("badam", "BAdam (linearised)", "badam", clip_norm=CLIP_NORM, published="BADAM"),
        AgentSpec(
            "vogn",
            "VOGN",
            "vogn",
            options=lambda s: {
                "beta": 0.01,
                "init_prec": s.prior_prec + s.data_size * VOGN_INIT_CURVATURE,
                "curvature": "ef",
                **PAPER_RULES["vogn"],
            },
        ),
        AgentSpec(
            "noisy_adam",
            "Noisy Adam",
            "noisy_adam",
            options=lambda s: PAPER_RULES["noisy_adam"],
            lr=NOISY_ADAM_LR,
        ),
        AgentSpec("ivon", "IVON", "ivon", options=lambda s: {"hess_init": 1.0, "betas": IVON_BETAS}),
        AgentSpec("bbvi", "BBVI", "bbvi", options=lambda s: {"init_prec": BBVI_INIT_PREC}, published="BBB"),
        AgentSpec("mc_dropout", "MC dropout", "mc_dropout", published="MC DROPOUT"),
        AgentSpec("greedy", "Greedy (MAP)", "map", thompson=False, clip_norm=CLIP_NORM, published="Greedy"),
        AgentSpec("uniform", "Uniform", None, thompson=False, published="Uniform"),
    ]
}


def set_data_size(trainer: Any, data_size: int, prior_prec: float) -> None:
    """Set N in every group, keeping the prior N(0, I/λ) fixed: IVON holds δ = λ/N itself, so it follows."""
    for group in trainer.param_groups:
        group["data_size"] = data_size
        if isinstance(trainer, ngvi.IVON):
            group["weight_decay"] = prior_prec / data_size


def init_uniform_(model: nn.Module, scale: float) -> None:
    """Weights U[−scale, scale], biases 0 (BADAM App. D.3; Riquelme et al.'s ``init_scale``)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear):
                module.weight.uniform_(-scale, scale)
                if module.bias is not None:
                    module.bias.zero_()


@dataclass
class Agent:
    """A network agent in the loop: acts on blocks of contexts, trains on the replay buffer."""

    spec: AgentSpec
    model: nn.Module | None
    trainer: Any
    num_actions: int
    rng: np.random.Generator
    linearized: bool = field(init=False)

    def __post_init__(self) -> None:
        m = self.spec.registered
        self.linearized = bool(m is not None and m.linearized)

    @torch.no_grad()
    def act(self, contexts: torch.Tensor) -> np.ndarray:
        """One action per row of ``contexts`` (the rounds until the next training, when the posterior is
        fixed). Thompson sampling: row j is decided by posterior draw j alone, so the n rows take n
        independent draws, exactly as n rounds acted one after another would; the draws come from
        :func:`ngvi.predict` (one ``sampled_params`` draw, or one linearised draw, per row)."""
        n = contexts.shape[0]
        if self.model is None:
            return self.rng.integers(0, self.num_actions, size=n)
        if not self.spec.thompson:
            values = ngvi.predict(self.model, self.trainer, contexts, samples=0)[0]
        else:
            draws = ngvi.predict(self.model, self.trainer, contexts, samples=n, linearized=self.linearized)
            values = draws[torch.arange(n), torch.arange(n)]  # draw j evaluated on context j
        return values.argmax(1).numpy()
