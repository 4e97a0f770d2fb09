r"""NNG-full: the noisy natural gradient with a full-covariance Gaussian posterior (Zhang et al. 2018, §3.1).

In minimisation form, with λ = ``kl_weight``, η = ``prior_var``, γ_in = λ/(Nη) and γ = γ_in + γ_ex
(``damping``), over all D parameters w at once (NNG eqs. 9–10, with the Graves/Fisher approximation of
eq. 8):

.. math::
    w &\sim \mathcal N\big(\mu,\ \tfrac{\lambda}{N}(\bar F + \gamma_{in} I)^{-1}\big) \\
    \bar F &\leftarrow (1-\beta)\bar F + \beta\,\hat F,\qquad
        \hat F = \tfrac1M\textstyle\sum_i g_i g_i^\top && (9) \\
    \mu &\leftarrow \mu - \alpha\,(\bar F + \gamma I)^{-1}(\hat g + \gamma_{in}\mu) && (10)

so the posterior precision is Λ = (N/λ)F̄ + I/η. The per-example gradients gᵢ come from the layer hooks
(:mod:`ngvi.curvature.full_fisher`): of the closure's own loss (``curvature="ef"``) or of targets sampled
from the model (``"fisher"``, NNG's choice). The factors' warm start, the schedules (``inv_every``) and the
momentum are those of :class:`~ngvi.NoisyKFAC`; the two damped matrices come from Cholesky factorisations
(:func:`ngvi.curvature.damped_inverses`): B with BBᵀ = (F̄ + γ_in I)⁻¹ for sampling, w = μ + √(λ/N)Bε, and
(F̄ + γI)⁻¹ for the step. Memory and time grow as D² and D³: for models of a few thousand parameters
(``max_params``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .. import _validation as check
from .._tensorlist import TensorList
from ..curvature.full_fisher import PerExampleOuterProducts
from ..curvature.kfac import damped_inverses
from ..curvature.likelihoods import Likelihood
from ..posterior import DiagonalGaussian, FullGaussian, as_full, flatten, unflatten
from . import _nng_prior as nng
from .engine import posterior_prior as pp
from .kronecker import DEFAULTS, KroneckerFamily

__all__ = ["NNGFull"]


class NNGFull(KroneckerFamily):
    """Noisy natural gradient with a dense D×D posterior covariance (NNG-full), for small networks.

    Args:
        model: the network (its trainable parameters in nn.Linear, nn.Conv2d, nn.LayerNorm or nn.GroupNorm
            layers, as for VOGN and NoisyKFAC).
        data_size: N.
        lr: α.
        beta: β, the EMA step of F̄.
        momentum: heavy-ball on the natural step.
        prior_var: η (or ``prior_prec`` = 1/η).
        kl_weight: λ (1 for the ELBO).
        damping: γ_ex.
        inv_every: recompute the two damped inverses every this many steps (NNG: every step).
        mc_samples: per step.
        curvature: ``"ef"`` or ``"fisher"`` (with ``likelihood``, ``noise_prec``).
        likelihood: as for VOGN (``"fisher"`` only).
        prior_prec: 1/η, the name every ngvi optimizer accepts (give ``prior_var`` or this).
        noise_prec: τ of the ``"gaussian"`` likelihood.
        loss_reduction: as for VOGN.
        init_prec: where q starts: ``"auto"`` (default): F̄₀ = I, one unit of curvature per example (as
            noisy K-FAC's A₀ = S₀ = I, and NNG's code, whose factors start at the identity); a number c:
            F̄₀ = (λ/N)(c − 1/η)·I, q₀ with precision c; both then follow the plain EMA. ``None``: F̄₀ = 0
            and the running mean for the first 1/β updates (K-FAC's warm start), so q starts at the prior.
            The other defaults are the family's (:mod:`ngvi.optim.kronecker`).
        kl_clip: the family's trust region κ on the natural step (:mod:`ngvi.optim.kronecker`).
        forget_start: ``None`` (default: the factors' constant β), or ``"auto"``/a number: an early factor
            weight (3·10⁻³) until the start F₀ is 1% of γ_in (:mod:`ngvi.optim.forgetting`, issue 44).
        max_params: refuse models with more parameters than this (D² numbers per matrix).
        **engine_kwargs: ``seed``, ``skip_nonfinite``, ``engine`` (:class:`~ngvi.EngineOptions`), ...

    Raises:
        ValueError: a hyperparameter out of its range, a trainable parameter outside the supported layers, or
            more than ``max_params`` parameters; the message names it.
    """

    #: its own update (the joint posterior's factorisations) is not reviewed for the device path's mask
    _maskable_update = False
    _takes_posterior_prior = True  # a dense one: :meth:`set_prior`

    def __init__(
        self,
        model: nn.Module,
        data_size: int,
        lr: float = DEFAULTS["lr"],
        beta: float = DEFAULTS["beta"],
        momentum: float = DEFAULTS["momentum"],
        prior_var: float | None = None,
        kl_weight: float = 1.0,
        damping: float = DEFAULTS["damping"],
        inv_every: int = DEFAULTS["inv_every"],
        mc_samples: int = 1,
        curvature: str = "ef",
        *,
        likelihood: str | Likelihood | None = None,
        prior_prec: float | None = None,
        noise_prec: float = 1.0,
        loss_reduction: str = "mean",
        init_prec: float | str | None = DEFAULTS["init_prec"],
        kl_clip: float | str | None = DEFAULTS["kl_clip"],
        forget_start: float | str | None = None,
        max_params: int = 4096,
        **engine_kwargs: Any,
    ):
        check.positive_int("max_params", max_params)
        estimator = PerExampleOuterProducts(
            model, curvature, likelihood=likelihood, noise_prec=noise_prec, loss_reduction=loss_reduction
        )
        size = sum(p.numel() for p in estimator.parameters)
        if size > max_params:
            raise ValueError(
                f"NNGFull keeps dense {size}×{size} matrices (the Fisher, its inverse and a root of the "
                f"covariance), and this model has {size:,} trainable parameters, more than max_params="
                f"{max_params}: use ngvi.NoisyKFAC (a Kronecker-factored posterior) or ngvi.NoisyAdam "
                "(a diagonal one), or pass a larger max_params if the memory and the O(D³) inversions fit"
            )
        self.num_weights = size
        hyper = dict(
            data_size=data_size, lr=lr, beta=beta, momentum=momentum,
            prior_var=check.prior_var(prior_var, prior_prec), kl_weight=kl_weight, damping=damping,
            inv_every=inv_every, init_prec=init_prec, kl_clip=kl_clip, forget_start=forget_start,
        )  # fmt: skip
        super().__init__(estimator, hyper, mc_samples=mc_samples, **engine_kwargs)

    def _carrier(self, group: dict[str, Any]) -> Tensor:
        return self.trainable(group)[0]  # the dense state lives with the first parameter

    def _init_state(self, group, p, state):
        if p is not self._carrier(group):
            return
        state["fisher"] = p.new_zeros(self.num_weights, self.num_weights)
        state["fisher"].diagonal().fill_(nng.initial_curvature(group))  # Λ₀ = (N/λ)(F̄₀ + γ_in) = init_prec
        state["fisher_updates"] = 0
        state.update(self._inverses(group, state["fisher"]))

    def _optional_state_shapes(self, p: Tensor) -> dict[str, tuple[int, ...]]:
        d = self.num_weights
        return {"momentum_buffer": (d,), "prior_mean": (d,), "prior_prec": (d, d)}

    @torch.no_grad()
    def set_prior(self, prior: Any, model: Any = None) -> None:
        r"""Train on under ``prior`` = N(m₀, P₀⁻¹) (a posterior of any family, made dense, or a saved file)
        instead of N(0, ηI); ``None`` goes back to it. In eqs. 9–10 the prior's γ_in I = (κ/N)I/η becomes
        Γ = (κ/N)P₀ and γ_in μ becomes Γ(μ − m₀): the posterior precision is (N/κ)F̄ + P₀, and with the exact
        Fisher of a linear-Gaussian model the fixed point is the exact posterior under that prior, so task
        after task it is the joint posterior of all the tasks (tests/optim/test_posterior_prior.py). The
        factorisation is then an eigendecomposition of F̄ + Γ (one serves both damped matrices)."""
        group = self.param_groups[0]
        st = self.state_of(group, self._carrier(group))
        if prior is None:
            for key in pp.PRIOR_STATE:
                st.pop(key, None)
            st.update(self._inverses(group, st["fisher"]))
            return
        prior = pp.resolve(prior, model)
        pp.refuse_options(self)
        params = self.trainable(group)
        pp.check_shapes(type(self).__name__, prior.mean, params)
        pp.check_names(self, prior, model, params)
        if prior.point:
            raise ValueError("NNGFull.set_prior: the prior has point estimates (variance 0)")
        if isinstance(prior, DiagonalGaussian):
            prec = torch.diag(flatten([v.double() for v in prior.variance]).reciprocal())
        else:
            prec = torch.linalg.inv(as_full(prior).covariance.double())
        fisher = st["fisher"]
        st["prior_mean"] = flatten([m.detach() for m in prior.mean]).to(fisher.device, fisher.dtype)
        st["prior_prec"] = (0.5 * (prec + prec.mT)).to(fisher.device, fisher.dtype)
        st.update(self._inverses(group, fisher, st))

    def _inverses(
        self, group: dict[str, Any], fisher: Tensor, state: dict[str, Any] | None = None
    ) -> dict[str, Tensor]:
        """B with BBᵀ = (F̄ + γ_in I)⁻¹ and (F̄ + γ I)⁻¹; under a posterior prior F̄ + Γ in place of
        F̄ + γ_in I (:meth:`set_prior`)."""
        if state is not None and "prior_prec" in state:
            gamma = state["prior_prec"] * (group["kl_weight"] / group["data_size"])
            values, vectors = torch.linalg.eigh(fisher + gamma)
            values = values.clamp_min(torch.finfo(values.dtype).tiny)
            root = vectors * values.rsqrt()
            inverse = (vectors / (values + group["damping"])) @ vectors.mT
            return {"root": root, "inverse": inverse}
        gamma_in = self.intrinsic_damping(group)
        c_in = fisher.new_full((1,), gamma_in)
        c = fisher.new_full((1,), gamma_in + group["damping"])
        root, inverse = damped_inverses(fisher[None], c_in, c)
        return {"root": root[0], "inverse": inverse[0]}

    def _check_all(self, group: dict[str, Any], params: list[Tensor]) -> None:
        if len(params) != len(self.trainable(group)):
            raise RuntimeError(
                "NNGFull's Fisher covers all trainable parameters jointly, but some of them got no gradient "
                "in this step (unused in the forward pass?); freeze them (requires_grad_(False)) first"
            )

    def _perturb(self, group, params, noise, states):
        """w ← μ + √(λ/N) B ε, all parameters at once."""
        self._check_all(group, list(params))
        st = states[0]
        draw = (st["root"] @ flatten(list(noise))).mul_(math.sqrt(group["kl_weight"] / group["data_size"]))
        for p, part in zip(params, unflatten(draw, [p.shape for p in params]), strict=True):
            p.add_(part)

    def _precision(self, group, states):
        """Marginal precisions 1/Σⱼⱼ (the sampling uses the dense covariance)."""
        st = states[0]
        var = st["root"].square().sum(-1) * (group["kl_weight"] / group["data_size"])
        return TensorList(unflatten(var.reciprocal(), [p.shape for p in self.trainable(group)]))

    def _update(self, group, means, grads, curvs, states):
        params = self.accumulator.params(group)
        self._check_all(group, params)
        st = states[0]
        new: dict[str, Any] = {}
        fisher = st["fisher"]
        if curvs is not None:
            count = st["fisher_updates"] + 1
            fisher = fisher.lerp(curvs[0].view_as(fisher), self._factor_step(group, count))  # (9)
            new.update(fisher=fisher, fisher_updates=count)
        if self._inverting(group):
            new.update(self._inverses(group, fisher, st))
        inverse = new.get("inverse", st["inverse"])
        if "prior_prec" in st:  # ĝ + Γ(μ − m₀), Γ = (κ/N)P₀ (set_prior)
            gamma = st["prior_prec"] * (group["kl_weight"] / group["data_size"])
            v = flatten(list(grads)).add_(gamma @ (flatten(list(means)) - st["prior_mean"]))
        else:
            v = flatten(list(grads)).add_(flatten(list(means)), alpha=self.intrinsic_damping(group))
        step = inverse @ v  # (10): (F̄ + γI)⁻¹ (ĝ + γ_in μ)
        if self._kl_clip(group) is not None:  # the family's trust region (kronecker.py)
            step = step * self._trust_region(group, [step], [v]).to(step.dtype)
        step = self._heavy_ball(group, step, st, new)
        st.update(new)
        for mean, part in zip(means, unflatten(step, [m.shape for m in means]), strict=True):
            mean.add_(part, alpha=-group["lr"])

    @torch.no_grad()
    def posterior(self) -> FullGaussian:
        """A snapshot of q = N(μ, (λ/N)(F̄ + γ_in I)⁻¹) over all parameters, in parameter order."""
        group = self.param_groups[0]
        params = self.trainable(group)
        states = [self.state_of(group, p) for p in params]  # every mean in its state's precision (a master)
        root = states[0]["root"].double()
        cov = (root @ root.mT).mul_(group["kl_weight"] / group["data_size"])
        return FullGaussian([self.mean_of(p) for p in params], cov)
