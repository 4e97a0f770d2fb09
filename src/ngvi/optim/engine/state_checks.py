"""Checks that a state dict fits an optimizer before anything of it is loaded.

``torch.optim.Optimizer.load_state_dict`` only compares the number of groups and parameters. State from
another optimizer class, a model of other shapes, or a corrupted file would load silently and fail at the
next step, by when the optimizer's own state is gone. :func:`validate` refuses such state with a
``ValueError`` naming what differs, and changes nothing. Everything it reads is made of plain types and
tensors, so ``torch.load(weights_only=True)`` keeps working.
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Any

import torch
from torch import Tensor

from ..._validation import NOISE_DTYPES
from . import chunked, flat, mixed_precision, sharded
from .noise import NOISES, dtype_name

#: state entries a rule creates only when an option needs them (heavy-ball buffers)
OPTIONAL_STATE = frozenset({"momentum_buffer", "prior_mean", "prior_prec"})
_COUNTERS = ("seed", "num_steps", "skipped_steps", "num_draws")
_DTYPE_NAMES = (None, *(dtype_name(d) for d in NOISE_DTYPES))


def engine_state(opt: Any) -> dict[str, Any]:
    """The engine's entry of a state dict: the noise source, the counters, and what the state was saved
    by (the class and each group's parameter shapes, checked at load)."""
    return {
        **opt.noise_source.state_dict(),
        **noise_stream(opt),
        "skipped_steps": opt.skipped_steps,
        "num_steps": opt.num_steps,
        "class": type(opt).__name__,
        "shapes": [[list(p.shape) for p in group["params"]] for group in opt.param_groups],
        # which parameters have state (torch's indices): one never given a gradient has none, legitimately
        "stateful": [i for i, p in enumerate(_params(opt)) if opt.state.get(p)],
    }


#: the draws of each path: one per flat bucket, or one per parameter (another stream from the same seed)
NOISE_PATHS = ("flat", "per_tensor")


def noise_stream(opt: Any) -> dict[str, Any]:
    """What the noise stream depends on beyond ``noise`` and ``noise_dtype`` (saved, checked at load): the
    path's draws (:data:`NOISE_PATHS`) and, for ``noise="chunked"``, its chunk size."""
    out: dict[str, Any] = {"noise_path": "flat" if flat.enabled(opt) else "per_tensor"}
    if opt.noise_source.mode == "chunked":
        out["noise_chunk"] = chunked.CHUNK
    return out


def _params(opt: Any) -> list[Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


def load(opt: Any, state_dict: dict[str, Any], load_torch_state: Any) -> None:
    """``opt.load_state_dict``: validate, then load torch's part (``load_torch_state``) and the engine's."""
    if opt._in_sample or opt.accumulator.count:
        raise RuntimeError(
            "load_state_dict() was called with a posterior sample pending; call it between steps"
        )
    state_dict = dict(state_dict)
    if isinstance(state_dict.get("state"), dict):
        state_dict["state"] = _merged_indices(state_dict["state"])
    extra = state_dict.pop("ngvi", None)
    validate(opt, state_dict, extra)
    load_torch_state(state_dict)
    mixed_precision.restore_float32_state(opt, state_dict)
    for state in opt.state.values():  # FSDP2's shards keep their part as plain tensors
        sharded.localise(state)
    if extra is not None:
        opt.skipped_steps = int(extra["skipped_steps"])
        opt.num_steps = int(extra["num_steps"])
        opt.noise_source.load_state_dict(extra)


def _merged_indices(state: dict[Any, Any]) -> dict[Any, Any]:
    """``torch.distributed.checkpoint.load`` loads tensors in place but puts the values it loaded as objects
    (the step counts) under the index spelled as a string: one entry per parameter again, the loaded values
    winning."""
    out: dict[Any, Any] = {}
    for key, entry in sorted(state.items(), key=lambda kv: isinstance(kv[0], str)):  # the strings last
        index = int(key) if isinstance(key, str) and key.isdigit() else key
        if index in out and isinstance(out[index], dict) and isinstance(entry, dict):
            out[index] = {**out[index], **entry}
        else:
            out[index] = entry
    return out


def validate(opt: Any, state_dict: dict[str, Any], extra: Any) -> None:
    """Raise ValueError if ``state_dict`` (with its ``"ngvi"`` entry ``extra``) cannot be used by ``opt``."""
    name = type(opt).__name__
    if not isinstance(extra, dict):
        raise ValueError(
            f"{name}.load_state_dict: the state has no 'ngvi' entry, so it was not saved by an ngvi "
            "optimizer (torch.optim's?); load a state saved by the same ngvi optimizer class"
        )
    saved_class = extra.get("class", name)
    if saved_class != name:
        raise ValueError(f"{name}.load_state_dict: the state was saved by {saved_class}, not {name}")
    _check_counters(name, extra)
    _check_noise(opt, name, extra)
    groups, state = state_dict.get("param_groups"), state_dict.get("state")
    if not isinstance(groups, list) or not isinstance(state, dict):
        raise ValueError(
            f"{name}.load_state_dict: the state lacks 'param_groups' (a list) or 'state' (a dict)"
        )
    if len(groups) != len(opt.param_groups):
        raise ValueError(
            f"{name}.load_state_dict: the state has {len(groups)} parameter group(s), this optimizer "
            f"{len(opt.param_groups)}"
        )
    for gi, (saved, group) in enumerate(zip(groups, opt.param_groups, strict=True)):
        _check_group(opt, gi, saved, group)
    shapes = extra.get("shapes")
    if shapes is not None and (
        not isinstance(shapes, list)
        or [len(s) if isinstance(s, list) else -1 for s in shapes]
        != [len(g["params"]) for g in opt.param_groups]
        or not all(isinstance(x, list | tuple) for s in shapes for x in s)
    ):
        raise ValueError(f"{name}.load_state_dict: 'ngvi'/'shapes' does not list one shape per parameter")
    index: dict[Any, tuple[str, Tensor, dict[str, Any]]] = {}
    for gi, (saved, group) in enumerate(zip(groups, opt.param_groups, strict=True)):
        for j, (key, p) in enumerate(zip(saved["params"], group["params"], strict=True)):
            where = f"param_groups[{gi}]['params'][{j}]"
            if shapes is not None and list(shapes[gi][j]) != list(p.shape):
                raise ValueError(
                    f"{name}.load_state_dict: {where} has shape {tuple(p.shape)} here but "
                    f"{tuple(shapes[gi][j])} in the state (a model of another size?)"
                )
            index[key] = (where, p, group)
    stateful = extra.get("stateful")
    if stateful is not None:
        if not isinstance(stateful, list) or not all(isinstance(k, int) for k in stateful):
            raise ValueError(f"{name}.load_state_dict: 'ngvi'/'stateful' must list parameter indices")
        missing = [index[k][0] for k in stateful if k in index and k not in state]
        if missing:
            listed = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            raise ValueError(  # dcp.load fills only the entries of the dict it is given: a fresh one has none
                f"{name}.load_state_dict: the state of {listed} is missing; resuming through "
                "torch.distributed.checkpoint? call opt.init_state() before opt.state_dict() makes the dict "
                "that dcp.load fills (otherwise the file is truncated)"
            )
    devices = {str(p.device) for _, p, _ in index.values() if p.requires_grad}
    if extra.get("num_draws", 0) and not devices <= set(extra["rng"]):  # it has drawn on every device
        raise ValueError(f"{name}.load_state_dict: 'ngvi'/'rng' lacks the generator of device(s) {devices}")
    for key, entry in state.items():
        if key not in index:
            raise ValueError(f"{name}.load_state_dict: the state has an entry for unknown parameter {key!r}")
        _check_param_state(opt, name, *index[key], entry)


def _check_counters(name: str, extra: dict[str, Any]) -> None:
    for key in _COUNTERS:
        if key not in extra and key != "num_draws":  # num_draws came later: older states lack it
            raise ValueError(f"{name}.load_state_dict: the state's 'ngvi' entry lacks {key!r}")
        value = extra.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}.load_state_dict: 'ngvi'/{key!r} must be an int >= 0, got {value!r}")
    rng = extra.get("rng")
    if not isinstance(rng, dict):
        raise ValueError(f"{name}.load_state_dict: 'ngvi'/'rng' must map devices to generator states")
    for dev, value in chain(rng.items(), (extra.get("pair_start") or {}).items()):
        try:
            torch.Generator(device=torch.device(dev)).set_state(value)
        except (RuntimeError, TypeError, ValueError) as err:
            raise ValueError(
                f"{name}.load_state_dict: bad generator state for device {dev!r}: {err}"
            ) from None


def _check_noise(opt: Any, name: str, extra: dict[str, Any]) -> None:
    """The state's ``noise=`` and ``noise_dtype=`` must be this optimizer's: another kind of noise resumes
    another run (an antithetic pair saved half-way would not be completed). States saved before they were
    recorded lack them and are accepted."""
    source, stream = opt.noise_source, noise_stream(opt)
    checks = (
        ("noise", source.mode, NOISES),
        ("noise_dtype", dtype_name(source.dtype), _DTYPE_NAMES),
        ("noise_path", stream["noise_path"], NOISE_PATHS),
        ("noise_chunk", stream.get("noise_chunk"), None),  # any size: a mismatch says which
    )
    for key, here, accepted in checks:
        if key not in extra:
            continue
        saved = extra[key]
        integer = isinstance(saved, int) and not isinstance(saved, bool)
        if accepted is None and not (saved is None or integer):
            raise ValueError(f"{name}.load_state_dict: 'ngvi'/{key!r} must be an integer or None: {saved!r}")
        if accepted is not None and (not (saved is None or isinstance(saved, str)) or saved not in accepted):
            raise ValueError(
                f"{name}.load_state_dict: 'ngvi'/{key!r} must be one of {accepted}, got {saved!r}"
            )
        if saved != here:
            shown, now = (_shown(key, v) for v in (saved, here))
            raise ValueError(
                f"{name}.load_state_dict: the state was saved with {key}={shown}, this optimizer has "
                f"{key}={now}: the resumed run would draw other noise; {_fix(key, shown)}"
            )


def _fix(key: str, shown: str) -> str:
    if key == "noise_path":
        flag = "flat=None (the default)" if shown == "'flat'" else "flat=False"
        return f"build it with {flag}, the path it was trained on"
    if key == "noise_chunk":
        return f"it was saved by an ngvi whose chunked noise used chunks of {shown} elements"
    return f"build it with {key}={shown}"


def _shown(key: str, value: str | None) -> str:
    return f"torch.{value}" if key == "noise_dtype" and value is not None else repr(value)


def _check_group(opt: Any, gi: int, saved: Any, group: dict[str, Any]) -> None:
    name = type(opt).__name__
    if not isinstance(saved, dict) or not isinstance(saved.get("params"), list):
        raise ValueError(f"{name}.load_state_dict: param_groups[{gi}] must be a dict with a 'params' list")
    if not all(isinstance(k, int) and not isinstance(k, bool) for k in saved["params"]):
        raise ValueError(f"{name}.load_state_dict: param_groups[{gi}]['params'] must list parameter indices")
    if len(saved["params"]) != len(group["params"]):
        raise ValueError(
            f"{name}.load_state_dict: param_groups[{gi}] has {len(saved['params'])} parameters in the state, "
            f"{len(group['params'])} here"
        )
    missing = sorted(k for k in group if k != "params" and k not in saved)
    if missing:
        raise ValueError(
            f"{name}.load_state_dict: param_groups[{gi}] lacks {missing}: it was saved by another optimizer "
            f"class than {name}"
        )
    merged = {**group, **saved, "params": group["params"]}
    try:
        opt._check_group(merged)
    except ValueError as err:
        raise ValueError(f"{name}.load_state_dict: param_groups[{gi}]: {err}") from None


def _check_param_state(opt: Any, name: str, where: str, p: Tensor, group: dict[str, Any], entry: Any) -> None:
    if not isinstance(entry, dict):
        raise ValueError(
            f"{name}.load_state_dict: the state of {where} must be a dict, got {type(entry).__name__}"
        )
    if not entry:  # state_dict() never writes one: an entry is made with its step count
        raise ValueError(
            f"{name}.load_state_dict: the state of {where} is empty; leave the parameter out of 'state' "
            "(its state then starts fresh at its first gradient) or give its saved state"
        )
    expected: dict[str, Any] = {}
    mixed_precision.init_state(opt, group, p, expected)  # the rule's state (and a float32 master)
    optional_shapes = {"prior_mean": p.shape, "prior_prec": p.shape}  # a posterior prior (set_prior)
    optional_shapes |= getattr(opt, "_optional_state_shapes", lambda p: {"momentum_buffer": p.shape})(p)
    required = set(expected) | {"step"}
    rule_state = bool(set(expected) - {"master"})  # a K-FAC layer keeps its state with its first parameter
    stepped = isinstance(entry.get("step"), int) and entry["step"] > 0
    if rule_state and group.get("momentum", 0) and stepped:
        required.add("momentum_buffer")  # heavy-ball state exists from the first step on
    missing = sorted(required - set(entry))
    unknown = sorted(set(entry) - set(expected) - OPTIONAL_STATE - {"step"})
    if missing or unknown:
        raise ValueError(
            f"{name}.load_state_dict: the state of {where} lacks {missing} / has unknown {unknown}: it was "
            f"saved by another optimizer class than {name}"
        )
    step = entry["step"]
    if isinstance(step, Tensor) and step.numel() == 1 and not step.is_floating_point():
        step = int(step)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(
            f"{name}.load_state_dict: the step count of {where} must be an int >= 0, got {step!r}"
        )
    for key, value in entry.items():
        want = expected.get(key)
        if key == "step":
            continue
        if isinstance(want, int) and not isinstance(want, bool):  # a counter (K-FAC's factor updates)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}.load_state_dict: state {key!r} of {where} must be an int >= 0")
            continue
        if isinstance(want, float):  # a weight (Vadam's start weight)
            if not isinstance(value, float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}.load_state_dict: state {key!r} of {where} must be a float >= 0")
            continue
        if not isinstance(value, Tensor) or not value.is_floating_point():
            raise ValueError(f"{name}.load_state_dict: state {key!r} of {where} must be a floating tensor")
        shape = want.shape if isinstance(want, Tensor) else optional_shapes.get(key)
        if shape is not None and value.shape != shape:
            raise ValueError(
                f"{name}.load_state_dict: state {key!r} of {where} has shape {tuple(value.shape)}, expected "
                f"{tuple(shape)} (a model of another size?)"
            )
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{name}.load_state_dict: state {key!r} of {where} holds NaN or Inf values")
        if key == "prior_prec" and not bool((value > 0).all()):  # a posterior prior's precision (set_prior)
            raise ValueError(f"{name}.load_state_dict: state 'prior_prec' of {where} must be positive")
