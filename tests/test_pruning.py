"""Pruning by |μ|/σ or |μ| (ngvi.pruning) against brute force: Python's sort of (score, position) pairs."""

from __future__ import annotations

import math

import pytest
import torch

import ngvi
from ngvi import DiagonalGaussian
from ngvi.pruning import prune_masks, prune_scores


def random_posterior(seed: int = 0) -> DiagonalGaussian:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (5,), (3, 7), (3,)]
    mean = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    var = [torch.rand(s, generator=gen, dtype=torch.float64) * 2 + 0.01 for s in shapes]
    return DiagonalGaussian(mean, var)


def brute_force_pruned(values: list[float], k: int) -> set[int]:
    """Positions of the k lowest values; among equal values the earlier position first."""
    return {i for _, i in sorted((v, i) for i, v in enumerate(values))[:k]}


def flat(tensors) -> list[float]:
    return [float(x) for t in tensors for x in t.reshape(-1)]


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.25, 0.5, 0.9, 0.97, 1.0])
def test_snr_pruning_masks_exactly_the_lowest_snr_weights(fraction):
    q = random_posterior()
    snr = [
        float(abs(m) / math.sqrt(v)) for m, v in zip(flat(q.mean), flat(q.variance), strict=True)
    ]  # |μ|/σ computed here, element by element, not by the library
    masks = q.prune_masks(fraction)
    pruned = {i for i, keep in enumerate(flat(masks)) if not keep}
    n = len(snr)
    assert pruned == brute_force_pruned(snr, math.floor(fraction * n + 0.5))
    assert [m.shape for m in masks] == [m.shape for m in q.mean]
    assert all(m.dtype == torch.bool for m in masks)


def test_magnitude_pruning_ignores_the_variance_and_snr_does_not():
    # weight 0: large |μ| but very uncertain; weight 1: small |μ|, certain; weight 2: in between
    q = DiagonalGaussian([torch.tensor([2.0, 0.5, 1.0])], [torch.tensor([100.0, 1e-4, 1.0])])
    assert flat(q.prune_masks(1 / 3, criterion="snr")) == [False, True, True]  # SNR: 0.2, 50, 1
    assert flat(q.prune_masks(1 / 3, criterion="magnitude")) == [True, False, True]


def test_ties_go_to_the_weight_that_comes_first_and_exactly_k_are_pruned():
    scores = [torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0.0, 1.0, 0.0])]
    # flattened: [1, 0, 0, 1 | 0, 1, 0]: the zeros sit at positions 1, 2, 4, 6
    masks = prune_masks(scores, fraction=2 / 7)
    assert [i for i, keep in enumerate(flat(masks)) if not keep] == [1, 2]
    masks = prune_masks(scores, fraction=5 / 7)  # all four zeros, then the first one: position 0
    assert [i for i, keep in enumerate(flat(masks)) if not keep] == [0, 1, 2, 4, 6]
    equal = [torch.ones(10)]
    for k in range(11):
        masks = prune_masks(equal, fraction=k / 10)
        assert [i for i, keep in enumerate(flat(masks)) if not keep] == list(range(k))


def test_the_pruned_count_is_p_times_n_rounded_half_up():
    scores = [torch.arange(100.0)]
    # 0.29 · 100 is 28.999999999999996 and 0.9 · 10 is 9.000000000000002 in floating point
    assert int((~prune_masks(scores, 0.29)[0]).sum()) == 29
    assert int((~prune_masks([torch.arange(10.0)], 0.9)[0]).sum()) == 9
    assert int((~prune_masks([torch.arange(10.0)], 0.25)[0]).sum()) == 3  # 2.5 rounds up
    assert int((~prune_masks([torch.arange(10.0)], 0.24)[0]).sum()) == 2


def test_per_tensor_scope_prunes_each_tensor_on_its_own():
    q = random_posterior(1)
    masks = q.prune_masks(0.4, scope="per_tensor")
    for mask, score in zip(masks, q.snr(), strict=True):
        k = math.floor(0.4 * score.numel() + 0.5)
        pruned = {i for i, keep in enumerate(mask.reshape(-1).tolist()) if not keep}
        assert pruned == brute_force_pruned(score.reshape(-1).tolist(), k)


def test_global_ranking_mixes_dtypes_exactly_and_inf_is_pruned_last():
    scores = [torch.tensor([0.3, math.inf], dtype=torch.float64), torch.tensor([0.1, 0.2])]
    assert flat(prune_masks(scores, 0.75)) == [False, True, False, False]


def test_pruned_zeroes_the_parameters_and_restores_them_also_on_error():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    opt = ngvi.Vadam(model.parameters(), data_size=10, prior_prec=1.0, init_prec=10.0, seed=0)
    masks = opt.posterior().prune_masks(0.5)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(3, 4)
    with ngvi.pruned(model.parameters(), masks):
        for p, b, m in zip(model.parameters(), before, masks, strict=True):
            torch.testing.assert_close(p.detach(), torch.where(m, b, torch.zeros_like(b)), rtol=0, atol=0)
        out = model(x)
    manual = torch.nn.functional.linear(
        torch.relu(torch.nn.functional.linear(x, before[0] * masks[0], before[1] * masks[1])),
        before[2] * masks[2],
        before[3] * masks[3],
    )
    torch.testing.assert_close(out, manual)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    with pytest.raises(RuntimeError, match="boom"), ngvi.pruned(model.parameters(), masks):
        raise RuntimeError("boom")
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    ngvi.apply_masks(model.parameters(), masks)
    assert sum(int((p == 0).sum()) for p in model.parameters()) == sum(int((~m).sum()) for m in masks)


def test_bad_input_is_refused_with_a_message():
    q = random_posterior()
    for fraction in (-0.1, 1.5, math.nan, True, "0.5"):
        with pytest.raises(ValueError, match="fraction"):
            q.prune_masks(fraction)
    with pytest.raises(ValueError, match="criterion"):
        prune_scores(q, "random")
    with pytest.raises(ValueError, match="scope"):
        q.prune_masks(0.5, scope="layerwise")
    with pytest.raises(ValueError, match="NaN"):
        prune_masks([torch.tensor([1.0, math.nan])], 0.5)
    with pytest.raises(ValueError, match="empty"):
        prune_masks([], 0.5)
    params = [torch.zeros(7, 5)]
    with pytest.raises(ValueError, match="masks"):
        ngvi.apply_masks(params, [torch.ones(7, 5, dtype=torch.bool)] * 2)
    with pytest.raises(ValueError, match="shape"):
        ngvi.apply_masks(params, [torch.ones(5, 7, dtype=torch.bool)])
    with pytest.raises(ValueError, match="boolean"):
        ngvi.apply_masks(params, [torch.ones(7, 5)])
