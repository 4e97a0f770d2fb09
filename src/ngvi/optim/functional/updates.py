"""The update cores, one per rule: μ and the state in place, from the MC means ĝ and ĥ."""

from __future__ import annotations

import torch

from ..._tensorlist import TensorList
from ._capture import (
    Num,
    Nums,
    Tensors,
    _add,
    _add_,
    _add_into,
    _add_scaled_,
    _addcdiv_,
    _clamp_,
    _div,
    _mul,
)
from .blocks import (
    RegionCore,
    RegionTerm,
    adam_moments_,
    adam_step_,
    region_core,
    riemannian_ema_,
    scale_,
    sq_terms,
)


def vadam_update_(
    means: Tensors,
    grads: Tensors,
    curvs: Tensors,
    exp_avg: Tensors,
    exp_avg_sq: Tensors,
    *,
    lr: Num,
    beta1: Num,
    beta2: Num,
    prior_tilde: Num,
    bias1: Nums,
    bias2: Nums,
) -> None:
    r"""Vadam (Khan et al. 2018, Fig. 1, eqs. 89–93), in place on μ, u, s:

    .. math::
        u &\leftarrow \gamma_1 u + (1-\gamma_1)(\hat g + \tilde\lambda\mu)   && (89)\\
        s &\leftarrow \gamma_2 s + (1-\gamma_2)\,\hat g^2                      && (90)\\
        \mu &\leftarrow \mu - \alpha\,\frac{u/(1-\gamma_1^t)}{\sqrt{s/(1-\gamma_2^t)} + \tilde\lambda}
                                                                               && (91\text{–}93)

    ``curvs`` = ĝ² (MC mean of squares), ``bias1``/``bias2`` = 1−γ₁ᵗ, 1−γ₂ᵗ per tensor,
    ``prior_tilde`` = λ/N."""
    mu = TensorList(means)
    adam_moments_(
        exp_avg, exp_avg_sq, _mul(mu, prior_tilde).add_(TensorList(grads)), curvs, beta1=beta1, beta2=beta2
    )
    adam_step_(means, exp_avg, exp_avg_sq, lr=lr, bias1=bias1, bias2=bias2, eps=prior_tilde)


def vprop_update_(
    means: Tensors,
    grads: Tensors,
    curvs: Tensors,
    exp_avg_sq: Tensors,
    *,
    lr: Num,
    beta: Num,
    prior_tilde: Num,
    bias: Nums | None = None,
) -> None:
    r"""Vprop (Khan et al. 2018, eq. 14), in place on μ and s; ``beta`` is the paper's step β:

    .. math::
        s \leftarrow (1-\beta)\,s + \beta\,\hat g^2,\qquad
        \mu \leftarrow \mu - \alpha\,(\hat g + \tilde\lambda\mu)/(\sqrt s + \tilde\lambda)

    With ``bias`` = 1−(1−β)ᵗ per tensor (``step_moment="debiased"``; s is then the EMA v started at 0) the
    step divides by √(v/(1−(1−β)ᵗ)) + λ̃ instead."""
    mu, s = TensorList(means), TensorList(exp_avg_sq)
    s.lerp_(TensorList(curvs), beta)
    step = _mul(mu, prior_tilde).add_(TensorList(grads))  # ĝ + λ̃μ
    root = s.sqrt() if bias is None else _div(s, bias).sqrt_()
    _addcdiv_(mu, step, _add_(root, prior_tilde), -lr)


@region_core
def von_update_(
    means: Tensors,
    grads: Tensors,
    curvs: Tensors,
    hess: Tensors,
    momentum_buffer: Tensors | None = None,
    *,
    lr: Num,
    beta: Num,
    prior_tilde: Num,
    momentum: Num = 0.0,
    kl_clip: Num | None = None,
) -> RegionCore:
    r"""VON (Khan et al. 2018, eqs. 7–8) with the Riemannian correction, in place on μ and s:

    .. math::
        s_{t+1} &= (1-\beta)s_t + \beta\hat h + \tfrac12\beta^2(\hat h - s_t)^2/(s_t + \tilde\lambda) && (8)\\
        \mu_{t+1} &= \mu_t - \alpha\,\frac{\hat g + \tilde\lambda\mu_t}{s_{t+1} + \tilde\lambda}
                   + \gamma\frac{s_t + \tilde\lambda}{s_{t+1} + \tilde\lambda}(\mu_t - \mu_{t-1})  && (7, 18)

    with the new s in eq. 7 (the natural-gradient step uses the updated precision). The last term is the
    natural momentum of eq. 18 (App. E), γ = ``momentum``; ``momentum_buffer`` holds μ_t − μ_{t−1}
    (``None``: no momentum, eqs. 7–8 alone). ``kl_clip`` = κ scales the natural step α(ĝ + λ̃μ)/(s + λ̃),
    before the momentum, by :func:`~.blocks.trust_region`'s ν (``None``: no trust region), with
    m = Σ (ĝ + λ̃μ)²/(s + λ̃) over the whole group (:func:`~.blocks.region_core`). ``curvs`` is consumed: it
    holds s_{t+1} + λ̃ afterwards (so the step holds one temporary fewer across the region's pause)."""
    mu, s = TensorList(means), TensorList(hess)
    buffers = None if momentum_buffer is None else TensorList(momentum_buffer)
    if buffers is not None:  # γ (s_t + λ̃)(μ_t − μ_{t−1}), with s_t (and before the trust region's pause)
        buffers.mul_(_add(s, prior_tilde)).mul_(momentum)
    riemannian_ema_(s, curvs, beta=beta, damping=prior_tilde)
    step = _mul(mu, prior_tilde).add_(TensorList(grads))  # ĝ + λ̃μ
    precision = TensorList(curvs)  # ĥ is consumed: its buffer holds s_{t+1} + λ̃ (no new temporary)
    tildes = prior_tilde.tensors if isinstance(prior_tilde, TensorList) else [prior_tilde] * len(mu)
    for out, s_t, lam in zip(precision, s, tildes, strict=True):
        _add_into(out, s_t, lam)
    if kl_clip is not None:
        scale_(step, (yield RegionTerm(sq_terms(step, precision), lr, kl_clip)))
    if buffers is None:
        _addcdiv_(mu, step, precision, -lr)
        return
    _add_scaled_(buffers, step, -lr)
    buffers.div_(precision)  # (18): the buffer now holds μ_{t+1} − μ_t
    mu.add_(buffers)


@region_core
def ivon_update_(
    means: Tensors,
    grads: Tensors,
    curvs: Tensors,
    momentum: Tensors,
    hess: Tensors,
    *,
    lr: Num,
    beta1: Num,
    beta2: Num,
    weight_decay: Num,
    bias1: Nums,
    clip_radius: Num | None = None,
    kl_clip: Num | None = None,
) -> RegionCore:
    r"""IVON (Shen et al. 2024, Alg. 1, as in docs/NOTATION.md), in place on m, ḡ, h:

    .. math::
        \bar g &\leftarrow \beta_1\bar g + (1-\beta_1)\hat g \\
        h &\leftarrow \beta_2 h + (1-\beta_2)\hat h + \tfrac12(1-\beta_2)^2(h-\hat h)^2/(h+\delta) \\
        m &\leftarrow m - \alpha\,\mathrm{clip}\big((\bar g/(1-\beta_1^t) + \delta m)/(h+\delta)\big)

    ``bias1`` = 1−β₁ᵗ per tensor, δ = ``weight_decay``; ``clip_radius=None`` means no clipping.
    ``kl_clip`` = κ scales the step by :func:`~.blocks.trust_region`'s ν in the metric h + δ, before the
    element-wise clip (``None``: no trust region), m over the whole group (:func:`~.blocks.region_core`)."""
    m, g_bar, h = TensorList(means), TensorList(momentum), TensorList(hess)
    g_bar.lerp_(TensorList(grads), 1 - beta1)
    riemannian_ema_(h, curvs, beta=1 - beta2, damping=weight_decay, coef=0.5 * (1 - beta2) ** 2)
    precision = _add(h, weight_decay)
    numer = _div(g_bar, bias1).add_(_mul(m, weight_decay))
    if kl_clip is None:
        step = numer.div_(precision)
    else:  # m = Σ step·u = Σ u²/(h + δ), the terms in u's memory (freed once the engine has their sum)
        step = _div(numer, precision)
        region = RegionTerm(numer.mul_(step), lr, kl_clip)
        del numer, precision
        scale_(step, (yield region))
    if clip_radius is not None:
        _clamp_(step, clip_radius)
    _add_scaled_(m, step, -lr)


@region_core
def noisy_adam_update_(
    means: Tensors,
    grads: Tensors,
    curvs: Tensors,
    exp_avg: Tensors,
    fisher: Tensors,
    *,
    lr: Num,
    beta1: Num,
    beta2: Num,
    gamma_in: Num,
    damping: Num,
    bias1: Nums,
    kl_clip: Num | None = None,
) -> RegionCore:
    r"""Noisy Adam (Zhang et al. 2018, Alg. 1, minimisation form), in place on μ, m, f:

    .. math::
        v = \hat g + \gamma_{in}\mu,\quad m \leftarrow \beta_1 m + (1-\beta_1)v,\quad
        f \leftarrow \beta_2 f + (1-\beta_2)\hat g^2,\quad
        \mu \leftarrow \mu - \alpha\,\frac{m/(1-\beta_1^k)}{f + \gamma_{in} + \gamma_{ex}}

    ``curvs`` = ĝ², ``damping`` = γ_ex, ``bias1`` = 1−β₁ᵏ per tensor. ``kl_clip`` = κ scales the step by
    :func:`~.blocks.trust_region`'s ν in the metric f + γ_in + γ_ex (``None``: no trust region), m over the
    whole group (:func:`~.blocks.region_core`)."""
    mu = TensorList(means)
    v = _mul(mu, gamma_in).add_(TensorList(grads))  # ĝ + γ_in μ
    adam_moments_(exp_avg, fisher, v, curvs, beta1=beta1, beta2=beta2)
    del v  # no temporary is held across the trust region's pause but P
    precision = _add(TensorList(fisher), gamma_in + damping)
    numer = TensorList(exp_avg)
    if kl_clip is not None:  # m = Σ m̂²/P with m̂ = m/(1−β₁ᵏ); ν divides the temporary P (exact where ν = 1)
        region = RegionTerm(sq_terms(numer, precision).mul_([1 / (b * b) for b in bias1]), lr, kl_clip)
        scale_(precision, 1 / (yield region))
    _addcdiv_(mu, numer, precision, [-lr / b for b in bias1])


def badam_update_(
    means: Tensors,
    grads: Tensors,
    exp_avg: Tensors,
    exp_avg_sq: Tensors,
    *,
    lr: Num,
    beta1: Num,
    beta2: Num,
    eps: Num,
    prior_tilde: Num | None,
    bias1: Nums,
    bias2: Nums,
) -> None:
    r"""BADAM training step (Alg. 1): Adam on f(θ) + (λ/2N)‖θ‖² at the mean, in place on θ, m, v:

    .. math::
        g = \hat g + \tilde\lambda\theta,\quad m \leftarrow \beta_1 m + (1-\beta_1)g,\quad
        v \leftarrow \beta_2 v + (1-\beta_2)g^2,\quad
        \theta \leftarrow \theta - \alpha\,\hat m/(\sqrt{\hat v}+\epsilon)

    ``prior_tilde=None`` for λ = 0 (then g = ĝ, with no extra pass)."""
    g = TensorList(grads)
    if prior_tilde is not None:
        g = g + _mul(TensorList(means), prior_tilde)
    adam_moments_(exp_avg, exp_avg_sq, g, g.square(), beta1=beta1, beta2=beta2)
    adam_step_(means, exp_avg, exp_avg_sq, lr=lr, bias1=bias1, bias2=bias2, eps=eps)


@region_core
def vadagrad_update_(
    means: Tensors,
    grads: Tensors,
    curvs: Tensors,
    sum_sq: Tensors,
    *,
    lr: Num,
    beta: Num,
    init_prec: Num = 1.0,
    kl_clip: Num | None = None,
) -> RegionCore:
    r"""VadaGrad (Khan et al. 2018, App. F, eq. 96), in place on μ and s:
    :math:`s \leftarrow s + \beta\hat g^2`, :math:`\mu \leftarrow \mu - \alpha\,\hat g/\sqrt s`.

    ``kl_clip`` = κ scales the step by :func:`~.blocks.trust_region`'s ν with m = Σ Δ²·√(s/s₀) (s₀ =
    ``init_prec``): ‖Δμ‖² ≤ κ at the start, and looser as s grows (``None``: no trust region)."""
    s = TensorList(sum_sq)
    _add_scaled_(s, TensorList(curvs), beta)
    root, step = s.sqrt(), TensorList(grads)
    if kl_clip is not None:  # m = Σ ĝ²/(√s·√s₀); ν divides the temporary √s (exact where ν = 1)
        region = RegionTerm(sq_terms(step, root).mul_(1 / init_prec**0.5), lr, kl_clip)
        scale_(root, 1 / (yield region))
    _addcdiv_(TensorList(means), step, root, -lr)


@region_core
def vogn_update_(
    means: Tensors,
    grads: Tensors,
    curvs: Tensors,
    hess: Tensors,
    scratch: Tensors,
    momentum_buffer: Tensors | None = None,
    *,
    lr: Num,
    beta: Num,
    momentum: Num,
    prior_tilde: Num,
    kl_clip: Num | None = None,
) -> RegionCore:
    r"""VOGN (Khan et al. 2018, eqs. 7 and 10) with natural momentum (App. E, eq. 82), in place on μ and s:

    .. math::
        s_{t+1} &= (1-\beta)s_t + \beta\hat h                                                    && (10)\\
        \mu_{t+1} &= \mu_t - \alpha\frac{\hat g + \tilde\lambda\mu_t}{s_{t+1} + \tilde\lambda}
                   + \gamma\frac{s_t + \tilde\lambda}{s_{t+1} + \tilde\lambda}(\mu_t - \mu_{t-1})  && (7, 82)

    ``momentum_buffer`` holds μ_t − μ_{t−1} (``None``: no momentum). ``scratch`` is one buffer shaped like
    each tensor, which it overwrites (VOGN keeps one per parameter across steps on the per-tensor path:
    fresh temporaries cost page faults on CPU); ``curvs`` is consumed: it holds s_{t+1} + λ̃ afterwards.
    ``kl_clip`` = κ scales the natural step α(ĝ + λ̃μ)/(s_{t+1} + λ̃), before the momentum, by
    :func:`~.blocks.trust_region`'s ν (``None``: no trust region)."""
    mu, s, h_hat, step = TensorList(means), TensorList(hess), TensorList(curvs), TensorList(scratch)
    # λ̃ of each tensor: one number, or one tensor per weight under a posterior prior (ngvi.optim.engine
    # .posterior_prior, which hands a TensorList)
    tildes = prior_tilde.tensors if isinstance(prior_tilde, TensorList) else [prior_tilde] * len(mu)
    if momentum_buffer is not None:
        buffers = TensorList(momentum_buffer)
        for out, s_t, lam in zip(step, s, tildes, strict=True):
            _add_into(out, s_t, lam)  # s_t + λ̃
        buffers.mul_(step).mul_(momentum)
    for out, g, m, lam in zip(step, grads, mu, tildes, strict=True):
        _add_into(out, g, m, alpha=lam)  # ĝ + λ̃μ
    s.lerp_(h_hat, beta)  # (10)
    for out, s_t, lam in zip(h_hat, s, tildes, strict=True):
        _add_into(out, s_t, lam)  # s_{t+1} + λ̃
    if kl_clip is not None:
        scale_(step, (yield RegionTerm(sq_terms(step, h_hat), lr, kl_clip)))
    if momentum_buffer is None:
        _addcdiv_(mu, step, h_hat, -lr)  # (7)
        return
    _add_scaled_(buffers, step, -lr)
    buffers.div_(h_hat)  # eq. 82, with μ_t − μ_{t−1} kept in the buffer
    mu.add_(buffers)


def bbvi_update_(
    means: Tensors,
    log_std: Tensors,
    grads: Tensors,
    curvs: Tensors,
    exp_avg: Tensors,
    exp_avg_sq: Tensors,
    log_std_exp_avg: Tensors,
    log_std_exp_avg_sq: Tensors,
    *,
    lr: Num,
    beta1: Num,
    beta2: Num,
    eps: Num,
    prior_prec: Num,
    data_size: Num,
    bias1: Nums,
    bias2: Nums,
) -> None:
    r"""Bayes by Backprop (Blundell et al. 2015): Adam on (μ, log σ) for the per-example negative ELBO,

    .. math::
        \nabla_\mu = \hat g + \tilde\lambda\mu,\qquad
        \nabla_{\log\sigma} = \partial f/\partial\log\sigma + (\lambda\sigma^2 - 1)/N,

    each followed by one ``torch.optim.Adam`` step (:func:`adam_moments_` with ``sq_grads=None`` and
    :func:`adam_step_` with ``correct_inside_sqrt=False``: torch's rounding order). ``curvs`` = ∂f/∂log σ."""
    mu, rho = TensorList(means), TensorList(log_std)
    grad_mean = TensorList(grads) + _mul(mu, prior_prec / data_size)  # ∂/∂μ [f + KL/N]
    std = TensorList(torch._foreach_exp(rho.tensors))
    grad_log_std = _add_(std.square().mul_(prior_prec / data_size), -1.0 / data_size).add_(TensorList(curvs))
    for x, g, m, v in (
        (mu, grad_mean, exp_avg, exp_avg_sq),
        (rho, grad_log_std, log_std_exp_avg, log_std_exp_avg_sq),
    ):
        adam_moments_(m, v, g, beta1=beta1, beta2=beta2)
        adam_step_(x, m, v, lr=lr, bias1=bias1, bias2=bias2, eps=eps, correct_inside_sqrt=False)
