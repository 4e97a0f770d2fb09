"""Checkpoints written by main before the flat buffers (1546982) load into today's engine.

``tests/data/checkpoints/pre_flat.pt`` holds, for six rules, the model and optimizer state after three steps
and the parameters that old ngvi reached three steps later (``make.py`` beside it wrote it, with the old
package). Its per-parameter state tensors become the buckets' views on load; the per-tensor path
(``flat=False``) draws the old stream, so it continues exactly as the old engine did; the default flat path
continues with its own stream (one draw per bucket) from the same state.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ngvi

FILE = Path(__file__).parents[1] / "data" / "checkpoints" / "pre_flat.pt"
SAVED = torch.load(FILE, weights_only=True)
RULES = {"Vadam": {}, "Vprop": {}, "IVON": {}, "VON": {"lr": 0.01}, "NoisyAdam": {}, "BAdam": {}}


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1)).double()


def resume(name: str, flat: bool):
    net = model()
    net.load_state_dict(SAVED[name]["model"])
    opt = getattr(ngvi, name)(net.parameters(), data_size=64, seed=0, flat=flat, **RULES[name])
    opt.load_state_dict(SAVED[name]["optimizer"])
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(16, 3, generator=gen, dtype=torch.float64)
    y = torch.sin(x.sum(1, keepdim=True))

    def closure():
        opt.zero_grad()
        loss = 0.5 * (net(x) - y).square().mean()
        loss.backward()
        return loss

    return net, opt, [opt.step(closure) for _ in range(3)]


@pytest.mark.parametrize("name", RULES)
def test_the_per_tensor_path_continues_an_old_checkpoint_as_the_old_engine_did(name):
    net, _, _ = resume(name, flat=False)
    # the same kernels in the same order; across CPU types the vector units may round differently
    for got, old in zip(net.parameters(), SAVED[name]["continued"], strict=True):
        torch.testing.assert_close(got.detach(), old, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["IVON", "VON", "NoisyAdam"])
def test_a_checkpoint_from_before_the_trust_region_resumes_without_one(name):
    """pre_flat.pt predates ``kl_clip`` (5e952ec): those runs had no region, so they resume with none."""
    assert all("kl_clip" not in g for g in SAVED[name]["optimizer"]["param_groups"])
    _, opt, _ = resume(name, flat=False)
    assert [g["kl_clip"] for g in opt.param_groups] == [None]


@pytest.mark.parametrize("name", RULES)
def test_the_flat_path_loads_an_old_checkpoint_into_its_buckets(name):
    _, opt, losses = resume(name, flat=True)
    assert opt._buckets, "the loaded state was not flattened"
    assert all(torch.isfinite(loss) for loss in losses)
    # and the buckets it steps on hold the saved state
    saved_state = SAVED[name]["optimizer"]["state"]
    fresh = model()
    fresh.load_state_dict(SAVED[name]["model"])
    loaded = getattr(ngvi, name)(fresh.parameters(), data_size=64, flat=True, **RULES[name])
    loaded.load_state_dict(SAVED[name]["optimizer"])
    with loaded.sampled_params():  # a draw builds the buckets from the loaded state
        pass
    for i, p in enumerate(fresh.parameters()):
        for key, value in saved_state[i].items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                assert torch.equal(loaded.state[p][key], value), (name, key)
    assert loaded._buckets
