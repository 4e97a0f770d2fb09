r"""Pure update cores: each rule's maths as a function on lists of tensors, as ``torch.optim.adam()`` is.

A core takes the parameter-shaped lists it reads and writes (plain lists or :class:`TensorList`), mutates the
state lists and μ **in place**, and takes every hyperparameter as a keyword. The rules' ``_update`` /
``_precision`` gather their state lists and call :func:`run_core`; the tests call the cores directly.

**Two ways to run a core.**

* *Eager* (``compile=False``, the default): hyperparameters are Python floats (per-tensor values such as bias
  corrections are lists of floats) and the core runs the same ``torch._foreach_*`` kernels, in the same order,
  as the rules did before the cores existed — bit for bit (``tests/test_golden.py``). Where two rules share a
  block but used different op sequences, the block takes the sequence as a parameter (see
  :func:`adam_moments_`, :func:`adam_step_`, :func:`riemannian_ema_`).
* *Captured* (``compile=True``): :func:`run_core` turns every number into a 0-dim float64 tensor on the
  parameters' device (lists of numbers into lists of such tensors) and calls a ``torch.compile``-d copy of
  the core. Dynamo then never specialises on lr, the betas or the step count, so an LR scheduler or the
  growing step count causes no recompile. Only the structure (how many tensors, their shapes, strides,
  dtypes, devices) and the non-numeric options (``None`` / bool flags) select a compiled function; each
  structure gets its own copy of the core's code object, so dynamo's per-code cache limit (8) is never
  shared between structures. Compiled functions live in a module-level cache, never on an optimizer (so
  optimizers still pickle and deepcopy). Inductor fuses each core into a few loops; results agree with eager
  to float round-off (reassociation), not bitwise.

Cores written with :class:`TensorList` run unchanged on tensor scalars, except where a ``torch._foreach_*``
overload only takes Python numbers (``alpha=``, the ``value`` of addcdiv/addcmul, clamp bounds): the private
helpers below then use an equivalent formulation on captured scalars and the original kernel on floats.

Equation numbers: Khan et al. 2018 ("Fast and scalable Bayesian deep learning by weight-perturbation in Adam",
Fig. 1, eqs. 7–14, App. D–F); Zhang et al. 2018 ("Noisy natural gradient as variational inference", Alg. 1–2,
eqs. 12–13); Shen et al. 2024 ("Variational learning is effective for large deep networks", IVON Alg. 1);
BADAM ("Adam as a Laplace approximation", Alg. 1, eq. 12); Blundell et al. 2015 (Bayes by Backprop).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Any, Union

import torch
from torch import Tensor

from .._tensorlist import TensorList

__all__ = [
    "adam_moments_",
    "adam_step_",
    "badam_update_",
    "bbvi_update_",
    "diagonal_sigma",
    "exp_precision",
    "identity_precision",
    "ivon_update_",
    "kfac_factor_ema",
    "kfac_natural_step",
    "laplace_precision",
    "noisy_adam_update_",
    "riemannian_ema_",
    "run_core",
    "scaled_precision",
    "shifted_precision",
    "vadagrad_update_",
    "vadam_update_",
    "vogn_update_",
    "von_update_",
    "vprop_update_",
]

Tensors = Sequence[Tensor]
#: a hyperparameter: a Python number (eager) or a 0-dim tensor (captured)
Num = Union[float, Tensor]  # noqa: UP007
#: one value per tensor of the lists (bias corrections): numbers (eager) or 0-dim tensors (captured)
Nums = Union[Sequence[float], Sequence[Tensor]]  # noqa: UP007


# ------------------------------------------------------------------------------------------------------------
# Running a core: eager, or compiled with captured (tensor) hyperparameters
# ------------------------------------------------------------------------------------------------------------
_COMPILED: dict[tuple[Any, ...], Callable[..., Any]] = {}


def run_core(core: Callable[..., Any], *lists: Any, compile: bool = False, **hyper: Any) -> Any:
    """``core(*lists, **hyper)``; with ``compile=True`` through a cached ``torch.compile`` of the core.

    ``lists`` are the tensor lists (``None`` allowed). In the compiled call every ``int``/``float`` in
    ``hyper`` becomes a 0-dim float64 tensor and every list of numbers a list of them, so changing values
    (lr under a scheduler, the step count) reuse the compiled code; ``None``, bools, strings and callables are
    static: they and the lists' structure select the compiled function."""
    if not compile:
        return core(*lists, **hyper)
    plain = [None if x is None else list(x) for x in lists]
    first = next((t for x in plain if x for t in x), None)
    device = first.device if first is not None else torch.device("cpu")
    static, dynamic = {}, {}
    for k, v in hyper.items():
        if _is_number(v):
            dynamic[k] = torch.tensor(float(v), dtype=torch.float64, device=device)
        elif isinstance(v, list | tuple) and v and all(_is_number(x) for x in v):
            dynamic[k] = [torch.tensor(float(x), dtype=torch.float64, device=device) for x in v]
        else:
            static[k] = v
    key = (core, _structure(plain), tuple(sorted((k, _static_key(v)) for k, v in static.items())))
    fn = _COMPILED.get(key)
    if fn is None:
        fn = _COMPILED[key] = torch.compile(_fresh_copy(core), fullgraph=True, dynamic=False)
    return fn(*plain, **static, **dynamic)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _static_key(v: Any) -> Any:
    if isinstance(v, list | tuple):
        return tuple(_static_key(x) for x in v)
    return v


def _structure(lists: list[list[Tensor] | None]) -> tuple[Any, ...]:
    return tuple(
        None if x is None else tuple((tuple(t.shape), t.stride(), t.dtype, t.device) for t in x)
        for x in lists
    )


def _fresh_copy(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The same function with its own code object: dynamo keeps its cache (and cache limit) per code object,
    so each structure's compiled graph lives apart from the others'."""
    copy = types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    return copy


# Out-of-place TensorList arithmetic with a hyperparameter operand. Spelled as method calls because dynamo
# does not dispatch ``tensor_list * tensor`` to TensorList.__mul__ (it tries the tensor's operator and fails);
# eager, these are exactly the operators.
def _mul(x: TensorList, c: Num | Nums) -> TensorList:
    return x.__mul__(c)


def _add(x: TensorList, c: Num | Nums) -> TensorList:
    return x.__add__(_each(x, c))


def _add_(x: TensorList, c: Num | Nums) -> TensorList:
    return x.add_(_each(x, c))


def _each(x: TensorList, c: Num | Nums) -> Num | Nums:
    """A captured scalar as one entry per tensor. Inductor (torch 2.13, CPU) compiles the value of the 0-dim
    tensor given to ``_foreach_add(list, Tensor)`` into the kernel as a constant, so a later call with another
    value silently reuses the old one (also via the on-disk FX graph cache); the List overload reads it."""
    return [c] * len(x) if isinstance(c, Tensor) else c


def _div(x: TensorList, c: Num | Nums) -> TensorList:
    return x.__truediv__(c)


def _captured(x: Any) -> bool:
    """A captured hyperparameter: a tensor, or a list of them."""
    return isinstance(x, Tensor) or (isinstance(x, list | tuple) and len(x) > 0 and isinstance(x[0], Tensor))


def _addcdiv_(x: TensorList, t1: TensorList, t2: TensorList, value: Num | Nums) -> None:
    """x ← x + value·t1/t2 (foreach addcdiv takes numbers only; captured: divide, scale, add)."""
    if _captured(value):
        x.add_((t1 / t2).mul_(value))
    else:
        x.addcdiv_(t1, t2, value)


def _addcmul_(x: TensorList, t1: TensorList, t2: TensorList, value: Num) -> None:
    """x ← x + value·t1⊙t2."""
    if _captured(value):
        x.add_((t1 * t2).mul_(value))
    else:
        x.addcmul_(t1, t2, value)


def _add_scaled_(x: TensorList, y: TensorList, alpha: Num) -> None:
    """x ← x + alpha·y."""
    if _captured(alpha):
        x.add_(_mul(y, alpha))
    else:
        x.add_(y, alpha=alpha)


def _add_into(out: Tensor, a: Tensor, b: Tensor | Num, alpha: Num | None = None) -> None:
    """out ← a + b, or a + alpha·b, written into an existing buffer (eager: ``torch.add(..., out=out)``)."""
    if _captured(alpha) or (alpha is None and _captured(b)):
        out.copy_(a + (b if alpha is None else b * alpha))
    elif alpha is None:
        torch.add(a, b, out=out)
    else:
        torch.add(a, b, alpha=alpha, out=out)


def _clamp_(x: TensorList, radius: Num) -> None:
    """x ← clip(x, −radius, radius) element-wise."""
    if _captured(radius):
        for t in x:
            t.clamp_(min=-radius, max=radius)
    else:
        x.clamp_(-radius, radius)


# ------------------------------------------------------------------------------------------------------------
# Shared blocks
# ------------------------------------------------------------------------------------------------------------
def adam_moments_(
    exp_avg: Tensors,
    exp_avg_sq: Tensors,
    grads: Tensors,
    sq_grads: Tensors | None = None,
    *,
    beta1: Num,
    beta2: Num,
) -> None:
    r"""Adam's two moments in place: :math:`m \leftarrow \beta_1 m + (1-\beta_1)g`,
    :math:`v \leftarrow \beta_2 v + (1-\beta_2)\,g^2`.

    ``sq_grads`` is what v averages: ĝ² of the MC samples (Vadam eq. 90, NNG Alg. 1's f) or g² of the
    gradient itself (BADAM). With ``sq_grads=None`` v is updated as ``torch.optim.Adam`` does,
    v·β₂ + (1−β₂)·g⊙g (mul, then addcmul: BBVI's sequence), which rounds differently from the lerp form."""
    m, v, g = TensorList(exp_avg), TensorList(exp_avg_sq), TensorList(grads)
    m.lerp_(g, 1 - beta1)
    if sq_grads is not None:
        v.lerp_(TensorList(sq_grads), 1 - beta2)
    else:
        v.mul_(beta2)
        _addcmul_(v, g, g, 1 - beta2)


def adam_step_(
    params: Tensors,
    exp_avg: Tensors,
    exp_avg_sq: Tensors,
    *,
    lr: Num,
    bias1: Nums,
    bias2: Nums,
    eps: Num,
    correct_inside_sqrt: bool = True,
) -> None:
    r"""The bias-corrected Adam step in place:
    :math:`x \leftarrow x - \alpha\,\hat m/(\sqrt{\hat v} + \epsilon)`
    with :math:`\hat m = m/(1-\beta_1^t)`, :math:`\hat v = v/(1-\beta_2^t)`.

    ``bias1``, ``bias2`` are 1−β₁ᵗ and 1−β₂ᵗ, one per tensor (steps may differ between parameters). ``eps`` is
    Adam's ε, or λ̃ for Vadam (eq. 93: √ŝ + λ̃). ``correct_inside_sqrt`` picks the rounding order:
    √(v/b₂) (Vadam, BADAM) or √v/√b₂ (``torch.optim.Adam``'s order, used by BBVI)."""
    x, m, v = TensorList(params), TensorList(exp_avg), TensorList(exp_avg_sq)
    if correct_inside_sqrt:
        denom = _add_(_div(v, bias2).sqrt_(), eps)
    else:
        denom = _add_(v.sqrt().div_([b**0.5 for b in bias2]), eps)
    _addcdiv_(x, m, denom, [-lr / b for b in bias1])


def riemannian_ema_(
    hess: Tensors,
    hess_hat: Tensors,
    *,
    beta: Num,
    damping: Num,
    coef: Num | None = None,
) -> None:
    r"""The curvature EMA with the Riemannian-gradient correction (Lin, Schmidt & Khan 2020; IVON Alg. 1):

    .. math::
        h \leftarrow (1-\beta)\,h + \beta\,\hat h + \tfrac12\beta^2\,(\hat h - h)^2/(h + \delta)

    with δ = ``damping`` (λ̃ for VON, the weight decay for IVON). The correction keeps h + δ > 0 for any ĥ.
    ``coef`` is the factor ½β² as the caller computes it: VON passes nothing (0.5·β·β), IVON its own
    0.5·(1−β₂)² (the same number, rounded its own way: kept so IVON's trajectory stays bitwise).
    (ĥ − h)² is bitwise (h − ĥ)², so the operand order of the difference does not matter."""
    h, h_hat = TensorList(hess), TensorList(hess_hat)
    if coef is None:
        coef = 0.5 * beta * beta
    riemann = (h_hat - h).square_().div_(_add(h, damping)).mul_(coef)
    h.lerp_(h_hat, beta).add_(riemann)


# ------------------------------------------------------------------------------------------------------------
# Update cores, one per rule
# ------------------------------------------------------------------------------------------------------------
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
) -> None:
    r"""Vprop (Khan et al. 2018, eq. 14), in place on μ and s; ``beta`` is the EMA decay (the paper's step is
    1 − beta):

    .. math::
        s \leftarrow \text{beta}\cdot s + (1-\text{beta})\,\hat g^2,\qquad
        \mu \leftarrow \mu - \alpha\,(\hat g + \tilde\lambda\mu)/(\sqrt s + \tilde\lambda)"""
    mu, s = TensorList(means), TensorList(exp_avg_sq)
    s.lerp_(TensorList(curvs), 1 - beta)
    step = _mul(mu, prior_tilde).add_(TensorList(grads))  # ĝ + λ̃μ
    _addcdiv_(mu, step, _add_(s.sqrt(), prior_tilde), -lr)


def von_update_(
    means: Tensors, grads: Tensors, curvs: Tensors, hess: Tensors, *, lr: Num, beta: Num, prior_tilde: Num
) -> None:
    r"""VON (Khan et al. 2018, eqs. 7–8) with the Riemannian correction, in place on μ and s:

    .. math::
        s &\leftarrow (1-\beta)s + \beta\hat h + \tfrac12\beta^2(\hat h - s)^2/(s + \tilde\lambda)  && (8)\\
        \mu &\leftarrow \mu - \alpha\,(\hat g + \tilde\lambda\mu)/(s + \tilde\lambda)                && (7)

    with the new s in eq. 7 (the natural-gradient step uses the updated precision)."""
    mu, s = TensorList(means), TensorList(hess)
    riemannian_ema_(s, curvs, beta=beta, damping=prior_tilde)
    step = _mul(mu, prior_tilde).add_(TensorList(grads))  # ĝ + λ̃μ
    _addcdiv_(mu, step, _add(s, prior_tilde), -lr)


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
) -> None:
    r"""IVON (Shen et al. 2024, Alg. 1, as in DESIGN.md), in place on m, ḡ, h:

    .. math::
        \bar g &\leftarrow \beta_1\bar g + (1-\beta_1)\hat g \\
        h &\leftarrow \beta_2 h + (1-\beta_2)\hat h + \tfrac12(1-\beta_2)^2(h-\hat h)^2/(h+\delta) \\
        m &\leftarrow m - \alpha\,\mathrm{clip}\big((\bar g/(1-\beta_1^t) + \delta m)/(h+\delta)\big)

    ``bias1`` = 1−β₁ᵗ per tensor, δ = ``weight_decay``; ``clip_radius=None`` means no clipping."""
    m, g_bar, h = TensorList(means), TensorList(momentum), TensorList(hess)
    g_bar.lerp_(TensorList(grads), 1 - beta1)
    riemannian_ema_(h, curvs, beta=1 - beta2, damping=weight_decay, coef=0.5 * (1 - beta2) ** 2)
    step = _div(g_bar, bias1).add_(_mul(m, weight_decay)).div_(_add(h, weight_decay))
    if clip_radius is not None:
        _clamp_(step, clip_radius)
    _add_scaled_(m, step, -lr)


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
) -> None:
    r"""Noisy Adam (Zhang et al. 2018, Alg. 1, minimisation form), in place on μ, m, f:

    .. math::
        v = \hat g + \gamma_{in}\mu,\quad m \leftarrow \beta_1 m + (1-\beta_1)v,\quad
        f \leftarrow \beta_2 f + (1-\beta_2)\hat g^2,\quad
        \mu \leftarrow \mu - \alpha\,\frac{m/(1-\beta_1^k)}{f + \gamma_{in} + \gamma_{ex}}

    ``curvs`` = ĝ², ``damping`` = γ_ex, ``bias1`` = 1−β₁ᵏ per tensor."""
    mu = TensorList(means)
    v = _mul(mu, gamma_in).add_(TensorList(grads))  # ĝ + γ_in μ
    adam_moments_(exp_avg, fisher, v, curvs, beta1=beta1, beta2=beta2)
    _addcdiv_(mu, TensorList(exp_avg), _add(TensorList(fisher), gamma_in + damping), [-lr / b for b in bias1])


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


def vadagrad_update_(
    means: Tensors, grads: Tensors, curvs: Tensors, sum_sq: Tensors, *, lr: Num, beta: Num
) -> None:
    r"""VadaGrad (Khan et al. 2018, App. F, eq. 96), in place on μ and s:
    :math:`s \leftarrow s + \beta\hat g^2`, :math:`\mu \leftarrow \mu - \alpha\,\hat g/\sqrt s`."""
    s = TensorList(sum_sq)
    _add_scaled_(s, TensorList(curvs), beta)
    _addcdiv_(TensorList(means), TensorList(grads), s.sqrt(), -lr)


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
) -> None:
    r"""VOGN (Khan et al. 2018, eqs. 7 and 10) with natural momentum (App. E, eq. 82), in place on μ and s:

    .. math::
        s_{t+1} &= (1-\beta)s_t + \beta\hat h                                                    && (10)\\
        \mu_{t+1} &= \mu_t - \alpha\frac{\hat g + \tilde\lambda\mu_t}{s_{t+1} + \tilde\lambda}
                   + \gamma\frac{s_t + \tilde\lambda}{s_{t+1} + \tilde\lambda}(\mu_t - \mu_{t-1})  && (7, 82)

    ``momentum_buffer`` holds μ_t − μ_{t−1} (``None``: no momentum). ``scratch`` is one parameter-shaped
    buffer per tensor, reused every step (fresh temporaries cost page faults on CPU); ``curvs`` is consumed:
    it holds s_{t+1} + λ̃ afterwards."""
    mu, s, h_hat, step = TensorList(means), TensorList(hess), TensorList(curvs), TensorList(scratch)
    if momentum_buffer is not None:
        buffers = TensorList(momentum_buffer)
        for out, s_t in zip(step, s, strict=True):
            _add_into(out, s_t, prior_tilde)  # s_t + λ̃
        buffers.mul_(step).mul_(momentum)
    for out, g, m in zip(step, grads, mu, strict=True):
        _add_into(out, g, m, alpha=prior_tilde)  # ĝ + λ̃μ
    s.lerp_(h_hat, beta)  # (10)
    for out, s_t in zip(h_hat, s, strict=True):
        _add_into(out, s_t, prior_tilde)  # s_{t+1} + λ̃
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


# ------------------------------------------------------------------------------------------------------------
# Noisy K-FAC (per layer; matrix products, not element-wise: eager only)
# ------------------------------------------------------------------------------------------------------------
def kfac_factor_ema(
    a: Tensor, s: Tensor, a_hat: Tensor, s_hat: Tensor, weight: float
) -> tuple[Tensor, Tensor]:
    r"""NNG eq. 12, out of place: :math:`A \leftarrow (1-w)A + w\hat A`,
    :math:`S \leftarrow (1-w)S + w\hat S`."""
    return a.lerp(a_hat, weight), s.lerp(s_hat, weight)


def kfac_natural_step(
    grad: Tensor,
    mean: Tensor,
    a_inv: Tensor,
    s_inv: Tensor,
    *,
    gamma_in: float,
    momentum: float = 0.0,
    buffer: Tensor | None = None,
) -> Tensor:
    r"""NNG Alg. 2's preconditioned step for one layer block [G, rows, cols], out of place (``grad`` is
    consumed): :math:`V = \hat g + \gamma_{in}M`, step :math:`= [S^\gamma]^{-1} V [A^\gamma]^{-1}`, and with
    momentum the heavy-ball buffer m·buf + step (the new buffer is the returned step)."""
    v = grad.add_(mean, alpha=gamma_in)  # V = ĝ + γ_in M
    step = s_inv @ v @ a_inv
    if momentum and buffer is not None:
        step = buffer.mul(momentum).add_(step)
    return step


# ------------------------------------------------------------------------------------------------------------
# Precision cores: q = N(μ, 1/precision); they return new tensors
# ------------------------------------------------------------------------------------------------------------
def scaled_precision(state: Tensors, *, scale: Num, shift: Num) -> list[Tensor]:
    """scale·s + shift, e.g. Vadam and Vprop: N·s + λ (the multiplication first: their rounding)."""
    return _add_(_mul(TensorList(state), scale), shift).tensors


def shifted_precision(state: Tensors, *, shift: Num, scale: Num) -> list[Tensor]:
    """(s + shift)·scale, e.g. VON: N(s + λ̃), IVON: N(h + δ), noisy Adam: (N/λ)(f + γ_in)."""
    return _add(TensorList(state), shift).mul_(scale).tensors


def identity_precision(state: Tensors) -> list[Tensor]:
    """A copy of s (VadaGrad: 1/σ² = s)."""
    return [t.clone() for t in state]


def exp_precision(log_std: Tensors) -> list[Tensor]:
    """1/σ² = 1/exp(ρ)² (BBVI's log-σ parametrisation)."""
    return TensorList(torch._foreach_exp(list(log_std))).square().reciprocal_().tensors


def laplace_precision(
    exp_avg_sq: Tensors, *, bias2: Sequence[float | None], eps: float, data_size: float, prior_prec: float
) -> list[Tensor]:
    r"""BADAM eq. 12 plus the prior: N(√v̂ + ε) + λ with v̂ = v/(1−β₂ᵗ) (``bias2`` entry ``None``
    at t = 0, where v = 0 and v̂ = v). Eager only (a per-tensor branch on the step)."""
    v_hat = TensorList(v / b if b is not None else v.clone() for v, b in zip(exp_avg_sq, bias2, strict=True))
    return v_hat.sqrt_().add_(eps).mul_(data_size).add_(prior_prec).tensors


def diagonal_sigma(
    *lists: Tensors, precision: Callable[..., list[Tensor]], keep_sqrt: bool = False, **hyper: Any
) -> tuple[list[Tensor] | None, list[Tensor]]:
    r"""σ = 1/√precision of a diagonal posterior, from a precision core and its arguments, as the engine's
    weight draw computes it (``precision(...)`` → ``sqrt_`` → ``reciprocal``), so the eager call is bitwise
    the engine's. Returns (√precision if ``keep_sqrt`` else None, σ). Through :func:`run_core` with
    ``compile=True`` the whole chain is one fused loop::

        run_core(diagonal_sigma, s, precision=scaled_precision, scale=N, shift=prior, compile=True)
    """
    sqrt_prec = TensorList(precision(*lists, **hyper)).sqrt_()
    if keep_sqrt:
        return sqrt_prec.tensors, sqrt_prec.reciprocal().tensors
    return None, sqrt_prec.reciprocal_().tensors
