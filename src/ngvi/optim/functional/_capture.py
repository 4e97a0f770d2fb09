"""Running a core eagerly or compiled with captured (tensor) hyperparameters, and the scalar-generic
helpers the cores use where a ``torch._foreach_*`` overload only takes Python numbers."""

from __future__ import annotations

import contextlib
import contextvars
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Union

import torch
from torch import Tensor

from ..._tensorlist import TensorList

Tensors = Sequence[Tensor]
#: a hyperparameter: a Python number (eager) or a 0-dim tensor (captured)
Num = Union[float, Tensor]  # noqa: UP007
#: one value per tensor of the lists (bias corrections): numbers (eager) or 0-dim tensors (captured)
Nums = Union[Sequence[float], Sequence[Tensor]]  # noqa: UP007


# ------------------------------------------------------------------------------------------------------------
# Running a core: eager, or compiled with captured (tensor) hyperparameters
# ------------------------------------------------------------------------------------------------------------
_COMPILED: dict[tuple[Any, ...], Callable[..., Any]] = {}
_DEFER: contextvars.ContextVar[bool] = contextvars.ContextVar("ngvi_defer_region", default=False)


@contextlib.contextmanager
def deferring_region(defer: bool = True) -> Iterator[None]:
    """Inside, :func:`run_core` returns a trust-region core (:func:`~.blocks.region_core`) unstarted, in its
    generator form, for the engine to take one ν over all the pieces of a group (always eager: a compiled
    function cannot stop half-way). Outside, every core runs to the end."""
    token = _DEFER.set(defer)
    try:
        yield
    finally:
        _DEFER.reset(token)


def run_core(core: Callable[..., Any], *lists: Any, compile: bool = False, **hyper: Any) -> Any:
    """``core(*lists, **hyper)``; with ``compile=True`` through a cached ``torch.compile`` of the core.
    Inside :func:`deferring_region` a trust-region core's generator is returned instead, unstarted.

    ``lists`` are the tensor lists (``None`` allowed). In the compiled call every ``int``/``float`` in
    ``hyper`` becomes a 0-dim float64 tensor and every list of numbers a list of them, so changing values
    (lr under a scheduler, the step count) reuse the compiled code; ``None``, bools, strings and callables are
    static: they and the lists' structure select the compiled function."""
    deferred = getattr(core, "deferred", None)
    if deferred is not None and _DEFER.get():
        return deferred(*lists, **hyper)
    if not compile:
        return core(*lists, **hyper)
    plain = [None if x is None else list(x) for x in lists]
    first = next((t for x in plain if x for t in x), None)
    device = first.device if first is not None else torch.device("cpu")
    static, dynamic = {}, {}
    for k, v in hyper.items():
        if _is_number(v):
            dynamic[k] = _scalar(v, device)
        elif isinstance(v, list | tuple) and v and all(_is_number(x) for x in v):
            dynamic[k] = [_scalar(x, device) for x in v]
        else:
            static[k] = v
    key = (core, _structure(plain), tuple(sorted((k, _static_key(v)) for k, v in static.items())))
    fn = _COMPILED.get(key)
    if fn is None:
        fn = _COMPILED[key] = torch.compile(_fresh_copy(core), fullgraph=True, dynamic=False)
    return fn(*plain, **static, **dynamic)


def _scalar(v: float, device: torch.device) -> Tensor:
    """``v`` as a 0-dim float64 tensor on ``device``. On an accelerator it is copied asynchronously:
    ``torch.tensor(v, device="cuda")`` would wait for the device's queue to drain (a host sync per
    hyperparameter per step)."""
    t = torch.tensor(float(v), dtype=torch.float64)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


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
