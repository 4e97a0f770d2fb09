"""bfloat16 parameters learn their posterior variance (issue 15): the state and a master copy of μ are
float32 (``fp32_state=True``, :mod:`ngvi.optim.engine.mixed_precision`).

Every optimizer of :data:`test_defaults.DEFAULTS` (and BBVI) trains the issue's toy for 100 steps from the
same seeds three ways: float32 parameters; bfloat16 parameters (inputs in bfloat16, the loss in float32);
float32 parameters under ``torch.autocast("cpu", dtype=torch.bfloat16)``, the usual mixed-precision path.

* The variance moves: the fraction of weights whose curvature state left its start
  (``diagnostics().precision_moved``) is at least 90% of float32's, and positive. (It is 100% for all but
  VadaGrad, whose 10⁴ start absorbs updates βĝ² below float32's resolution in ~75% of the weights, in every
  dtype.) Without the float32 state IVON's, noisy Adam's and VadaGrad's move in 0% of the weights
  (test_diagnostics.py).
* The final variances agree with float32's: per weight |σ²_bf16/σ²_f32 − 1| has median < 1% and maximum
  < 10%, the mean log-change of σ² from its start agrees within 5%, and so does the data's part of it, the
  mean |s_t − s₀| of the curvature state. (Measured: medians ≤ 2·10⁻³, maxima ≤ 4.6·10⁻² (BAdam, BBVI: their
  precision follows Adam's v̂ of the bfloat16 gradients), log-changes within 0.3%, |s_t − s₀| within 0.2%.)
"""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from test_defaults import BATCH, DEFAULTS, N, toy_data, toy_model

import ngvi
from ngvi.baselines import BBVI

STEPS = 100  # rounded down to whole epochs of one shuffle: 96 steps
# KFAC is a point estimate: no variance to compare
OPTIMIZERS = {
    **{k: v for k, v in DEFAULTS.items() if k != "kfac"},
    "bbvi": lambda m, seed: BBVI(m, N, lr=1e-2, seed=seed),
    # VON's default trust region binds in the first 16 steps and then now and then, at steps that bfloat16's
    # rounding moves (float32: 26, 41, 61; bfloat16: 32, 54, 83): one group-wide ν switching at other steps
    # moved one weight's variance by 24% from float32's (the median by 0.5%). This file tests the masters'
    # arithmetic, so VON runs here without the region (tests/optim/test_scale_grid.py tests the region).
    "von": lambda m, seed: ngvi.VON(m.parameters(), N, seed=seed, kl_clip=None),
    # IVON with its constant β₂ (forget_start=None): its 10⁻⁵ updates are the case a bfloat16 state cannot
    # hold. With the default early weight 3·10⁻³ (issue 44) h learns from the data within these 96 steps, and
    # bfloat16's rounding of the forward pass moves the Price estimates: the variances then differ from
    # float32's by a median 2.3% (max 167%; without the region 2.2%, 36%), while the curvature state's total
    # change agrees to 0.8%: noise in the estimates, not lost updates
    "ivon": lambda m, seed: ngvi.IVON(m.parameters(), N, seed=seed, forget_start=None),
}


def fit(make, dtype: torch.dtype, autocast: bool = False, seed: int = 0):
    """(optimizer, model, σ² at the start, σ² after ``STEPS`` steps, the mean absolute change of the curvature
    state s from its start (None for rules that declare none)); σ² flattened in float64."""
    x, y = toy_data()
    model = toy_model(seed).to(dtype)
    x = x.to(dtype)
    opt = make(model, seed)
    start = torch.cat([v.double().flatten() for v in opt.posterior().variance])
    key = getattr(opt, "_curvature_state", None)
    s0 = {p: opt.state[p][key].double().clone() for p in model.parameters()} if key else {}
    order = torch.Generator().manual_seed(100 + seed)
    for idx in torch.randperm(N, generator=order).split(BATCH) * (STEPS * BATCH // N):  # 96 steps

        def closure(xb=x[idx], yb=y[idx]):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = model(xb)
            loss = 0.5 * (out.float() - yb).square().mean()
            opt.backward(loss, out)
            return loss

        opt.step(closure)
    end = torch.cat([v.double().flatten() for v in opt.posterior().variance])
    ds = torch.cat([(opt.state[p][key].double() - s0[p]).abs().flatten() for p in s0]).mean() if s0 else None
    return opt, model, start, end, ds


def assert_same_posterior_variance(start, f32, other, ds32, ds):
    if ds32 is not None:  # the data's part of the change (the rest is a deterministic decay of the start)
        assert abs(ds / ds32 - 1) < 0.05, (ds32, ds)
    rel = (other / f32 - 1).abs()
    assert rel.median() < 1e-2 and rel.max() < 0.1, (rel.median(), rel.max())
    change, change_other = (f32 / start).log().mean(), (other / start).log().mean()
    assert (change_other - change).abs() <= 0.05 * change.abs() + 1e-9, (change, change_other)


@pytest.fixture(scope="module")
def float32_runs():
    return {}


def float32_run(cache, name):
    if name not in cache:
        cache[name] = fit(OPTIMIZERS[name], torch.float32)
    return cache[name]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_bfloat16_parameters_learn_the_float32_variance(name, float32_runs):
    opt32, _, start, var32, ds32 = float32_run(float32_runs, name)
    opt, model, start_bf16, var, ds = fit(OPTIMIZERS[name], torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    masters = [opt.state[p]["master"] for p in model.parameters() if "master" in opt.state[p]]
    assert masters and all(m.dtype == torch.float32 for m in masters)
    moved32, moved = opt32.diagnostics().precision_moved, opt.diagnostics().precision_moved
    assert moved32 > 0 and moved >= 0.9 * moved32, (moved32, moved)
    torch.testing.assert_close(start_bf16, start)  # the same start: computed in float32
    assert_same_posterior_variance(start, var32, var, ds32, ds)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_float32_parameters_under_autocast_learn_the_float32_variance(name, float32_runs):
    opt32, _, start, var32, ds32 = float32_run(float32_runs, name)
    opt, _, _, var, ds = fit(OPTIMIZERS[name], torch.float32, autocast=True)
    assert opt.diagnostics().precision_moved >= 0.9 * opt32.diagnostics().precision_moved
    assert_same_posterior_variance(start, var32, var, ds32, ds)


def test_a_checkpoint_keeps_the_float32_state_of_bfloat16_parameters():
    """torch's load_state_dict casts state to the parameter's dtype; the float32 state and master come back
    exactly, and training resumes bit for bit."""
    opt, model, *_ = fit(OPTIMIZERS["ivon"], torch.bfloat16)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    twin_model = toy_model(0).to(torch.bfloat16)
    twin_model.load_state_dict(model.state_dict())
    twin = OPTIMIZERS["ivon"](twin_model, 0)
    buf.seek(0)
    twin.load_state_dict(torch.load(buf, weights_only=True))
    for p, q in zip(model.parameters(), twin_model.parameters(), strict=True):
        for key in ("master", "hess", "momentum"):
            assert opt.state[p][key].dtype == twin.state[q][key].dtype == torch.float32
            assert torch.equal(opt.state[p][key], twin.state[q][key])
    x, y = toy_data()
    for o, m in ((opt, model), (twin, twin_model)):

        def closure(o=o, m=m):
            o.zero_grad()
            loss = 0.5 * (m(x[:BATCH].bfloat16()).float() - y[:BATCH]).square().mean()
            loss.backward()
            return loss

        o.step(closure)
    for p, q in zip(model.parameters(), twin_model.parameters(), strict=True):
        assert torch.equal(p, q) and torch.equal(opt.state[p]["master"], twin.state[q]["master"])


def test_fp32_state_false_keeps_the_parameter_dtype():
    """The option's other side: the state in bfloat16, no master (2 bytes per state entry)."""
    model = toy_model(0).to(torch.bfloat16)
    opt = ngvi.IVON(model.parameters(), N, fp32_state=False)
    x, y = toy_data()

    def closure():
        loss = 0.5 * (model(x[:BATCH].bfloat16()).float() - y[:BATCH]).square().mean()
        loss.backward()
        return loss

    with pytest.warns(ngvi.PosteriorWarning, match="fp32_state=True") as caught:
        opt.step(closure)
    assert caught[0].filename == __file__  # the warning points at the call of step()
    for p in model.parameters():
        assert "master" not in opt.state[p] and opt.state[p]["hess"].dtype == torch.bfloat16


def test_bench_counts_the_state_memory_per_weight():
    """``ngvi bench``'s state memory (bench/state_memory.kept_bytes): Vadam keeps u and v, 4 bytes each for
    float32 parameters; for bfloat16 parameters 4 bytes each plus the float32 master (12), or 2 bytes each
    with fp32_state=False (4)."""
    from ngvi.experiments.bench.state_memory import kept_bytes

    x, y = toy_data()
    for dtype, fp32_state, expected in (
        (torch.float32, True, 8),
        (torch.bfloat16, True, 12),
        (torch.bfloat16, False, 4),
    ):
        model = toy_model(0).to(dtype)
        opt = ngvi.Vadam(model.parameters(), N, fp32_state=fp32_state)

        def closure(model=model, opt=opt, dtype=dtype):
            opt.zero_grad()
            loss = 0.5 * (model(x[:BATCH].to(dtype)).float() - y[:BATCH]).square().mean()
            loss.backward()
            return loss

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ngvi.PosteriorWarning)
            opt.step(closure)
        assert kept_bytes(opt) == expected * sum(p.numel() for p in model.parameters())
