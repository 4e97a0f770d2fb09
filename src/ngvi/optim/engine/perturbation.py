"""Drawing a posterior sample into the parameters, and the hot path for diagonal posteriors.

:func:`draw` keeps μ where it is, in the parameters' own tensors, and rebinds each parameter to a new tensor
that holds θ (``p.data = θ``); restoring μ rebinds it back, so neither saving nor restoring μ copies anything.
For diagonal posteriors :func:`perturb_diagonal` forms θ in slices, bitwise the plain way: the precision is
computed once per slice of at most a quarter of the parameters (its square root is kept when the curvature
reads ε, as Price's ĝ⊙ε/σ does); ε is drawn straight into θ's tensor when nothing reads it later, so no noise
buffer is kept. Other rules' ``_perturb`` perturbs a copy of μ in place. For a bfloat16/float16 parameter with
a float32 state, θ is formed from the float32 master and rounded once into the parameter's dtype
(:mod:`.mixed_precision`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..._tensorlist import TensorList
from .. import functional as F
from . import flat, mixed_precision


@torch.no_grad()
def draw(opt: Any, train: bool) -> None:
    """Put θ ~ q into every trainable parameter of ``opt``, keeping μ's tensors in ``opt._means``. On any
    error the parameters, the saved means and the noise source are as before the call."""
    noise = opt.noise_source
    checkpoint = noise.checkpoint()
    done: list[Tensor] = []
    try:
        plan = []
        for group in opt.param_groups:
            params = opt.trainable(group)
            if params:
                states = [opt.state_of(group, p) for p in params]
                use_flat = flat.enabled(opt)
                plan.append(
                    (group, params, states, flat.buckets_of(opt, group, params, states) if use_flat else None)
                )
        # what each ε is drawn for, in order: a bucket's flat tensor or a parameter
        keys = [k for _, ps, _, bs in plan for k in (ps if bs is None else [b.param_flat for b in bs])]
        reuse = noise.begin_draw(keys)
        for group, params, states, buckets in plan:
            if buckets is not None:  # one pass per bucket (:mod:`.flat`)
                for b in buckets:
                    done.extend(b.params)
                    flat.perturb(opt, group, b, reuse)
                continue
            means = [p.detach() for p in params]  # μ stays in these tensors; the parameters are rebound
            for p, mean in zip(params, means, strict=True):
                opt._means[p] = mean
                done.append(p)
            if opt._diagonal_perturb:
                perturb_diagonal(opt, group, params, means, states, reuse)
                continue
            for p in params:  # a copy of μ (in the state's precision: the master of a bfloat16 parameter)
                p.data = mixed_precision.mean(opt, p).clone(memory_format=torch.preserve_format)
            keep = [i for i, p in enumerate(params) if not opt.unsampled(p, train)]
            eps = [noise.draw(params[i], reuse) for i in keep]
            for p in params:  # parameters sampled elsewhere keep μ and get ε = 0 (no draw)
                if opt.unsampled(p, train):
                    noise.zeros(p)
            if keep:
                sampled = TensorList(params[i].detach() for i in keep)
                opt._perturb(group, sampled, TensorList(eps), [states[i] for i in keep])
            for p, mean in zip(params, means, strict=True):  # θ in the parameter's own dtype
                if p.dtype != mean.dtype:
                    p.data = p.data.to(mean.dtype)
        noise.end_draw(reuse)
    except BaseException:
        in_place = {p for b in opt._in_place for p in b.params}
        for p in done:
            mean = opt._means.pop(p, None)
            if mean is not None and p not in in_place:
                p.data = mean
        for b in opt._in_place:
            flat.restore(b)
        opt._in_place.clear()
        opt._sqrt_prec.clear()
        opt._thetas.clear()
        noise.rollback(checkpoint)
        if noise.mode == "antithetic":  # some buffers may have been flipped: redraw the pair's ε
            noise.redraw_pair()
        raise


def perturb_diagonal(
    opt: Any,
    group: dict[str, Any],
    params: list[Tensor],
    means: list[Tensor],
    states: list[dict],
    reuse: bool,
) -> None:
    """θ = μ + ε/√precision for ``params`` (holding μ on entry, in the tensors ``means``), with one precision
    pass, each parameter then rebound to its θ. Without a kept noise buffer ε is drawn into θ's tensor and
    ``torch.addcmul(μ, ε, σ, out=θ)`` forms θ: the kernel and operand order of ``p.addcmul_(ε, σ)``, so the
    result is bitwise that of ``VariationalOptimizer._perturb``."""
    noise = opt.noise_source
    sources = [mixed_precision.mean(opt, p) for p in params]  # μ in the state's precision
    for part in slices(params, opt._elementwise and not opt.compile):
        sqrt_prec, sigma = sqrt_prec_and_sigma(opt, group, states[part])
        if opt.needs_noise:  # the curvature reads ĝ⊙ε·√precision: keep √precision for this sample
            opt._sqrt_prec.update(zip(params[part], sqrt_prec, strict=True))
        if noise.keep:
            eps = [noise.draw(p, reuse) for p in params[part]]
            eps = [
                e if e.dtype == m.dtype else e.to(m.dtype) for e, m in zip(eps, sources[part], strict=True)
            ]
            thetas = torch._foreach_addcmul(sources[part], eps, list(sigma))
            for p, mean, theta in zip(params[part], means[part], thetas, strict=True):
                p.data = theta if theta.dtype == mean.dtype else theta.to(mean.dtype)
            continue
        for p, mean, src, s in zip(params[part], means[part], sources[part], sigma, strict=True):
            theta = noise.into(torch.empty_like(src, memory_format=torch.preserve_format))
            theta = torch.addcmul(src, theta, s, out=theta)
            p.data = theta if theta.dtype == mean.dtype else theta.to(mean.dtype)


def sqrt_prec_and_sigma(
    opt: Any, group: dict[str, Any], states: list[dict]
) -> tuple[TensorList | None, TensorList]:
    """(√precision, σ = 1/√precision) of ``states``; √precision is kept (else None where compiled) only when
    the curvature reads it. Compiled: one loop precision → √ → 1/√ (:func:`~.functional.diagonal_sigma`)."""
    if opt.compile and hasattr(opt, "_precision_core"):
        core, lists, hyper = opt._precision_core(group, states)
        sqrt_prec, sig = F.run_core(
            F.diagonal_sigma, *lists, precision=core, keep_sqrt=opt.needs_noise, compile=True, **hyper
        )
        return sqrt_prec, TensorList(sig)
    sqrt_prec = opt._precision(group, states).sqrt_()
    return sqrt_prec, sqrt_prec.reciprocal() if opt.needs_noise else sqrt_prec.reciprocal_()


def slices(params: list[Tensor], elementwise: bool) -> list[slice]:
    """Consecutive runs of ``params`` of at most a quarter of their elements (or one parameter) each, for
    ``elementwise`` rules on the CPU: their temporaries then never hold a full copy of the parameters.
    Elsewhere one slice: compiled cores make no full-size temporaries (and each slice would be one more
    graph call), and on an accelerator, as in torch.optim's foreach paths, each pass is a few kernels over
    the whole group rather than four times as many (docs/results/bench/gpu/pre-flat/sliced)."""
    if not elementwise or len(params) < 2 or params[0].device.type != "cpu":
        return [slice(0, len(params))]
    total = sum(p.numel() for p in params)
    budget = -(-total // 4)
    out, start, size = [], 0, 0
    for i, p in enumerate(params):
        if size and size + p.numel() > budget:
            out.append(slice(start, i))
            start, size = i, 0
        size += p.numel()
    out.append(slice(start, len(params)))
    return out
