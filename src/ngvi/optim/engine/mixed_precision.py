r"""Low-precision parameters: the optimizer state and a master copy of μ in float32.

The curvature EMAs move by (1−β₂)·(ĥ − s) per step, 10⁻³ to 10⁻⁵ of s. bfloat16 keeps 8 significant bits
(a relative spacing of 2⁻⁸ ≈ 4·10⁻³), so in a bfloat16 state these updates round away and the posterior
variance never moves from its start (IVON's h stays at ``hess_init``); float16's range also overflows a
precision N·s above 65504. The same holds for small steps of μ. With ``fp32_state=True`` (the default) every
parameter of a lower precision than float32 (bfloat16, float16) gets

* its state in float32: the rule's ``_init_state`` runs with the parameter's data temporarily bound to a
  float32 copy, so that ``zeros_like(p)`` and its kin make float32 tensors (the parameter object, which some
  rules use as a key, stays the same);
* a float32 master copy of μ, ``state["master"]``: the rule updates it, and the parameter receives it
  rounded to its own dtype after each step (:func:`write_back`); the posterior's mean is the master;
* its gradient, curvature estimate and MC sums in float32 (:func:`upcast`);
* θ = μ + σ⊙ε formed in float32 from the master and rounded once into the parameter's dtype.

Memory per weight (2 bytes for the bfloat16 parameter, k = the rule's parameter-shaped state tensors): 2 + 2k
bytes with ``fp32_state=False``, 2 + 4 + 4k with the default (Vadam, k = 2: 6 vs 14 bytes; ``ngvi bench``
measures it). float32 and float64 parameters are not affected. Like every mixed-precision optimizer, the
master is the truth: a change written into the parameters outside the optimizer is overwritten at the next
step (load both, or call ``opt.state.clear()`` to start over).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

#: the parameter dtypes whose state is kept in float32 under ``fp32_state=True``
LOW_PRECISION = (torch.bfloat16, torch.float16)


def promoted(opt: Any, p: Tensor) -> bool:
    """True if ``p``'s state and mean live in float32 (``fp32_state`` and a low-precision parameter)."""
    return opt.fp32_state and p.dtype in LOW_PRECISION


@torch.no_grad()
def init_state(opt: Any, group: dict[str, Any], p: Tensor, state: dict[str, Any]) -> None:
    """The rule's ``_init_state`` for ``p``, in float32 with a master copy of μ where ``p`` is promoted."""
    if not promoted(opt, p):
        opt._init_state(group, p, state)
        return
    master = p.detach().to(torch.float32, memory_format=torch.preserve_format, copy=True)
    data = p.data
    p.data = master.clone()  # the rule's `*_like(p)` now make float32 tensors
    try:
        opt._init_state(group, p, state)
    finally:
        p.data = data
    state["master"] = master


def mean(opt: Any, p: Tensor, current: Tensor | None = None) -> Tensor:
    """μ as the rule updates it: the master of a promoted parameter, else ``current`` (μ's tensor while the
    parameter holds a sample) or the parameter's tensor."""
    state = opt.state.get(p)
    if state and "master" in state:
        return state["master"]
    return current if current is not None else p.detach()


def upcast(opt: Any, p: Tensor, t: Tensor) -> Tensor:
    """``t`` (a gradient or curvature estimate of ``p``) in float32 where ``p`` is promoted."""
    return t.float() if promoted(opt, p) and t.dtype != torch.float32 else t


@torch.no_grad()
def write_back(opt: Any, params: list[Tensor]) -> None:
    """Round each promoted parameter's master into the parameter after an update."""
    for p in params:
        state = opt.state.get(p)
        if state and "master" in state:
            p.copy_(state["master"])


def restore_float32_state(opt: Any, state_dict: dict[str, Any]) -> None:
    """After torch's ``load_state_dict``, which casts every floating state tensor to its parameter's dtype
    (rounding a float32 state to bfloat16), put back the saved float32 state of promoted parameters."""
    ids = {
        saved_id: p
        for saved, group in zip(state_dict["param_groups"], opt.param_groups, strict=True)
        for saved_id, p in zip(saved["params"], group["params"], strict=True)
    }
    for key, entry in state_dict["state"].items():
        p = ids[key]
        if not promoted(opt, p):
            continue
        for k, value in entry.items():
            if k != "step" and isinstance(value, Tensor) and value.is_floating_point():
                opt.state[p][k] = value.to(device=p.device, dtype=torch.float32, copy=True)


def check_dtypes(opt: Any) -> None:
    """A TypeError naming the first parameter whose dtype changed since its state was made (``model.double()``
    or ``.to(torch.bfloat16)`` after a step): its state and μ are in the old dtype, and no conversion keeps
    the run it belongs to. No tensor read; the state is looked at only when the parameters' dtypes differ from
    the last check's (a step otherwise pays one list of dtypes)."""
    dtypes = [p.dtype for group in opt.param_groups for p in group["params"]]
    if dtypes == opt.__dict__.get("_checked_dtypes"):
        return
    for gi, group in enumerate(opt.param_groups):
        for j, p in enumerate(group["params"]):
            state = opt.state.get(p)
            if not state:
                continue
            master = state.get("master")
            ref = master if master is not None else next((v for v in state.values() if _floating(v)), None)
            if ref is None:
                continue
            low = p.dtype in LOW_PRECISION and opt.fp32_state
            if not (low if master is not None else ref.dtype == p.dtype):
                made = ref.dtype if master is None else "bfloat16/float16 (with a float32 master)"
                raise TypeError(
                    f"{type(opt).__name__}: param_groups[{gi}]['params'][{j}] is now {p.dtype}, but its "
                    f"optimizer state was made for {made}: change the model's dtype before building the "
                    "optimizer; after a change, build a new optimizer (or load_state_dict a state saved "
                    "with this dtype)"
                )
    opt._checked_dtypes = dtypes


def _floating(v: Any) -> bool:
    return isinstance(v, Tensor) and v.is_floating_point()
