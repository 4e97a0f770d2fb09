"""A checkpoint resumes its noise stream bitwise, or is refused in one line naming the setting (issue 42,
item 4). The stream depends on the noise kind, its dtype, the path's draws (one per flat bucket or one per
parameter) and, for ``noise="chunked"``, the chunk size; all four are saved in the ``"ngvi"`` entry."""

from __future__ import annotations

import copy

import pytest
import torch

import ngvi


def problem():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1)).double()
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return net, x, torch.sin(x.sum(1, keepdim=True))


def steps(net, opt, x, y, count):
    def closure():
        opt.zero_grad()
        loss = 0.5 * (net(x) - y).square().mean()
        loss.backward()
        return loss

    return [opt.step(closure) for _ in range(count)]


@pytest.mark.parametrize("options", [{}, {"flat": False}, {"noise": "chunked"}, {"noise": "antithetic"}])
def test_a_resume_on_the_same_settings_continues_the_stream_bitwise(options):
    net, x, y = problem()
    opt = ngvi.IVON(net.parameters(), 64, seed=2, **options)
    steps(net, opt, x, y, 3)
    saved_net = {k: v.clone() for k, v in net.state_dict().items()}
    saved_opt = copy.deepcopy(opt.state_dict())  # torch's state dict holds the live state tensors
    steps(net, opt, x, y, 3)
    twin, _, _ = problem()
    twin.load_state_dict(saved_net)
    resumed = ngvi.IVON(twin.parameters(), 64, seed=99, **options)  # the seed comes from the checkpoint
    resumed.load_state_dict(saved_opt)
    steps(twin, resumed, x, y, 3)
    for a, b in zip(net.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("saved", "loaded", "message"),
    [
        ({}, {"flat": False}, r"noise_path='flat'.*build it with flat=None"),
        ({"flat": False}, {}, r"noise_path='per_tensor'.*build it with flat=False"),
        ({"noise": "chunked"}, {}, r"noise='chunked'.*build it with noise='chunked'"),
        ({"noise_dtype": torch.float32}, {}, r"noise_dtype=torch.float32"),
    ],
)
def test_a_resume_on_another_stream_is_refused_naming_the_setting(saved, loaded, message):
    net, x, y = problem()
    opt = ngvi.IVON(net.parameters(), 64, seed=2, **saved)
    steps(net, opt, x, y, 1)
    state = opt.state_dict()
    other = ngvi.IVON(net.parameters(), 64, seed=2, **loaded)
    before = other.state_dict()
    with pytest.raises(ValueError, match=message):
        other.load_state_dict(state)
    assert other.state_dict()["ngvi"] == before["ngvi"]  # left as it was


def test_a_chunked_stream_of_another_chunk_size_is_refused():
    net, x, y = problem()
    opt = ngvi.IVON(net.parameters(), 64, seed=2, noise="chunked")
    steps(net, opt, x, y, 1)
    state = opt.state_dict()
    state["ngvi"]["noise_chunk"] = 1024
    with pytest.raises(ValueError, match=r"noise_chunk=1024.*chunks of 1024 elements"):
        ngvi.IVON(net.parameters(), 64, seed=2, noise="chunked").load_state_dict(state)
