"""One trust region per parameter group, wherever the step runs (issue 42, item 2).

The region's ν = min(1, √(κ/(α²m))) takes m = Σ u²/P over the whole group. Before, m was summed per call
of the update core: per CPU piece of a flat bucket, per slice of the per-tensor path, per bucket, per rank;
where the region binds, each piece then moved by its own ν and the step depended on where it ran (9–455% of
the move, issue 42's table). Here every rule with a region runs at a loss scale where it binds on every
step, with ``noise="chunked"`` (each weight's ε keyed by its place in its parameter, so every path draws the
same ε), on the default path, the per-tensor path, with the CPU pieces forced on a small bucket, several
buckets in one group, an empirical-Bayes split, and compiled. The flat path, its pieces and the per-tensor
path agree bitwise (their sums of m are formed alike), the rest to 1e-5 of the move, and the region
demonstrably binds (the uncapped move is more than twice as long). FSDP2's ranks: ``tests/test_fsdp2.py``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ngvi
from ngvi.optim.engine import flat as flat_layout
from ngvi.optim.functional import blocks

STEPS = 4
LOSS_SCALE = 1e4  # the region binds at every step (checked below)
MOVE_TOL = 1e-5  # of the largest move of a weight

#: every rule with a trust region on the element-wise paths, and its options
RULES = {
    "IVON": dict(lr=0.1),
    "VON": dict(lr=0.1),
    "NoisyAdam": dict(lr=0.1),
    "VadaGrad": dict(lr=1.0),
    "VOGN": dict(lr=0.1),
}


def model(dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 40), nn.Tanh(), nn.Linear(40, 30), nn.Tanh(), nn.Linear(30, 1))
    return net.to(dtype)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(32, 5, generator=gen, dtype=torch.float64)
    return x, torch.sin(x.sum(1, keepdim=True))


def build(name: str, net: nn.Module, *, groups: bool = False, **options) -> ngvi.VariationalOptimizer:
    kwargs = dict(seed=3, noise="chunked", **RULES[name], **options)
    if name == "VOGN":
        return ngvi.VOGN(net, 64, **kwargs)
    params = net.parameters()
    if groups:  # one group whose tensors are in two dtypes: two buckets
        params = list(params)
    sized = {} if name == "VadaGrad" else {"data_size": 64}
    return getattr(ngvi, name)(params, **sized, **kwargs)


def run(name: str, *, dtype=torch.float64, **options) -> list[torch.Tensor]:
    net = model(dtype)
    before = [p.detach().clone() for p in net.parameters()]
    opt = build(name, net, **options)
    x, y = data()
    x, y = x.to(dtype), y.to(dtype)

    def closure():
        opt.zero_grad()
        out = net(x)
        loss = LOSS_SCALE * 0.5 * (out - y).square().mean()
        opt.backward(loss, out)
        return loss

    for _ in range(STEPS):
        opt.step(closure)
    return [(p.detach() - b).double() for p, b in zip(net.parameters(), before, strict=True)]


def assert_same_move(moves, reference):
    scale = max(r.abs().max() for r in reference)
    worst = max((m - r).abs().max() for m, r in zip(moves, reference, strict=True))
    assert worst <= MOVE_TOL * scale, f"paths differ by {float(worst / scale):.2e} of the move"


@pytest.mark.parametrize("name", RULES)
def test_the_region_binds_here(name):
    capped, free = run(name), run(name, kl_clip=None)
    assert sum(m.square().sum() for m in free) > 4 * sum(m.square().sum() for m in capped)


@pytest.mark.parametrize("name", RULES)
def test_flat_per_tensor_and_cpu_pieces_agree_bitwise(name, monkeypatch):
    reference = run(name)
    if name == "VOGN":
        assert flat_layout.enabled(build(name, model()))
    assert all(torch.equal(a, b) for a, b in zip(run(name, flat=False), reference, strict=True))
    monkeypatch.setattr(flat_layout, "CPU_CHUNK", 512)  # four pieces of a 1,521-weight bucket
    pieces = run(name)
    assert all(torch.equal(a, b) for a, b in zip(pieces, reference, strict=True))
    monkeypatch.setattr(blocks, "SUM_BLOCK", 256)  # pieces cut at whole rows of the region's sum
    aligned, joined = run(name), run(name, flat=False)
    assert all(torch.equal(a, b) for a, b in zip(aligned, joined, strict=True))
    assert_same_move(aligned, reference)


@pytest.mark.parametrize("flat", [None, False])
def test_a_group_in_two_buckets_takes_one_region(flat):
    """A group whose tensors have two dtypes is two buckets. Its first capped step is the uncapped one scaled
    by one ν in both (IVON's first step is -αν(ĝ + δμ)/(h + δ), given the same ε)."""

    def first_move(**options):
        net = model()
        net[2].float()  # the middle layer in float32: its own bucket
        x, y = data()
        opt = ngvi.IVON(net.parameters(), 64, seed=3, noise="chunked", flat=flat, **options)
        before = [p.detach().clone() for p in net.parameters()]

        def closure():
            opt.zero_grad()
            out = net[4](net[3](net[2](net[1](net[0](x)).float())).double())
            loss = LOSS_SCALE * 0.5 * (out - y).square().mean()
            loss.backward()
            return loss

        opt.step(closure)
        if flat is None:
            assert len(next(iter(opt._buckets.values()))) == 2
        return [(p.detach() - b).double() for p, b in zip(net.parameters(), before, strict=True)]

    capped, free = first_move(), first_move(kl_clip=None)
    ratios = [(c / f).reshape(-1) for c, f in zip(capped, free, strict=True)]
    float32 = torch.cat(ratios[2:4]).median()  # its moves are rounded to float32: compare medians
    float64 = torch.cat(ratios[:2] + ratios[4:])
    assert float64.max() < 0.5  # the region binds
    torch.testing.assert_close(float64, torch.full_like(float64, float(float64.median())), rtol=1e-9, atol=0)
    torch.testing.assert_close(float32, float64.median(), rtol=1e-4, atol=0)


def test_an_empirical_bayes_split_keeps_the_group_region():
    """``empirical_bayes="layer"`` makes one group per tensor; the first step's move is the unsplit one's
    (λ is first learned after the step), not √L times longer (issue 43, item 3)."""

    def first_move(**options):
        net = model()
        before = [p.detach().clone() for p in net.parameters()]
        opt = ngvi.IVON(net.parameters(), 64, seed=3, noise="chunked", **options)
        x, y = data()

        def closure():
            opt.zero_grad()
            loss = LOSS_SCALE * 0.5 * (net(x) - y).square().mean()
            loss.backward()
            return loss

        opt.step(closure)
        return [p.detach() - b for p, b in zip(net.parameters(), before, strict=True)], opt

    whole, _ = first_move()
    split, opt = first_move(empirical_bayes=ngvi.optim.EmpiricalBayes(per="layer", every=100))
    assert len(opt.param_groups) == 6
    assert_same_move(split, whole)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["IVON", "NoisyAdam"])
def test_compiled_agrees_with_eager(name):
    pytest.importorskip("torch._inductor")
    assert_same_move(run(name, compile=True), run(name))
