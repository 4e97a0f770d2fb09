"""The callback form of sampling: ``begin_sample`` / ``end_sample`` / ``in_sample`` (issue 21, item 1).

``sampled_params`` is written on top of them, so a run driven through the pair is bitwise the run through
blocks; an abandoned sample can always be closed (``end_sample(discard=True)``), after which the optimizer
is exactly as if the sample had never been drawn, and can be pickled again.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch

from optimizer_db import assert_same, params_of, trainers

ENGINE = trainers(lambda i: i.engine and i.manual_form == "samples")


def _manual_steps(info, model, opt, steps: int, callbacks: bool) -> list[torch.Tensor]:
    x, y = info.batch()
    losses = []
    for _ in range(steps):
        if callbacks:
            opt.begin_sample(train=True)
            assert opt.in_sample
            loss = info.closure(opt, model, x, y, uniform=True)()
            opt.end_sample()
        else:
            with opt.sampled_params(train=True):
                loss = info.closure(opt, model, x, y, uniform=True)()
        assert not opt.in_sample
        opt.step()
        losses.append(loss.detach())
    return losses


@pytest.mark.parametrize("info", ENGINE)
def test_begin_and_end_sample_are_sampled_params(info):
    model = info.model()
    opt = info.build(model, seed=4)
    twin_model, twin = copy.deepcopy((model, opt))
    assert_same(_manual_steps(info, model, opt, 3, True), _manual_steps(info, twin_model, twin, 3, False))
    assert_same(params_of(model), params_of(twin_model))


@pytest.mark.parametrize("info", ENGINE)
def test_an_abandoned_sample_is_closed_and_changes_nothing(info):
    """A forward pass raised between a framework's callbacks: end_sample(discard=True) restores μ, drops
    the sample and rolls its noise back; the optimizer pickles and trains like a twin that never began."""
    model = info.model()
    opt = info.build(model, seed=4)
    _manual_steps(info, model, opt, 1, True)
    twin_model, twin = copy.deepcopy((model, opt))
    mean = params_of(model)
    x, y = info.batch()
    opt.begin_sample(train=True)
    info.closure(opt, model, x, y, uniform=True)()  # a backward ran, then the framework's step failed
    with pytest.raises(RuntimeError, match=r"end_sample\(\)"):
        pickle.dumps(opt)
    with pytest.raises(RuntimeError, match="already open"):
        opt.begin_sample()
    opt.end_sample(discard=True)
    assert not opt.in_sample
    assert_same(params_of(model), mean)
    assert opt.accumulator.count == 0
    pickle.dumps(opt)
    assert_same(opt.state_dict(), twin.state_dict())
    assert_same(_manual_steps(info, model, opt, 2, True), _manual_steps(info, twin_model, twin, 2, True))
    assert_same(params_of(model), params_of(twin_model))


def test_discard_rolls_back_only_the_discarded_sample():
    """Two samples, the second discarded: the step is that of one sample, with the first sample's noise."""
    info = next(p.values[0] for p in ENGINE if p.values[0].name == "vadam")
    model = info.model()
    opt = info.build(model, seed=2, mc_samples=2)
    twin_model, twin = copy.deepcopy((model, opt))
    x, y = info.batch()
    closure = info.closure(opt, model, x, y, uniform=True)
    opt.begin_sample(train=True)
    closure()
    opt.end_sample()
    opt.begin_sample(train=True)
    closure()
    opt.end_sample(discard=True)
    with pytest.warns(UserWarning, match="fewer than mc_samples=2"):
        opt.step()
    twin_closure = info.closure(twin, twin_model, x, y, uniform=True)
    with twin.sampled_params(train=True):
        twin_closure()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        twin.step()
    assert_same(params_of(model), params_of(twin_model))
    assert_same(opt.state_dict(), twin.state_dict())
    with warnings.catch_warnings():  # warned once
        warnings.simplefilter("error")
        with opt.sampled_params(train=True):
            closure()
        opt.step()


def test_end_sample_without_a_sample_says_what_to_do():
    info = ENGINE[0].values[0]
    opt = info.build(info.model())
    with pytest.raises(RuntimeError, match=r"no sample is open \(begin_sample\(\) first\)"):
        opt.end_sample()


@pytest.mark.parametrize("info", trainers(lambda i: i.manual_form == "adam"))
def test_adam_baselines_have_the_callback_form_too(info):
    """MAP and MC dropout: begin/end_sample is their sampled_params (dropout on inside, modes restored);
    a discarded sample's gradients are dropped, so the next step() refuses instead of applying them."""
    model = info.model()
    model.eval()
    opt = info.build(model)
    x, y = info.batch()
    opt.begin_sample(train=True)
    assert opt.in_sample
    assert all(m.training for m in getattr(opt, "_dropouts", ()))  # MC dropout samples through its masks
    info.closure(opt, model, x, y)()
    opt.end_sample(discard=True)
    assert not opt.in_sample and not any(m.training for m in model.modules())
    with pytest.raises(RuntimeError, match="no parameter has a gradient"):
        opt.step()
    with pytest.raises(RuntimeError, match="no sample is open"):
        opt.end_sample()
