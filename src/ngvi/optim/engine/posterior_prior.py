r"""A posterior as the next prior (variational continual learning): ``opt.set_prior(posterior)``.

A rule's prior is N(0, I/λ) with one number λ per parameter group. After ``set_prior(q_prev)`` it is
q_prev = N(m₀, diag(1/Λ₀)) (or a dense N(m₀, P₀⁻¹) for NNG-full), and the KL term of the ELBO pulls towards
m₀ with the per-weight precision Λ₀:

.. math::
    \text{precision} = N\hat s + \Lambda_0 \quad(\text{in place of } N\hat s + \lambda),\qquad
    \text{gradient} = \hat g + \tilde\Lambda_0\odot(\mu - m_0),\quad \tilde\Lambda_0 = c\,\Lambda_0,

with c the rule's own scale of λ (1/N for Vadam, Vprop, VON, VOGN, IVON and BAdam; κ/N for noisy Adam, whose
γ_in = κ/(Nη)). Every place where a rule's core reads λ̃ (the gradient's λ̃μ, the precision's shift, VON's
and IVON's Riemannian correction, Vadam's √ŝ + λ̃) then reads Λ̃₀ weight by weight, and ĝ is replaced by
ĝ − Λ̃₀⊙m₀, so that ĝ + Λ̃₀⊙μ is the gradient above. Without a posterior prior nothing here runs: the
rules compute exactly what they computed before (the golden trajectories stay bitwise).

**Where it lives.** m₀ and Λ₀ are two state tensors of each parameter, ``prior_mean`` and ``prior_prec``,
shaped like it, in its state's dtype: so a state dict saves them and ``load_state_dict`` restores them, the
flat path (:mod:`.flat`) flattens them with the rest of the state, and ``set_prior(None)`` removes them.

**Matching.** The prior covers the optimizer's trainable parameters in the order of ``opt.posterior()``
(parameter groups in order; frozen parameters left out, as ``posterior()`` leaves them out). Tensors of
another count or shape are refused in one line; with ``model=`` and a posterior that knows its names (a
saved file, :func:`ngvi.posterior_of`) the names must be the model's names of those parameters. A parameter
frozen when the prior was set, or a point estimate of the prior (variance 0), keeps its group's scalar λ.

**What else reads λ.** ``empirical_bayes=`` learns a scalar λ, which a per-weight prior replaces: the two are
refused together. :func:`ngvi.calibrate` (``fit_prior=True``) fits a scalar λ too and refuses an optimizer
with a posterior prior; ``fit_prior=False`` is unaffected. ``compile=True`` is refused (the per-weight
tensors would be static inputs of the compiled core, one recompilation per step).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

from ..._tensorlist import TensorList

#: the state entries of a posterior prior (per weight, shaped like the parameter)
PRIOR_STATE = ("prior_mean", "prior_prec")


def has_prior(states: list[dict[str, Any]]) -> bool:
    """Whether any of ``states`` carries a posterior prior."""
    return any("prior_prec" in st for st in states)


def shifted(states: list[dict[str, Any]], value: Any, scale: float, prec: float) -> Any:
    r"""``value`` (a rule's λ-dependent number: λ̃ = cλ, or a precision's shift) with λ replaced by each
    state's Λ₀: value + c(Λ₀ − λ) per tensor. ``value`` itself (the same object) without a posterior prior.
    ``value`` may be one number or one per state; ``scale`` is c and ``prec`` the group's λ."""
    if not has_prior(states):
        return value
    values = value if isinstance(value, list | tuple) else [value] * len(states)
    out = []
    for st, v in zip(states, values, strict=True):
        lam = st.get("prior_prec")
        out.append(
            torch.full_like(_shape_of(st), float(v)) if lam is None else (lam - prec).mul_(scale).add_(v)
        )
    return TensorList(out)


def pulled(states: list[dict[str, Any]], grads: Any, tilde: Any) -> Any:
    """ĝ − Λ̃₀⊙m₀ (new tensors), so that the core's ĝ + Λ̃₀⊙μ is ĝ + Λ̃₀⊙(μ − m₀); ``grads`` unchanged
    without a posterior prior. ``tilde`` is :func:`shifted`'s list of Λ̃₀."""
    if not has_prior(states):
        return grads
    out = []
    for st, g, t in zip(states, grads, tilde, strict=True):
        m0 = st.get("prior_mean")
        out.append(g.clone() if m0 is None else g - t * m0)
    return TensorList(out)


def _shape_of(st: dict[str, Any]) -> Tensor:
    return next(v for v in st.values() if isinstance(v, Tensor) and v.dim() >= 0 and v.is_floating_point())


def resolve(prior: Any, model: Any = None) -> Any:
    """A posterior from a posterior or a saved file (:func:`ngvi.load_posterior`, checked against
    ``model`` when given)."""
    from ...posterior import GaussianPosterior
    from ...posterior.io import load_posterior

    if isinstance(prior, str | os.PathLike):
        return load_posterior(prior, model)
    if not isinstance(prior, GaussianPosterior):
        raise TypeError(
            "set_prior takes a posterior (opt.posterior(), ngvi.merge(...)), the path of a saved posterior, "
            f"or None (back to the scalar prior), got {type(prior).__name__}"
        )
    return prior


def check_names(opt: Any, prior: Any, model: Any, params: list[Tensor]) -> None:
    """With ``model`` and a posterior that knows its names: they must be the model's names of ``params``."""
    if model is None or not prior.names:
        return
    names = {id(p): n for n, p in model.named_parameters()}
    ours = [names.get(id(p), "?") for p in params]
    for i, (a, b) in enumerate(zip(prior.names, ours, strict=False)):
        if a != b:
            raise ValueError(
                f"set_prior: the prior's tensor {i} is {a!r} but the optimizer's parameter {i} is {b!r} in "
                "this model: pass the posterior of the same model, with the same parameters trainable"
            )


def check_shapes(name: str, means: list[Tensor], params: list[Tensor]) -> None:
    """One line for a prior of another count or shape than the optimizer's trainable parameters."""
    if len(means) != len(params):
        raise ValueError(
            f"{name}.set_prior: the prior covers {len(means)} tensors, the optimizer has {len(params)} "
            "trainable parameters: pass the posterior of the same model with the same parameters trainable"
        )
    for i, (m, p) in enumerate(zip(means, params, strict=True)):
        if tuple(m.shape) != tuple(p.shape):
            raise ValueError(
                f"{name}.set_prior: the prior's tensor {i} has shape {tuple(m.shape)}, the optimizer's "
                f"parameter {i} has {tuple(p.shape)}: pass the posterior of the same model"
            )


def refuse_options(opt: Any) -> None:
    """The options a posterior prior does not combine with (module docstring)."""
    name = type(opt).__name__
    if opt.empirical_bayes is not None:
        raise ValueError(
            f"{name}.set_prior: empirical_bayes= learns a scalar prior precision, which a posterior prior "
            "replaces weight by weight; build the optimizer without empirical_bayes to train under one"
        )
    if opt.compile:
        raise ValueError(f"{name}.set_prior: a posterior prior is not supported with compile=True yet")
    if opt._in_sample:
        raise RuntimeError(f"{name}.set_prior: a posterior sample is open; call it between steps")
    from . import sharded

    if any(sharded.is_sharded(p) for g in opt.param_groups for p in g["params"]):
        raise ValueError(f"{name}.set_prior: FSDP2-sharded parameters are not supported yet")


@torch.no_grad()
def set_diagonal_prior(opt: Any, prior: Any, model: Any = None) -> None:
    """``opt.set_prior`` for the diagonal rules (module docstring): writes ``prior_mean`` and
    ``prior_prec`` into each trainable parameter's state, or removes them for ``prior=None``."""
    from ...posterior import DiagonalGaussian

    name = type(opt).__name__
    if prior is None:
        for st in opt.state.values():
            for key in PRIOR_STATE:
                st.pop(key, None)
        return
    prior = resolve(prior, model)
    if not isinstance(prior, DiagonalGaussian):
        raise TypeError(
            f"{name}.set_prior takes a DiagonalGaussian (a mean-field posterior), got "
            f"{type(prior).__name__}: "
            "a Kronecker or full posterior as the prior of a mean-field rule would drop its correlations "
            "silently; pass ngvi.DiagonalGaussian(post.mean, post.variance) to say so"
        )
    refuse_options(opt)
    pairs = [(g, p) for g in opt.param_groups for p in opt.trainable(g)]
    params = [p for _, p in pairs]
    check_shapes(name, prior.mean, params)
    check_names(opt, prior, model, params)
    for i, ((group, p), m0, var) in enumerate(zip(pairs, prior.mean, prior.variance, strict=True)):
        if not bool(torch.isfinite(m0).all()):
            raise ValueError(f"{name}.set_prior: the prior's mean {i} holds NaN or Inf")
        st = opt.state_of(group, p)
        like = _shape_of(st)
        if i in prior.point:  # a point estimate has no precision to pull with: the group's λ stays
            for key in PRIOR_STATE:
                st.pop(key, None)
            continue
        st["prior_mean"] = m0.detach().to(like.device, like.dtype).clone()
        st["prior_prec"] = var.detach().to(like.device, torch.float64).reciprocal().to(like.dtype)
