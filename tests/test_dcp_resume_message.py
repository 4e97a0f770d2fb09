"""Resuming a torch.distributed.checkpoint without ``opt.init_state()`` (issue 43, item 15): the refusal
names ``init_state()``, the step a user missed, not only a truncated file. One process, no process group."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import ngvi

dcp = pytest.importorskip("torch.distributed.checkpoint")


def _ivon(model: nn.Module) -> ngvi.IVON:
    return ngvi.IVON(model.parameters(), 16, seed=0)


def test_a_dcp_resume_without_init_state_says_to_call_it(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = _ivon(model)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    for _ in range(2):
        with opt.sampled_params(train=True):
            nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    with warnings.catch_warnings():  # DCP warns that no process group is initialised: one process here
        warnings.simplefilter("ignore")
        dcp.save({"optim": opt.state_dict()}, checkpoint_id=str(tmp_path))
        fresh = _ivon(model)
        state = {"optim": fresh.state_dict()}  # no init_state(): no per-parameter entries to fill
        dcp.load(state, checkpoint_id=str(tmp_path))
        with pytest.raises(ValueError, match=r"call opt\.init_state\(\) before opt\.state_dict\(\)") as err:
            fresh.load_state_dict(state["optim"])
        assert "\n" not in str(err.value) and "and 1 more is missing" in str(err.value)
        assert fresh.num_steps == 0  # refused: nothing loaded
        fresh.init_state()  # the documented order resumes
        state = {"optim": fresh.state_dict()}
        dcp.load(state, checkpoint_id=str(tmp_path))
        fresh.load_state_dict(state["optim"])
    assert fresh.num_steps == 2
    for a, b in zip(fresh.posterior().variance, opt.posterior().variance, strict=True):
        assert torch.equal(a, b)
