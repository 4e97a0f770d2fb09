"""The functional cores (:mod:`ngvi.optim.functional`) as a library: shared blocks, compiled calls, layout.

The maths of each core is checked against the papers in ``test_transcription.py``; here: the shared blocks
keep the rounding of the code they replaced (bitwise), compiled cores read every hyperparameter afresh at
every call (a changed value is never a stale constant) and are cached per structure, and the Kronecker block
layout round-trips.
"""

from __future__ import annotations

import pytest
import torch

import ngvi
from ngvi.optim import functional as F
from ngvi.optim.functional import _capture
from ngvi.posterior import join_block, split_block
from optimizer_db import trainers

SHAPES = [(4, 3), (3,)]


def rand(seed: int, positive: bool = False) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
    return [t.abs() + 0.1 for t in out] if positive else out


def bias(beta: float, steps=(3, 7)) -> list[float]:
    return [1 - beta**t for t in steps]


# core -> (lists (seed, positive) or None, two hyperparameter sets)
CASES = {
    "vadam": (
        F.vadam_update_,
        [(0, 0), (1, 0), (2, 1), (3, 0), (4, 1)],
        [
            dict(lr=0.1, beta1=0.9, beta2=0.99, prior_tilde=0.01, bias1=bias(0.9), bias2=bias(0.99)),
            dict(lr=0.03, beta1=0.8, beta2=0.9, prior_tilde=0.2, bias1=bias(0.8), bias2=bias(0.9)),
        ],
    ),
    "vprop": (
        F.vprop_update_,
        [(0, 0), (1, 0), (2, 1), (3, 1)],
        [dict(lr=0.1, beta=0.9, prior_tilde=0.01), dict(lr=0.02, beta=0.5, prior_tilde=0.3)],
    ),
    "von": (
        F.von_update_,
        [(0, 0), (1, 0), (2, 0), (3, 1)],
        [dict(lr=0.1, beta=0.1, prior_tilde=0.01), dict(lr=0.02, beta=0.5, prior_tilde=0.3)],
    ),
    "ivon": (
        F.ivon_update_,
        [(0, 0), (1, 0), (2, 0), (3, 0), (4, 1)],
        [
            dict(lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.01, bias1=bias(0.9), clip_radius=0.5),
            dict(lr=0.3, beta1=0.5, beta2=0.9, weight_decay=0.2, bias1=bias(0.5), clip_radius=0.05),
        ],
    ),
    "noisy_adam": (
        F.noisy_adam_update_,
        [(0, 0), (1, 0), (2, 1), (3, 0), (4, 1)],
        [
            dict(lr=0.1, beta1=0.9, beta2=0.99, gamma_in=0.01, damping=0.0, bias1=bias(0.9)),
            dict(lr=0.3, beta1=0.5, beta2=0.9, gamma_in=0.2, damping=0.1, bias1=bias(0.5)),
        ],
    ),
    "badam": (
        F.badam_update_,
        [(0, 0), (1, 0), (2, 0), (3, 1)],
        [
            dict(
                lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, prior_tilde=0.01, bias1=bias(0.9), bias2=bias(0.99)
            ),
            dict(lr=0.3, beta1=0.5, beta2=0.9, eps=1e-3, prior_tilde=0.2, bias1=bias(0.5), bias2=bias(0.9)),
        ],
    ),
    "vadagrad": (
        F.vadagrad_update_,
        [(0, 0), (1, 0), (2, 1), (3, 1)],
        [dict(lr=0.1, beta=0.1), dict(lr=0.02, beta=0.7)],
    ),
    "vogn": (
        F.vogn_update_,
        [(0, 0), (1, 0), (2, 1), (3, 1), (4, 0), (5, 0)],
        [
            dict(lr=0.1, beta=0.1, momentum=0.5, prior_tilde=0.01),
            dict(lr=0.02, beta=0.5, momentum=0.9, prior_tilde=0.3),
        ],
    ),
    "bbvi": (
        F.bbvi_update_,
        [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 1), (6, 0), (7, 1)],
        [
            dict(
                lr=0.1,
                beta1=0.9,
                beta2=0.99,
                eps=1e-8,
                prior_prec=1.0,
                data_size=50.0,
                bias1=bias(0.9),
                bias2=bias(0.99),
            ),
            dict(
                lr=0.3,
                beta1=0.5,
                beta2=0.9,
                eps=1e-3,
                prior_prec=5.0,
                data_size=7.0,
                bias1=bias(0.5),
                bias2=bias(0.9),
            ),
        ],
    ),
    "sigma": (
        F.diagonal_sigma,
        [(0, 1)],
        [
            dict(precision=F.shifted_precision, keep_sqrt=True, shift=0.01, scale=50.0),
            dict(precision=F.shifted_precision, keep_sqrt=True, shift=0.7, scale=3.0),
        ],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_core_agrees_with_eager_for_changing_hyperparameters(name):
    """Two calls of one compiled core with different values: both agree with eager (rtol 1e-12, float64 and
    inductor's reassociation), so no value was compiled in as a constant, and the second call compiles
    nothing new."""
    core, specs, hypers = CASES[name]
    for k, hyper in enumerate(hypers):
        inputs = [rand(seed + 10 * k, bool(pos)) for seed, pos in specs]
        eager, compiled = [[t.clone() for t in x] for x in inputs], [[t.clone() for t in x] for x in inputs]
        with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=k > 0):
            out_e = F.run_core(core, *eager, **hyper)
            out_c = F.run_core(core, *compiled, compile=True, **hyper)
        torch.testing.assert_close(compiled, eager, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(out_c, out_e, rtol=1e-12, atol=1e-14)


def test_compiled_functions_are_cached_per_structure_with_own_code():
    s = rand(0, positive=True)
    hyper = dict(scale=3.0, shift=1.0, compile=True)
    F.run_core(F.scaled_precision, s, **hyper)
    before = {k: fn for k, fn in _capture._COMPILED.items() if k[0] is F.scaled_precision}
    F.run_core(F.scaled_precision, s, **{**hyper, "scale": 5.0})  # same structure: reused
    F.run_core(F.scaled_precision, s[:1], **hyper)  # another structure: its own function
    after = {k: fn for k, fn in _capture._COMPILED.items() if k[0] is F.scaled_precision}
    assert len(after) == len(before) + 1
    codes = {id(fn._torchdynamo_orig_callable.__code__) for fn in after.values()}
    assert len(codes) == len(after)  # dynamo's cache (and its limit) is per code object


def test_bbvi_adam_blocks_are_torch_adam_bitwise():
    """adam_moments_ without sq_grads plus adam_step_(correct_inside_sqrt=False) is torch.optim.Adam
    (foreach), bit for bit."""
    x, grads = rand(0), [rand(k) for k in range(1, 6)]
    ref = [torch.nn.Parameter(t.clone()) for t in x]
    adam = torch.optim.Adam(ref, lr=0.01, betas=(0.8, 0.95), eps=1e-6, foreach=True)
    mine, m, v = [t.clone() for t in x], [torch.zeros_like(t) for t in x], [torch.zeros_like(t) for t in x]
    for t, g in enumerate(grads, start=1):
        for p, gi in zip(ref, g, strict=True):
            p.grad = gi.clone()
        adam.step()
        F.adam_moments_(m, v, g, beta1=0.8, beta2=0.95)
        F.adam_step_(
            mine,
            m,
            v,
            lr=0.01,
            bias1=[1 - 0.8**t] * 2,
            bias2=[1 - 0.95**t] * 2,
            eps=1e-6,
            correct_inside_sqrt=False,
        )
    assert all(torch.equal(a, b.detach()) for a, b in zip(mine, ref, strict=True))


def test_riemannian_block_keeps_ivons_rounding():
    """IVON's former inline sequence, (h − ĥ)²/(h + δ)·½(1−β₂)², equals the shared block bitwise."""
    from ngvi._tensorlist import TensorList

    h, h_hat, beta2, delta = rand(0, positive=True), rand(1), 0.99999, 1e-4
    old = TensorList([t.clone() for t in h])
    riemann = (old - TensorList(h_hat)).square_().div_(old + delta).mul_(0.5 * (1 - beta2) ** 2)
    old.lerp_(TensorList(h_hat), 1 - beta2).add_(riemann)
    new = [t.clone() for t in h]
    F.riemannian_ema_(new, h_hat, beta=1 - beta2, damping=delta, coef=0.5 * (1 - beta2) ** 2)
    assert all(torch.equal(a, b) for a, b in zip(new, old, strict=True))


def test_badam_precision_before_the_first_step_leaves_its_state_alone():
    model = torch.nn.Linear(3, 2).double()
    opt = ngvi.BAdam(model.parameters(), 10, prior_prec=1.0)
    opt.posterior()
    opt.posterior()
    assert all(bool((st["exp_avg_sq"] == 0).all()) for st in opt.state.values())


@pytest.mark.parametrize("lead", [(), (5,)])
def test_kronecker_block_layout_round_trips(lead):
    groups, rows = 2, 3
    shapes = [torch.Size((groups * rows, 4, 1, 2)), torch.Size((groups * rows,))]  # a grouped conv's W and b
    tensors = [torch.randn(*lead, *s) for s in shapes]
    block = join_block(tensors, groups, rows, lead)
    assert block.shape == (*lead, groups, rows, 8 + 1)
    assert all(
        torch.equal(a, b) for a, b in zip(split_block(block, shapes, groups, rows), tensors, strict=True)
    )


@pytest.mark.parametrize("info", trainers(lambda info: info.engine and info.cls._elementwise))
def test_precision_core_gives_the_engines_sigma(info):
    """``_precision_core`` + :func:`diagonal_sigma` is the draw's √precision and σ: bitwise eagerly (the
    engine's ``_precision(...).sqrt_()`` then ``reciprocal()``), to rtol 1e-12 compiled."""
    model = info.model()
    opt = info.build(model, seed=0)
    info.train(model, opt, 2)
    group = opt.param_groups[0]
    states = [opt.state[p] for p in group["params"]]
    sqrt_prec = opt._precision(group, states).sqrt_()
    sigma = sqrt_prec.reciprocal()
    core, lists, hyper = opt._precision_core(group, states)
    for compile in (False, True):
        got_sqrt, got_sigma = F.run_core(
            F.diagonal_sigma, *lists, precision=core, keep_sqrt=True, compile=compile, **hyper
        )
        if compile:
            torch.testing.assert_close([*got_sqrt, *got_sigma], [*sqrt_prec, *sigma], rtol=1e-12, atol=0)
        else:
            assert all(
                torch.equal(a, b) for a, b in zip([*got_sqrt, *got_sigma], [*sqrt_prec, *sigma], strict=True)
            )


def test_summed_is_bitwise_the_same_for_any_thread_count():
    """The trust region's m: torch's flat sum of these 75,750 values differs in the last bit between 1 and
    2 threads; ``summed`` (rows of 4,096, then their sums) does not, and agrees with a float64 sum to 1e-6."""
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(75_750, generator=gen), torch.randn(3, 40_000, generator=gen), torch.randn(7)]
    before = torch.get_num_threads()
    seen = set()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            seen.add(F.summed(tensors, [1.0, 2.0, 3.0]).item())
    finally:
        torch.set_num_threads(before)
    exact = sum(w * t.double().sum().item() for t, w in zip(tensors, (1.0, 2.0, 3.0), strict=True))
    assert len(seen) == 1
    assert seen.pop() == pytest.approx(exact, rel=1e-6)
