"""A training step leaves no reference cycles: what it allocates is freed by reference counting when the
step returns, not whenever Python's cyclic collector happens to run. (The curvature hooks' records once
held the autograd nodes that held the records' tensor hooks: a small CNN's step left ~60 MB to the cyclic
collector, and ``ngvi bench`` ran out of 23 GB before a collection.)"""

from __future__ import annotations

import gc

import pytest
import torch

from optimizer_db import trainers


def cyclic_garbage(step) -> list:
    """The objects that only the cyclic collector would free after ``step()``."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        step()
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize("info", trainers())
def test_a_step_leaves_nothing_to_the_cyclic_collector(info):
    model = info.model(dtype=torch.float32)
    opt = info.build(model, **({"seed": 0} if info.engine else {}))
    info.train(model, opt, 2)  # the state exists; later steps allocate only transient tensors
    garbage = cyclic_garbage(lambda: info.train(model, opt, 1))
    tensors = [tuple(t.shape) for t in garbage if isinstance(t, torch.Tensor)]
    assert not garbage, f"{len(garbage)} objects in reference cycles, tensors {tensors[:5]}: " + ", ".join(
        sorted({type(o).__name__ for o in garbage})
    )
