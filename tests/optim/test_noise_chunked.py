"""``noise="chunked"`` (issue 22): ε in chunks from generators seeded by (seed, draw, parameter, chunk), on
several threads. Its statistics, its independence between chunks, and that a seed gives the same ε at any
thread count, after a rollback and after a resume."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

import ngvi
from ngvi.optim.engine.chunked import CHUNK, chunk_seed, chunked_normal_


def _draw(n: int, workers: int, *keys: int) -> torch.Tensor:
    return chunked_normal_(torch.empty(n), *keys, workers=workers)


def test_moments_and_ks_against_the_standard_normal():
    x = _draw(1_000_000 + 123, 2, 7, 0, 0).double()
    n = x.numel()
    assert abs(x.mean().item()) < 5 / math.sqrt(n)
    assert abs(x.var().item() - 1) < 5 * math.sqrt(2 / n)
    assert abs((x**3).mean().item()) < 5 * math.sqrt(15 / n)  # skewness
    assert abs((x**4).mean().item() - 3) < 5 * math.sqrt(96 / n)  # kurtosis
    assert stats.kstest(x[::10].numpy(), "norm").pvalue > 1e-3


def test_neighbouring_chunks_are_uncorrelated():
    x = _draw(16 * CHUNK, 2, 3, 5, 1).double().view(16, CHUNK)
    corr = [torch.corrcoef(x[k : k + 2])[0, 1].item() for k in range(15)]
    assert max(abs(c) for c in corr) < 5 / math.sqrt(CHUNK)
    assert not torch.equal(x[0], x[1])
    # the seeds of neighbouring keys are unrelated, not consecutive
    assert abs(chunk_seed(0, 0, 0, 1) - chunk_seed(0, 0, 0, 0)) > 2**32


def test_same_seed_same_draw_at_any_thread_count():
    before = torch.get_num_threads()
    try:
        draws = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            draws.append(_draw(5 * CHUNK + 17, threads, 11, 2, 4))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(draws[0], draws[1]) and torch.equal(draws[0], draws[2])
    for workers in (4, 7):  # runs of chunks per thread of every length, more threads than chunks
        assert torch.equal(draws[0], _draw(5 * CHUNK + 17, workers, 11, 2, 4))
    # chunk k is N(0, 1) from a generator seeded with chunk_seed(seed, draw, position, k), whoever fills it
    chunks = [
        torch.empty(min(CHUNK, 5 * CHUNK + 17 - k * CHUNK)).normal_(
            generator=torch.Generator().manual_seed(chunk_seed(11, 2, 4, k))
        )
        for k in range(6)
    ]
    assert torch.equal(draws[0], torch.cat(chunks))
    assert not torch.equal(draws[0], _draw(5 * CHUNK + 17, 2, 11, 3, 4))  # another draw count
    assert not torch.equal(draws[0], _draw(5 * CHUNK + 17, 2, 12, 2, 4))  # another seed


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(300, 250), torch.nn.Tanh(), torch.nn.Linear(250, 3))


def _train(opt, model, steps: int) -> None:
    x, y = torch.randn(32, 300, generator=torch.Generator().manual_seed(1)), torch.arange(32) % 3

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)


@pytest.mark.parametrize("cls", [ngvi.Vadam, ngvi.IVON])
def test_optimizer_with_chunked_noise_is_reproducible_across_threads_and_resume(cls):
    before = torch.get_num_threads()
    finals = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            model = _model()
            opt = cls(model.parameters(), data_size=100, noise="chunked", seed=3)
            _train(opt, model, 4)
            finals.append([p.detach().clone() for p in model.parameters()])
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*finals, strict=True))
    # resume from a state_dict after 2 steps: bit-identical to 4 straight steps
    model = _model()
    opt = cls(model.parameters(), data_size=100, noise="chunked", seed=3)
    _train(opt, model, 2)
    saved_model, saved_opt = model.state_dict(), opt.state_dict()
    model2 = _model()
    model2.load_state_dict(saved_model)
    opt2 = cls(model2.parameters(), data_size=100, noise="chunked", seed=99)
    opt2.load_state_dict(saved_opt)
    _train(opt2, model2, 2)
    assert all(torch.equal(a, b) for a, b in zip(finals[0], model2.parameters(), strict=True))
    # and "chunked" is another stream than "normal"'s
    model3 = _model()
    _train(cls(model3.parameters(), data_size=100, seed=3), model3, 4)
    assert not torch.equal(finals[0][0], next(model3.parameters()).detach())


def test_a_discarded_draw_is_rolled_back():
    model = _model()
    opt = ngvi.Vadam(model.parameters(), data_size=100, noise="chunked", seed=3)
    with pytest.raises(RuntimeError, match="boom"):
        opt.step(lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    _train(opt, model, 2)
    reference = _model()
    _train(ngvi.Vadam(reference.parameters(), data_size=100, noise="chunked", seed=3), reference, 2)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters(), strict=True))


def test_chunked_normal_refuses_a_non_contiguous_tensor():
    with pytest.raises(ValueError, match="needs a contiguous tensor"):
        chunked_normal_(torch.empty(4, 4).t(), 0)
