r"""BAdam: Adam, read as a Laplace approximation (BADAM, Alg. 1 and eq. 12).

Training is plain Adam on the MAP objective f(θ) + (λ/2N)‖θ‖² at the mean (no weight perturbation):

.. math::
    g &= \hat g + \tilde\lambda\theta,\quad
    m \leftarrow \beta_1 m + (1-\beta_1) g,\quad v \leftarrow \beta_2 v + (1-\beta_2) g^2 \\
    \theta &\leftarrow \theta - \alpha\,\hat m/(\sqrt{\hat v} + \epsilon)

and the posterior is read off the second moment: q = N(θ, (N(√v̂ + ε) + λ)⁻¹), i.e. BADAM's
N(θ, (N diag(v̂^{1/2}))⁻¹) plus the prior precision. ε keeps the precision positive where v̂ = 0.
``sampled_params`` draws from this q (for prediction); ``step`` never perturbs.

**The default prior, λ = 1** (issue 32): the N(0, I) prior of ngvi's other rules (Vadam, VON, VOGN, BBVI,
MAP). With BADAM's λ = 0 a weight whose gradient is always zero (a ReLU unit dead on the data, an input that
is always 0) keeps v̂ = 0 and gets σ = 1/√(Nε): 707 at N = 200 on the demo's former 1-50-1 ReLU net (both
layers trained), whose sampled predictive s.d. was then ~2·10⁶ (linearised: median 43–67). With λ = 1 every σ
is at most 1/√λ = 1; on the same net (1,000 full-batch steps, lr 10⁻², seeds 0–1) the sampled predictive s.d.
has median 2.5–3.2 and the linearised one 0.55–0.57, the predictive BAdam is meant for (the experiments'
registry marks it ``linearized``). Training barely notices: the prior adds weight decay λ/N (on the toy of
``tests/optim/test_defaults.py`` the train MSE after 200 steps is 0.0189–0.0190 against 0.0190–0.0196 at λ =
0). Pass ``prior_prec=0`` for BADAM as published (its pruning experiment does).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _validation as check
from . import functional as F
from .engine import posterior_prior as pp
from .engine.optimizer import VariationalOptimizer


class BAdam(VariationalOptimizer):
    """Bayesian Adam (Laplace posterior from Adam's second moment).

    ``prior_prec`` λ defaults to 1 (the prior N(0, I)), so σ ≤ 1 even for weights the data never moves;
    ``prior_prec=0`` is BADAM as published (see the module docstring for the numbers).

    Args:
        params: parameters or groups.
        data_size: N.
        lr: α, Adam's step.
        betas: Adam's (β₁, β₂).
        prior_prec: λ.
        eps: Adam's ε, also in the precision N(√v̂ + ε) + λ.
        mc_samples: must be 1: BAdam takes its gradient at the mean (it is Adam); sampling is for prediction.
        **engine_kwargs: the options of every ngvi optimizer: ``seed``, ``skip_nonfinite``,
            ``empirical_bayes`` and ``engine`` (an :class:`~ngvi.EngineOptions` or a dict: ``noise``,
            ``noise_dtype``, ``rank_noise``, ``compile``, ``fp32_state``, ``finite_check``, ``flat``):
            see :class:`~ngvi.VariationalOptimizer`.

    Raises:
        ValueError: a hyperparameter out of its range, or ``mc_samples`` other than 1 (use Vadam for sampled
            gradients); the message names it.
    """

    _takes_posterior_prior = True  # set_prior (:mod:`.engine.posterior_prior`)

    elementwise = True
    _curvature_state = "exp_avg_sq"  # what ``diagnostics()`` watches move (:mod:`.diagnostics`)

    _perturbs_in_step = False

    def __init__(
        self,
        params,
        data_size: int,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        prior_prec: float = 1.0,
        eps: float = 1e-8,
        mc_samples: int = 1,
        **engine_kwargs: Any,
    ):
        if check.positive_int("mc_samples", mc_samples) != 1:
            raise ValueError(
                f"BAdam takes its gradient at the mean (it is Adam), so mc_samples must be 1, got "
                f"{mc_samples!r}; for sampled gradients use ngvi.Vadam"
            )
        defaults = dict(data_size=data_size, lr=lr, betas=betas, prior_prec=prior_prec, eps=eps)
        super().__init__(params, defaults, mc_samples=1, **engine_kwargs)

    def _check_group(self, group):
        check.data_size(group["data_size"])
        check.nonnegative("lr", group["lr"])
        check.betas("betas", group["betas"])
        check.nonnegative("prior_prec", group["prior_prec"])
        check.positive("eps", group["eps"])

    def _init_state(self, group, p, state):
        state["exp_avg"] = torch.zeros_like(p)
        state["exp_avg_sq"] = torch.zeros_like(p)

    def _precision_core(self, group, states):
        return (
            F.laplace_precision,
            ([st["exp_avg_sq"] for st in states],),
            dict(
                bias2=[1 - group["betas"][1] ** st["step"] if st["step"] else 1.0 for st in states],
                eps=group["eps"],
                data_size=float(group["data_size"]),
                prior_prec=pp.shifted(states, group["prior_prec"], 1.0, group["prior_prec"]),
            ),
        )

    def _update(self, group, means, grads, curvs, states):
        beta1, beta2 = group["betas"]
        n = group["data_size"]
        prior_tilde = pp.shifted(states, group["prior_prec"] / n, 1 / n, group["prior_prec"])
        F.run_core(
            F.badam_update_,
            means,
            pp.pulled(states, grads, prior_tilde),
            [st["exp_avg"] for st in states],
            [st["exp_avg_sq"] for st in states],
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            eps=group["eps"],
            prior_tilde=prior_tilde if pp.has_prior(states) or prior_tilde else None,  # λ = 0: g = ĝ
            bias1=F.bias_corrections(beta1, states),
            bias2=F.bias_corrections(beta2, states),
            compile=self.compile,
        )
