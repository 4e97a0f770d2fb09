"""Changes made to the parameters while a posterior sample is open, found when the sample closes.

A draw rebinds each parameter to a new tensor holding θ and keeps μ in the old one (:mod:`.perturbation`);
``end_sample()`` rebinds μ back. Anything written into the parameters in between (``model.load_state_dict``,
``model.double()`` or ``.to()``, an in-place ``p.add_()`` under ``no_grad``) lands in θ's tensor or replaces
it, and restoring μ would undo it without a word. The engine refuses it instead (the choice is explained in
docs/ARCHITECTURE.md, "Changing the parameters inside a sample"): μ is restored, the sample is discarded and
``end_sample()`` raises a RuntimeError naming the parameter (a discarded sample warns instead).

The check reads metadata only, O(number of parameters) in Python, with no tensor values read and so no
host-device sync: the tensor each parameter is bound to (its data pointer; θ's tensor is kept alive until
the sample closes, so its address cannot be reused), its dtype and shape, and autograd's version counter of
the parameter, which every in-place write through the parameter or a ``detach()``-ed alias bumps (and a
backward pass, which writes ``p.grad``, does not). Writes through ``p.data`` (``p.data.mul_(2)``) bypass the
version counter, as torch documents for ``.data``: they are not seen, and are undone like any write to θ.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import Tensor

from ... import _validation
from .sharded import is_sharded

Bound = dict[Tensor, tuple[Tensor, int]]


def bound(means: dict[Tensor, Tensor], thetas: dict[Tensor, Tensor]) -> Bound:
    """What each sampled parameter (a key of ``means``) holds right after the draw: θ's tensor (from
    ``thetas`` where the draw kept it) and the parameter's version counter. FSDP2's shards, which hold θ
    in place, are not guarded."""
    guarded = [p for p in means if not is_sharded(p)] if _validation._dtensor_class() else means
    return {p: (thetas[p] if p in thetas else p.detach(), p._version) for p in guarded}


def changes(bound_at_draw: Bound) -> list[tuple[Tensor, str]]:
    """The parameters changed since the draw, each with what changed."""
    out = []
    for p, (theta, version) in bound_at_draw.items():
        if (
            p._version == version
            and p.data_ptr() == theta.data_ptr()
            and p.dtype == theta.dtype
            and p.shape == theta.shape
        ):
            continue
        if p.dtype != theta.dtype:
            what = f"its dtype changed from {theta.dtype} to {p.dtype}"
        elif p.shape != theta.shape:
            what = f"its shape changed from {tuple(theta.shape)} to {tuple(p.shape)}"
        elif p.data_ptr() != theta.data_ptr():
            what = "its tensor was replaced (p.data = ..., or a move to another device)"
        else:
            what = "it was written in place"
        out.append((p, what))
    return out


def check(opt: Any, *, discard: bool) -> None:
    """Raise a RuntimeError if a parameter of ``opt`` changed since the draw. Where the sample is discarded
    (its block raised, or ``end_sample(discard=True)``, which frameworks call from their error handlers),
    warn instead: raising there would replace the error being handled."""
    changed = changes(opt._bound)
    if not changed:
        return
    p, what = changed[0]
    more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
    message = (
        f"{type(opt).__name__}.end_sample(): parameter {_name(opt, p)}{more} was changed while a posterior "
        f"sample was open ({what}); restoring the mean would silently undo it, so the mean is restored, the "
        "sample discarded and the change refused: make such changes (model.load_state_dict(), model.double() "
        "or .to(), in-place writes) between steps, outside sampled_params() or after end_sample()"
    )
    if not discard:
        raise RuntimeError(message)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def _name(opt: Any, p: Tensor) -> str:
    model = opt.model if opt.takes_model else None
    for name, q in model.named_parameters() if model is not None else ():
        if q is p:
            return f"'{name}'"
    for gi, group in enumerate(opt.param_groups):
        for j, q in enumerate(group["params"]):
            if q is p:
                return f"param_groups[{gi}]['params'][{j}]"
    return f"of shape {tuple(p.shape)}"
