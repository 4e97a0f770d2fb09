"""The decayed start's shift λ + N·w·s₀ of Vadam/Vprop (issue 22): one number when the tensors share w (they
stepped together), so the precision core and its compiled guards see one hyperparameter, not one per tensor;
the same float each tensor's entry would have held, so the draw is bitwise unchanged."""

from __future__ import annotations

import torch

import ngvi
from ngvi.optim.vadam import decayed_start_shift


def test_shared_start_weight_gives_one_number_and_distinct_weights_a_list():
    group = {"init_prec": "auto", "prior_prec": 2.0, "data_size": 100, "step_moment": "debiased"}
    same = [{"start_weight": 0.5}, {"start_weight": 0.5}]
    assert decayed_start_shift(group, same) == 2.0 + 100 * 1.0 * 0.5
    assert isinstance(decayed_start_shift(group, same), float)
    assert decayed_start_shift(group, [{"start_weight": 0.5}, {"start_weight": 1.0}]) == [52.0, 102.0]


def test_vadam_with_a_later_parameter_group_keeps_each_tensors_shift():
    """A group added after some steps has w = 1 while the first has decayed: each keeps its own shift."""
    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(3))
    opt = ngvi.Vadam([a], data_size=10, seed=0)

    def closure():
        opt.zero_grad()
        loss = (a.square().sum() + b.square().sum()) if len(opt.param_groups) > 1 else a.square().sum()
        loss.backward()
        return loss

    opt.step(closure)
    opt.param_groups[0]["params"].append(b)  # b joins the same group: its w starts at 1, a's is γ₂
    opt.step(closure)
    states = [opt.state[p] for p in (a, b)]
    weights = [st["start_weight"] for st in states]
    assert weights[0] != weights[1]
    assert isinstance(decayed_start_shift(opt.param_groups[0], states), list)
