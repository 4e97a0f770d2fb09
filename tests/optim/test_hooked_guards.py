"""Uses of the per-example hooks that cannot give correct statistics are refused, not silently pooled.

* Gradient accumulation: two backward passes (micro-batches) in one posterior sample would pool example i of
  each micro-batch as one example "of a layer called twice". Every hook-based trainer refuses it with a
  message naming the fix, leaves μ and its state as they were, and takes a correct step afterwards.
"""

from __future__ import annotations

import pytest
import torch

from ngvi.curvature.layer import LayerCurvature
from optimizer_db import TRAINERS, assert_same, params_of, saved, trainers


def hooked(info) -> bool:
    return info.takes_model and info.engine and info.cls.curvatures and "ef" in info.cls.curvatures


def _state(opt, form):
    """The state; a raised sampled_params() block spends its draw (test_guarantees), so there the noise
    stream's position is left out."""
    state = saved(opt.state_dict())
    if form == "manual":
        for key in ("rng", "num_draws", "pair_start"):
            state["ngvi"].pop(key, None)
    return state


@pytest.mark.parametrize("info", trainers(hooked))
@pytest.mark.parametrize("form", ["closure", "manual"])
def test_gradient_accumulation_in_one_sample_is_refused(info, form):
    model = info.model()
    opt = info.build(model, seed=0)
    assert isinstance(opt.curvature_estimator, LayerCurvature)
    x, y = info.batch()
    halves = [(x[:4], y[:4]), (x[4:], y[4:])]
    info.train(model, opt, 1)  # a step first: the refused step must leave a non-trivial state alone
    before, state = params_of(model), _state(opt, form)

    def accumulate():
        opt.zero_grad()
        for xb, yb in halves:
            out = model(xb)
            opt.backward(info.problem.loss(out, yb), out)
        return torch.zeros(())

    with pytest.raises(RuntimeError, match=r"gradient accumulation.*concatenate the micro-batches"):
        if form == "closure":
            opt.step(accumulate)
        else:
            with opt.sampled_params(train=True):
                accumulate()
            opt.step()
    assert_same(params_of(model), before)
    assert_same(_state(opt, form), state)
    assert opt.accumulator.count == 0
    info.train(model, opt, 1)  # one backward pass per sample still works
    assert opt.num_steps == 2


def test_two_forwards_one_backward_is_weight_sharing_and_still_works():
    """A layer called twice in one graph (shared weights) is one example per row, its calls summed."""
    info = next(i for i in TRAINERS if i.name == "vogn")
    model = info.model()
    opt = info.build(model, seed=0)
    x, y = info.batch()

    def closure():
        opt.zero_grad()
        loss = info.problem.loss(model(x), y) + info.problem.loss(model(x + 1), y)
        loss.backward()
        return loss

    opt.step(closure)
    assert opt.num_steps == 1
