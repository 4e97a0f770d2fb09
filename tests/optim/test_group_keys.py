"""Group keys a rule does not read warn once, naming the key (issue 21, item 4); IVON's ess= alias."""

from __future__ import annotations

import warnings

import pytest
import torch

import ngvi


def test_a_group_key_the_rule_ignores_warns_once_naming_it():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    with pytest.warns(UserWarning, match=r"Vadam ignores the parameter-group key 'weight_decay': it reads"):
        opt = ngvi.Vadam([{"params": [a], "weight_decay": 0.0}], data_size=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.add_param_group({"params": [b], "weight_decay": 0.1})  # once per key
        ngvi.IVON([{"params": [a], "weight_decay": 0.0, "name": "x"}], 10)  # IVON reads weight_decay
        torch.optim.lr_scheduler.StepLR(opt, 1)  # initial_lr
    assert opt.param_groups[1]["weight_decay"] == 0.1


def test_ivon_takes_ess_as_the_data_size():
    p = torch.nn.Parameter(torch.zeros(2))
    assert ngvi.IVON([p], ess=50).param_groups[0]["data_size"] == 50
    with pytest.raises(TypeError, match=r"data_size= \(N\) or its alias ess=, exactly one"):
        ngvi.IVON([p], 50, ess=50)
    with pytest.raises(TypeError, match="exactly one"):
        ngvi.IVON([p])
