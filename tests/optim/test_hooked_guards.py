"""Uses of the per-example hooks that cannot give correct statistics are refused, not silently pooled.

* Gradient accumulation: two backward passes (micro-batches) in one posterior sample would pool example i of
  each micro-batch as one example "of a layer called twice". Every hook-based trainer refuses it with a
  message naming the fix, leaves μ and its state as they were, and takes a correct step afterwards.
* Zero-size parameters (``nn.Linear(4, 0)``) are refused when a trainer is built, naming the parameter.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import ngvi
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


@pytest.mark.parametrize("info", trainers(hooked))
def test_a_hook_message_names_the_trainer_the_user_built(info):
    """KFAC shares noisy K-FAC's estimator: its messages must still say KFAC."""
    model = info.model()
    opt = info.build(model, seed=0)
    out = model(info.batch()[0])
    with pytest.raises(RuntimeError, match=rf"^{type(opt).__name__}\.backward\(\) belongs inside"):
        opt.backward(out.sum(), out)


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


# ------------------------------------------------------------------------------------------------------------
# Zero-size parameters: refused by the engine, for every trainer built on it, at construction
# ------------------------------------------------------------------------------------------------------------
def with_empty_layer(info, empty: nn.Linear) -> nn.Module:
    model = info.model()
    model.append(empty.double())
    return model


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize("info", trainers(lambda info: info.engine))
@pytest.mark.parametrize("shape", [(4, 0), (0, 4)], ids=["no-outputs", "no-inputs"])
def test_zero_size_parameters_are_refused_at_construction(info, shape):
    model = with_empty_layer(info, nn.Linear(*shape))
    name = f"{len(model) - 1}.weight"
    # the engine names parameters by the model it hooks (NoisyAdam hooks it for its per-example curvatures)
    hooks_model = info.cls.takes_model or (info.cls is ngvi.NoisyAdam and info.takes_model)
    where = rf"'{re.escape(name)}'" if hooks_model else r"param_groups\[0\]\['params'\]\[\d+\]"
    rows, cols = shape[1], shape[0]
    with pytest.raises(ValueError, match=rf"{where} has shape \({rows}, {cols}\) and no elements.*freeze"):
        info.build(model)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize("info", trainers(lambda info: info.engine and not info.takes_model))
def test_a_frozen_zero_size_parameter_is_left_alone(info):
    model = with_empty_layer(info, nn.Linear(4, 0)).requires_grad_(False)
    model[0].requires_grad_(True)
    opt = info.build(model)
    assert opt.param_groups[0]["params"]


def test_a_zero_size_parameter_group_added_later_is_refused_and_not_kept():
    model = nn.Linear(3, 2).double()
    opt = ngvi.Vadam(model.parameters(), 10)
    empty = torch.zeros(0, 5, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]\[0\] has shape \(0, 5\)"):
        opt.add_param_group({"params": [empty]})
    assert len(opt.param_groups) == 1
