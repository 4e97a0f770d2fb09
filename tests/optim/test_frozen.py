"""Frozen parameters (``requires_grad=False``) are fixed, not random, under every trainer: they get no
optimizer state, they are left out of ``posterior()`` (as the hook-based rules always did), and no
predictive path (the loop, ``vectorize=True``, ``linearized=True``) perturbs them (issue 20, item 3.1).
"""

from __future__ import annotations

import pytest
import torch

import ngvi
from optimizer_db import trainers


def _frozen_model(info):
    """The entry's model with every parameter frozen except the last tensor (the output layer's bias)."""
    model = info.model()
    params = list(model.parameters())
    for p in params[:-1]:
        p.requires_grad_(False)
    return model, params[:-1], params[-1]


@pytest.mark.parametrize("info", trainers(lambda i: not i.takes_model and i.posterior is not None))
def test_frozen_parameters_get_no_state_no_variance_and_no_noise(info):
    model, frozen, bias = _frozen_model(info)
    before = [p.clone() for p in frozen]
    opt = info.build(model, seed=0)
    info.train(model, opt, 3)
    post = opt.posterior()
    opt.diagnostics()
    assert [m.shape for m in post.mean] == [bias.shape]  # the trainable parameters only
    assert torch.equal(post.mean[0], opt.mean_of(bias))
    x, _ = info.batch()
    paths = {"loop": {}, "vectorize": {"vectorize": True}}
    if info.name == "badam":
        paths["linearized"] = {"linearized": True}
    for path, kwargs in paths.items():
        out = ngvi.predict(model, opt, x, samples=6, **kwargs)
        # only the output bias is random: every sample shifts all outputs by the same amount
        shift = out - out[:, :1]
        assert torch.allclose(shift, shift[:1].expand_as(shift), rtol=0, atol=1e-12), path
        assert float(out[:, 0].std()) > 0, path  # ... and it is random
    assert all(torch.equal(p, b) for p, b in zip(frozen, before, strict=True))
    assert all(p not in opt.state for p in frozen)  # nothing allocated for them
    assert len(opt.state_dict()["state"]) == 1


@pytest.mark.parametrize("info", trainers(lambda i: i.takes_model and i.posterior is not None))
def test_hooked_trainers_leave_a_frozen_layer_out(info):
    model = info.model()
    first = list(model.parameters())[:2]  # the first layer
    for p in first:
        p.requires_grad_(False)
    opt = info.build(model, seed=0)
    info.train(model, opt, 2)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert [m.shape for m in opt.posterior().mean] == [p.shape for p in trainable]
    x, _ = info.batch()
    ngvi.predict(model, opt, x, samples=2, vectorize=True)
    assert all(p not in opt.state for p in first)
