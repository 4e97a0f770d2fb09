"""Hyperparameter checks that raise ``ValueError`` naming the argument and the accepted range."""

from __future__ import annotations

import math
import numbers
import sys
import warnings
from typing import Any

import torch
from torch import nn

MODEL_GROUPS = (
    "takes its parameters from the model it hooks; add_param_group() is not supported (change "
    "hyperparameters through param_groups[0] instead)"
)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r} of type {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def nonnegative(name: str, value: Any) -> float:
    v = _number(name, value)
    if v < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return v


def positive(name: str, value: Any, allow_inf: bool = False) -> float:
    if allow_inf and value == math.inf:
        return math.inf
    v = _number(name, value)
    if v <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return v


def unit_interval(name: str, value: Any, *, closed_low: bool = True, closed_high: bool = False) -> float:
    """A rate in [0, 1) by default (an EMA decay of 1 would never move)."""
    v = _number(name, value)
    low_ok = v >= 0 if closed_low else v > 0
    high_ok = v <= 1 if closed_high else v < 1
    if not (low_ok and high_ok):
        lo, hi = "[" if closed_low else "(", "]" if closed_high else ")"
        raise ValueError(f"{name} must lie in {lo}0, 1{hi}, got {value!r}")
    return v


def betas(name: str, value: Any) -> tuple[float, float]:
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise ValueError(f"{name} must be a pair (beta1, beta2), got {value!r}")
    return unit_interval(f"{name}[0]", value[0]), unit_interval(f"{name}[1]", value[1])


def positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return value


def prior_group(group: dict[str, Any]) -> None:
    """The hyperparameters shared by the rules with a Gaussian prior N(0, I/λ) and an initial precision."""
    data_size(group["data_size"])
    nonnegative("lr", group["lr"])
    positive("prior_prec", group["prior_prec"])
    init_prec(group["init_prec"], group["prior_prec"])


def init_prec(value: Any, prior_prec: float) -> None:
    """init_prec sets σ at t=0 through s₀ = (init_prec − λ)/N, so it must not fall below the prior's;
    ``"auto"`` (s₀ = 1) and ``None`` (the prior, s₀ = 0) are the two named starts."""
    if value is None or value == "auto":
        return
    if isinstance(value, str):
        raise ValueError(f"init_prec must be a number, 'auto' or None, got {value!r}")
    v = positive("init_prec", value)
    if v < prior_prec:
        raise ValueError(
            f"init_prec ({value!r}) must be >= prior_prec ({prior_prec!r}): the initial posterior cannot be "
            "wider than the prior, since s0 = (init_prec - prior_prec) / data_size must be >= 0"
        )


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return value


#: seeds in [0, 2**63): what torch's generators take (below 2**64), what a checkpoint's counters accept
#: (>= 0) and what torch.distributed broadcasts (an int64)
SEED_LIMIT = 2**63


def seed(value: Any) -> int:
    """An int seed; None draws one from torch's global RNG (so torch.manual_seed makes runs reproducible)."""
    if value is None:
        return int(torch.randint(0, 2**62, ()).item())
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value < SEED_LIMIT:
        raise ValueError(f"seed must be an int in [0, 2**63) or None, got {value!r}")
    return int(value)


def model(value: Any, owner: str, why: str) -> Any:
    """The model a trainer takes (to hook or search its modules): TypeError for its parameters or anything
    else that is not an ``nn.Module``."""
    if not isinstance(value, nn.Module):
        raise TypeError(
            f"{owner} takes the model (an nn.Module) {why}, got {type(value).__name__}; write "
            f"{owner}(model, data_size, ...)"
        )
    return value


#: the dtypes ε can be drawn in (what ``Tensor.normal_`` fills; float8 types it does not)
NOISE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def noise_dtype(value: Any) -> Any:
    if value is not None and not (isinstance(value, torch.dtype) and value in NOISE_DTYPES):
        names = ", ".join(str(d) for d in NOISE_DTYPES)
        raise ValueError(f"noise_dtype must be one of {names} or None (the parameter's dtype), got {value!r}")
    return value


def data_size(value: Any) -> int:
    """N, the number of training examples: a positive whole number (64.5 examples is a mistake)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(
            f"data_size must be a positive int (the number of training examples), got {value!r}; "
            "for a tempered posterior scale the prior or use kl_weight instead"
        )
    return int(value)


def renamed(old: str, old_value: Any, new: str, new_value: Any, *, default: Any) -> Any:
    """The value of a keyword that was renamed: the old spelling still works, with a DeprecationWarning."""
    if old_value is None:
        return default if new_value is None else new_value
    if new_value is not None:
        raise ValueError(f"pass {new}= only ({old}= is its old name), not both")
    warnings.warn(f"{old}= is deprecated; use {new}={old_value!r}", DeprecationWarning, stacklevel=3)
    return old_value


def prior_var(prior_var: Any, prior_prec: Any) -> float:
    """η of NNG's prior N(0, ηI), given as ``prior_var`` (the paper's name) or as ``prior_prec`` = 1/η (the
    name every ngvi optimizer accepts); 1 if neither is given."""
    if prior_prec is None:
        return 1.0 if prior_var is None else prior_var
    if prior_var is not None:
        raise ValueError("pass prior_var= or prior_prec= (= 1/prior_var), not both")
    return 1.0 / positive("prior_prec", prior_prec)


def nonempty_params(owner: str, params: list[Any], group_index: int, names: dict[int, str] | None) -> None:
    """ValueError naming the first trainable parameter with no elements (``nn.Linear(4, 0)``): nothing to
    learn, and the per-layer statistics of the structured rules are undefined for it. ``names`` maps
    ``id(param)`` to its name in the model, where the optimizer knows the model."""
    for j, p in enumerate(params):
        if p.requires_grad and p.numel() == 0:
            name = (names or {}).get(id(p))
            where = f"'{name}'" if name else f"param_groups[{group_index}]['params'][{j}]"
            raise ValueError(
                f"{owner}: parameter {where} has shape {tuple(p.shape)} and no elements; remove its layer "
                "or freeze it (requires_grad_(False)) before creating the optimizer"
            )


def no_dtensor(owner: str, params: list[Any], group_index: int, names: dict[int, str] | None) -> None:
    """ValueError naming the first parameter that is a DTensor (FSDP2's ``fully_shard``,
    ``distribute_tensor``), for the rules that cannot train shards: their sample or curvature spans whole
    layers (the element-wise rules can: ``ngvi.optim.engine.sharded``). DDP keeps whole parameters."""
    dtensor = _dtensor_class()
    if dtensor is None:
        return
    for j, p in enumerate(params):
        if isinstance(p, dtensor):
            name = (names or {}).get(id(p))
            where = f"'{name}'" if name else f"param_groups[{group_index}]['params'][{j}]"
            raise ValueError(
                f"{owner}: parameter {where} is a DTensor (sharded by FSDP2's fully_shard, or made by "
                f"distribute_tensor): {owner} samples or estimates curvature across whole layers, which a "
                "shard does not hold; train it with torch.nn.parallel.DistributedDataParallel (DDP), which "
                "keeps whole parameters on every rank, or use an element-wise rule under FSDP2 (Vadam, "
                "Vprop, VadaGrad, IVON, noisy Adam, BAdam, VON with curvature='price') with noise='chunked'"
            )


_DTENSOR: list[type] = []  # the class once found (the engine asks per parameter per step)


def _dtensor_class() -> type | None:
    """torch's DTensor class if its module is loaded (no DTensor can exist otherwise): nothing is imported,
    so this costs nothing where torch.distributed is unused or unavailable."""
    if _DTENSOR:
        return _DTENSOR[0]
    for module in ("torch.distributed.tensor._api", "torch.distributed._tensor.api"):
        cls = getattr(sys.modules.get(module), "DTensor", None)
        if isinstance(cls, type):
            _DTENSOR.append(cls)
            return cls
    return None
