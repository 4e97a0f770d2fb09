"""The K-FAC family reads values back at most once per inversion (issue 30, item 4): the success of every
layer's Cholesky factorisations is one device flag per factor, read for all layers at once; before, each
layer read its own (2 to 4 reads per layer, ~450 per inversion step on a 12-block language model)."""

from __future__ import annotations

import pytest
import torch

import ngvi
from host_reads import OpCounter
from ngvi.baselines import KFAC
from ngvi.curvature.kfac import all_succeeded, damped_inverse, damped_inverses, factorise, roots_and_inverse

LAYERS = 6
INV_EVERY = 4


def chain():
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(8, 8), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(8, 1)), torch.randn(16, 8), torch.randn(16, 1)


# NNGBlkTri is left out: its chain's generalised eigenproblems (torch.linalg.cholesky and eigh, which have
# no *_ex form for eigh) check their own errors, about 4 reads per layer and damping at an inversion
@pytest.mark.parametrize("cls", [KFAC, ngvi.NoisyKFAC], ids=lambda c: c.__name__)
def test_one_read_per_inversion_and_one_finiteness_check_per_step(cls):
    model, x, y = chain()
    opt = cls(model, data_size=100, inv_every=INV_EVERY)

    def closure():
        opt.zero_grad()
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        opt.backward(loss, out)
        return loss

    opt.step(closure)
    reads = []
    for _ in range(2 * INV_EVERY):
        with OpCounter() as counter:
            opt.step(closure)
        reads.append(counter.sync_count)
    inverting = [(k + 1) % INV_EVERY == 0 for k in range(len(reads))]
    # the host path's finiteness check, plus at most one read when the factors are inverted
    assert reads == [1 + i for i in inverting]


def test_a_failed_factorisation_falls_back_alone():
    """One non-PSD factor in the batch: the shared flag says "not all", and only that factor takes the
    eigendecomposition; the others keep their Cholesky results, bitwise as when checked alone."""
    torch.manual_seed(1)
    good = torch.randn(2, 5, 5)
    good = good @ good.mT
    bad = -torch.eye(5).expand(2, 5, 5).clone()  # negative definite: Cholesky of bad + c·I fails for c < 1
    c = torch.full((2,), 0.1)
    factorisations = [factorise(good, c, 2 * c), factorise(bad, c, 2 * c)]
    assert not all_succeeded(factorisations)
    for f, x in zip(factorisations, (good, bad), strict=True):
        alone = damped_inverses(x, c, 2 * c)
        for u, v in zip(roots_and_inverse(f, False), alone, strict=True):
            assert torch.equal(u, v)
    assert torch.equal(
        damped_inverse(good, c), torch.cholesky_inverse(torch.linalg.cholesky(good + 0.1 * torch.eye(5)))
    )
    # the fallback's inverse is still the damped inverse of the PSD part (eigenvalues clamped at 0): 1/c
    assert torch.allclose(roots_and_inverse(factorisations[1], False)[1], torch.eye(5).expand(2, 5, 5) / 0.2)
