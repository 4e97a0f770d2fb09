"""The noise ε: the NoiseSource on its own (the seeded stream, rollback, pairs, its state), and the engine's
opt-in noise options, antithetic pairs and a cheaper noise dtype (the default stream through the rules is
pinned by test_transcription.py)."""

from __future__ import annotations

import copy
import io
import math
import pickle

import pytest
import torch

import ngvi
from conftest import make_mlp
from ngvi.optim.engine.noise import NoiseSource
from optimizer_db import BY_NAME, params_of


def zeros(*shapes, dtype=torch.float64):
    return [torch.zeros(s, dtype=dtype) for s in shapes]


# -- NoiseSource on its own ----------------------------------------------------------------------------
def test_noise_is_the_seeded_standard_normal_stream():
    ps = zeros((3, 4), (5,))
    source = NoiseSource(7, "normal", None, "shared", keep=False)
    gen = torch.Generator().manual_seed(7)
    for p in ps:  # parameter by parameter, in order, from one generator seeded with the seed
        assert torch.equal(source.fresh(p), torch.empty_like(p).normal_(generator=gen))
    a, b = NoiseSource(7, "normal", None, "shared", True), NoiseSource(7, "normal", None, "shared", True)
    assert torch.equal(a.into(ps[0].clone()), b.fresh(ps[0]))  # drawing into p is the same draw


def test_rollback_restores_the_stream_and_the_draw_count():
    p = zeros((100,))[0]
    source = NoiseSource(3, "normal", None, "shared", keep=False)
    source.fresh(p)
    checkpoint = source.checkpoint()
    source.begin_draw([p])
    discarded = source.fresh(p).clone()
    source.end_draw(False)
    assert source.num_draws == 1
    source.rollback(checkpoint)
    assert source.num_draws == 0 and torch.equal(source.fresh(p), discarded)


def test_antithetic_pairs_negate_and_survive_pickling_mid_pair():
    p = zeros((50,))[0]
    source = NoiseSource(11, "antithetic", None, "shared", keep=False)
    assert source.keep  # the pair's ε is kept for its second half
    reuse = source.begin_draw([p])
    first = source.draw(p, reuse).clone()
    source.end_draw(reuse)
    copy = pickle.loads(pickle.dumps(source))  # mid pair: the buffer is not pickled, it is redrawn
    copy.redraw_pair()  # redrawn at the next draw, for the draw's keys
    for s in (source, copy):
        reuse = s.begin_draw([p])
        assert reuse and torch.equal(s.draw(p, reuse), -first)
        s.end_draw(reuse)
        assert s.pair_start is None


def test_noise_state_dict_round_trip():
    p = zeros((20,))[0]
    source = NoiseSource(5, "normal", None, "shared", keep=False)
    source.fresh(p)
    restored = NoiseSource(0, "normal", None, "shared", keep=False)
    restored.load_state_dict(source.state_dict())
    assert restored.seed == 5 and torch.equal(restored.fresh(p), source.fresh(p))


# -- the optimizers' noise options ---------------------------------------------------------------------
def draw(model, opt):
    with opt.sampled_params():
        return params_of(model)


@pytest.mark.parametrize("name", ["vadam", "ivon", "von_price", "noisy_adam"])
def test_antithetic_pairs_mirror_the_first_draw_and_cost_one_draw(name):
    model = make_mlp()
    opt = BY_NAME[name].build(model, noise="antithetic", seed=5)
    mean = params_of(model)
    first, second = draw(model, opt), draw(model, opt)
    third = draw(model, opt)
    for m, a, b in zip(mean, first, second, strict=True):
        torch.testing.assert_close(b - m, -(a - m), rtol=1e-12, atol=1e-15)
    # a pair consumes one draw of the generator: the third sample is the plain stream's second
    model_plain = make_mlp()
    plain = BY_NAME[name].build(model_plain, seed=5)
    draw(model_plain, plain)
    assert all(torch.equal(a, b) for a, b in zip(third, draw(model_plain, plain), strict=True))


@pytest.mark.parametrize("name", ["vadam", "ivon"])
@pytest.mark.parametrize("split", [2, 3])  # a checkpoint between pairs and in the middle of one
def test_antithetic_resume_is_bit_identical(name, split):
    info = BY_NAME[name]
    model = make_mlp()
    opt = info.build(model, noise="antithetic")
    info.train(model, opt, 6)
    straight = params_of(model)

    model = make_mlp()
    opt = info.build(model, noise="antithetic")
    info.train(model, opt, split)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    model2 = make_mlp(seed=9)
    opt2 = info.build(model2, noise="antithetic", seed=1)
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    info.train(model2, opt2, 6 - split)
    assert all(torch.equal(a, b) for a, b in zip(params_of(model2), straight, strict=True))


def test_antithetic_copies_and_failed_steps_continue_the_pair():
    info = BY_NAME["ivon"]
    model = make_mlp()
    opt = info.build(model, noise="antithetic", mc_samples=1)
    info.train(model, opt, 3)  # mid pair
    twin_model, twin = copy.deepcopy((model, opt))
    pkl_model, pkl = pickle.loads(pickle.dumps((model, opt)))
    closure = info.closure(opt, model, *info.batch())

    def failing():
        closure()
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        opt.step(failing)  # uses −ε, then is discarded: the pair must be as before
    for m, o in [(model, opt), (twin_model, twin), (pkl_model, pkl)]:
        info.train(m, o, 3)
    assert all(torch.equal(a, b) for a, b in zip(params_of(model), params_of(twin_model), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(params_of(model), params_of(pkl_model), strict=True))


def test_antithetic_samples_have_the_posterior_variance():
    model = make_mlp()
    opt = ngvi.Vadam(model.parameters(), 64, prior_prec=2.0, init_prec=9.0, noise="antithetic", seed=0)
    draws = torch.stack([torch.cat([t.flatten() for t in draw(model, opt)]) for _ in range(2000)])
    mean = torch.cat([p.detach().flatten() for p in model.parameters()])
    var = (draws - mean).square().mean(0)  # pairs share |ε|: 1000 independent values per weight
    band = 4 / 9.0 * math.sqrt(2 / 1000)
    assert torch.all((var - 1 / 9.0).abs() < band)


def test_noise_dtype_draws_float32_for_float64_parameters():
    model = make_mlp()  # float64
    opt = ngvi.Vadam(model.parameters(), 64, init_prec=50.0, noise_dtype=torch.float32, seed=2)
    mean = params_of(model)
    sample = draw(model, opt)
    gen = torch.Generator().manual_seed(2)
    sigma = 1 / math.sqrt(50.0)
    # one float32 draw for the group's flat buffer (ngvi.optim.engine.flat), cut into the parameters
    flat_eps = torch.empty(sum(m.numel() for m in mean), dtype=torch.float32).normal_(generator=gen)
    for m, s, eps in zip(mean, sample, flat_eps.double().split([m.numel() for m in mean]), strict=True):
        torch.testing.assert_close(s, m + sigma * eps.view(m.shape), rtol=1e-12, atol=1e-15)
    BY_NAME["vadam"].train(model, opt, 3)  # and it trains, with its state in the parameters' dtype
    assert all(
        v.dtype == torch.float64 for st in opt.state.values() for v in st.values() if torch.is_tensor(v)
    )


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"noise": "sobol"}, "noise"),
        ({"noise_dtype": torch.int32}, "noise_dtype"),
        ({"rank_noise": "x"}, "rank_noise"),
    ],
)
def test_bad_noise_options_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ngvi.Vadam(make_mlp().parameters(), 10, **kwargs)


def test_rank_noise_is_inert_in_a_single_process():
    runs = []
    for rank_noise in ("shared", "independent"):
        model = make_mlp()
        opt = BY_NAME["vadam"].build(model, rank_noise=rank_noise, seed=4)
        BY_NAME["vadam"].train(model, opt, 3)
        runs.append(params_of(model))
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))
