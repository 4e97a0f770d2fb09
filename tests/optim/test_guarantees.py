"""The guarantees every trainer gives, checked for each entry of the optimizer database
(tests/optimizer_db.py): resume, copying, non-finite gradients, failures inside a sample or a closure,
parameters without gradient.

Each test compares against an exact expectation: bitwise-equal parameters, losses and state, usually the
steps of a twin that never saw what the test did to the trainer.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import ngvi
from optimizer_db import TRAINERS, assert_same, params_of, saved, trainers

pytestmark = pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")


def mc_kwargs(info, mc_samples: int) -> dict:
    return {"mc_samples": mc_samples} if info.mc_samples else {}


def assert_no_hooks(model: nn.Module) -> None:
    """No curvature hooks or local-reparameterisation hooks are left on the model between steps."""
    for m in model.modules():
        assert not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks), m


def poisoned(info, bad: float):
    x, y = info.batch()
    x = x.clone()
    x.view(-1)[0] = bad
    return x, y


# ------------------------------------------------------------------------------------------------------------
# Resume and copies
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("info", "mc_samples"),
    [
        pytest.param(info, mc, id=f"{info.name}-mc{mc}")
        for info in TRAINERS
        for mc in ((1, 2) if info.mc_samples else (1,))
    ],
)
def test_resume_from_a_checkpoint_is_bit_exact(info, mc_samples):
    """state_dict → torch.save → torch.load(weights_only=True) → a fresh trainer (other init, other seed,
    other lr, another global RNG state): the next steps, the losses and the state are bitwise the same."""
    model = info.model()
    opt = info.build(model, **mc_kwargs(info, mc_samples))
    info.train(model, opt, 3)
    ckpt = saved({"model": model.state_dict(), "opt": opt.state_dict()})
    losses = info.train(model, opt, 3, batch_seed=2)

    fresh_model = info.model(seed=123)
    other_seed = {"seed": 999} if info.engine else {}
    fresh = info.build(fresh_model, lr=0.5, **mc_kwargs(info, mc_samples), **other_seed)
    fresh_model.load_state_dict(ckpt["model"])
    fresh.load_state_dict(ckpt["opt"])
    torch.manual_seed(321)  # the resumed run must not depend on the global RNG (MC dropout reseeds it)
    assert_same(info.train(fresh_model, fresh, 3, batch_seed=2), losses)
    assert_same(params_of(fresh_model), params_of(model))
    assert_same(saved(fresh.state_dict()), saved(opt.state_dict()))
    if info.engine:
        assert fresh.num_steps == 6


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.parametrize("info", trainers())
def test_pickle_and_deepcopy_continue_identically(info, how):
    """(model, trainer) copied together between steps train on identically, with the same losses and state;
    the copy's trainer holds the copy's parameters; the model carries no hooks and copies on its own."""
    model = info.model()
    opt = info.build(model)
    info.train(model, opt, 2)
    model_copy, opt_copy = (
        pickle.loads(pickle.dumps((model, opt))) if how == "pickle" else copy.deepcopy((model, opt))
    )
    copied = {p for g in opt_copy.param_groups for p in g["params"]}
    assert copied == set(model_copy.parameters())
    assert_no_hooks(model)
    pickle.dumps(model)
    copy.deepcopy(model)
    assert_same(info.train(model_copy, opt_copy, 2), info.train(model, opt, 2))
    assert_same(params_of(model_copy), params_of(model))
    assert_same(saved(opt_copy.state_dict()), saved(opt.state_dict()))
    if info.posterior is not None:
        assert type(opt_copy.posterior()) is type(opt.posterior())


@pytest.mark.parametrize("info", trainers())
def test_global_seed_makes_runs_reproducible(info):
    """seed=None draws the trainer's seed from torch's global RNG, so torch.manual_seed fixes the run."""
    runs = []
    for seed in (7, 7, 8):
        model = info.model()
        torch.manual_seed(seed)
        opt = info.build(model)
        x, y = info.batch()
        losses = [opt.step(info.closure(opt, model, x, y)) for _ in range(3)]
        runs.append((losses, params_of(model)))
    assert_same(runs[0], runs[1])
    if (info.engine and info.cls._perturbs_in_step) or info.global_rng:
        assert not torch.equal(runs[0][1][0], runs[2][1][0])


# ------------------------------------------------------------------------------------------------------------
# Non-finite gradients
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("info", trainers())
def test_nonfinite_gradient_is_refused_and_changes_nothing(info, bad):
    """NonFiniteGradientError; the parameters, the state and the noise stream are as before, so the next
    steps are those of a twin that never saw the bad batch (MAP and MC dropout too: torch's Adam under them
    would apply the NaN)."""
    model = info.model()
    opt = info.build(model)
    info.train(model, opt, 2)
    twin_model, twin = copy.deepcopy((model, opt))
    before_params, before_state = params_of(model), saved(opt.state_dict())
    with pytest.raises(ngvi.NonFiniteGradientError, match="unchanged"):
        opt.step(info.closure(opt, model, *poisoned(info, bad)))
    assert_same(params_of(model), before_params)
    assert_same(saved(opt.state_dict()), before_state)
    assert_no_hooks(model)
    assert_same(info.train(model, opt, 2), info.train(twin_model, twin, 2))
    assert_same(params_of(model), params_of(twin_model))


@pytest.mark.parametrize("info", trainers(lambda info: info.engine))
def test_skip_nonfinite_skips_and_counts(info):
    model = info.model()
    opt = info.build(model, skip_nonfinite=True)
    info.train(model, opt, 2)
    twin_model, twin = copy.deepcopy((model, opt))
    before = params_of(model)
    loss = opt.step(info.closure(opt, model, *poisoned(info, float("nan"))))
    assert not torch.isfinite(loss)
    assert (opt.skipped_steps, opt.num_steps) == (1, 2)
    assert opt.state_dict()["ngvi"]["skipped_steps"] == 1
    assert_same(params_of(model), before)
    assert_same(info.train(model, opt, 2), info.train(twin_model, twin, 2))
    assert_same(params_of(model), params_of(twin_model))


@pytest.mark.parametrize("info", trainers())
def test_diagnostics_report_the_state(info):
    """Every trainer has diagnostics(): steps, skipped steps and data size as counted, and for a Gaussian
    posterior the fraction of moved precisions in [0, 1] (all moved after two steps of the small problems,
    all at the start), σ quantiles equal to those of posterior().variance, and the SNR's ordered."""
    model = info.model()
    opt = info.build(model, **({"skip_nonfinite": True} if info.engine else {}))
    if info.posterior is not None:
        assert opt.diagnostics().precision_moved == 0.0
    info.train(model, opt, 2)
    if info.engine:
        opt.step(info.closure(opt, model, *poisoned(info, float("nan"))))
    d = opt.diagnostics()
    assert (d.steps, d.skipped_steps) == (2, int(info.engine))
    groups = len(opt.param_groups)  # (VadaGrad has no data size; MC dropout a group per dropout rate)
    assert d.data_size == ([] if info.cls is ngvi.VadaGrad else [64] * groups)
    assert str(d).startswith(type(opt).__name__)
    if info.posterior is None:
        assert d.precision_moved is d.sigma_quantiles is None
        return
    assert d.precision_moved == 1.0 and d.at_float_limit == 0.0
    sigma = torch.cat([v.flatten() for v in opt.posterior().variance]).double().sqrt()
    expected = torch.quantile(sigma, torch.tensor(list(d.sigma_quantiles), dtype=torch.float64))
    assert list(d.sigma_quantiles.values()) == pytest.approx(expected.tolist(), rel=1e-5)
    assert list(d.snr_quantiles.values()) == sorted(d.snr_quantiles.values())


# ------------------------------------------------------------------------------------------------------------
# Failures inside a sample or a closure
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("train", [False, True], ids=["predict", "train"])
@pytest.mark.parametrize("info", trainers())
def test_exception_inside_sampled_params_restores_the_weights_exactly(info, train):
    """The weights are μ again, bitwise, no hook is left, the sample whose block raised is discarded with its
    noise rolled back (issue 20, 3.5), and the next step is that of a twin that never ran the block."""
    model = info.model()
    opt = info.build(model)
    info.train(model, opt, 2)
    twin_model, twin = copy.deepcopy((model, opt))
    mean = params_of(model)
    x, y = info.batch()
    with pytest.raises(KeyError, match="boom"), opt.sampled_params(train=train):
        if train:
            info.closure(opt, model, x, y, uniform=True)()
        elif info.posterior is not None:  # the block holds a sample
            assert any(not torch.equal(p, m) for p, m in zip(model.parameters(), mean, strict=True))
        raise KeyError("boom")
    assert_same(params_of(model), mean)
    assert_same(saved(opt.state_dict()), saved(twin.state_dict()))
    assert_no_hooks(model)
    assert_same(info.train(model, opt, 1), info.train(twin_model, twin, 1))
    assert_same(params_of(model), params_of(twin_model))


@pytest.mark.parametrize("info", trainers())
def test_exception_in_the_closure_changes_nothing(info):
    """The closure fails at its last MC sample, after the others accumulated: nothing is updated, and the
    next step is that of a twin that never tried."""
    model = info.model()
    opt = info.build(model, **mc_kwargs(info, 2))
    info.train(model, opt, 2)
    twin_model, twin = copy.deepcopy((model, opt))
    mean, state = params_of(model), saved(opt.state_dict())
    closure = info.closure(opt, model, *info.batch())
    calls = []

    def failing():
        calls.append(1)
        result = closure()
        if len(calls) == opt.mc_samples:
            raise RuntimeError("data loader died")
        return result

    with pytest.raises(RuntimeError, match="data loader died"):
        opt.step(failing)
    assert_same(params_of(model), mean)
    assert_same(saved(opt.state_dict()), state)
    assert_no_hooks(model)
    assert_same(info.train(model, opt, 1), info.train(twin_model, twin, 1))
    assert_same(params_of(model), params_of(twin_model))


@pytest.mark.parametrize("info", trainers())
def test_closure_without_backward_changes_nothing(info):
    """A closure that computes the loss but never runs a backward pass: every trainer refuses it (no
    gradient: RuntimeError, also MAP and MC dropout, where torch's Adam would step silently; with
    curvature='fisher', a bare loss instead of (loss, output): TypeError) and leaves weights, state and
    noise as they were."""
    model = info.model()
    opt = info.build(model)
    info.train(model, opt, 1)
    twin_model, twin = copy.deepcopy((model, opt))
    mean, state = params_of(model), saved(opt.state_dict())
    x, y = info.batch()

    def closure():
        opt.zero_grad()
        return info.problem.loss(model(x), y)

    if info.closure_style == "output":
        with pytest.raises(TypeError, match=r"must return \(loss, output\) without calling backward"):
            opt.step(closure)
    else:
        with pytest.raises(
            RuntimeError, match=r"no parameter has a gradient.*Does the closure call loss\.backward"
        ):
            opt.step(closure)
    assert_same(params_of(model), mean)
    assert_same(saved(opt.state_dict()), state)
    if info.engine:
        assert (opt.num_steps, opt.num_draws) == (twin.num_steps, twin.num_draws)
    assert_same(info.train(model, opt, 1), info.train(twin_model, twin, 1))
    assert_same(params_of(model), params_of(twin_model))


@pytest.mark.parametrize("info", trainers(lambda info: info.engine))
def test_samples_cannot_be_nested(info):
    model = info.model()
    opt = info.build(model)
    mean = params_of(model)
    with opt.sampled_params(train=True), pytest.raises(RuntimeError, match="cannot be nested"):
        opt.sampled_params().__enter__()
    assert_same(params_of(model), mean)
    assert_no_hooks(model)


# ------------------------------------------------------------------------------------------------------------
# Parameters without gradient
# ------------------------------------------------------------------------------------------------------------
class WithExtras(nn.Module):
    """The problem's model, plus a layer it never uses and a frozen one."""

    def __init__(self, body: nn.Module):
        super().__init__()
        dtype = next(body.parameters()).dtype
        self.body = body
        self.unused = nn.Linear(3, 2).to(dtype)
        self.frozen = nn.Linear(3, 1).to(dtype).requires_grad_(False)

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("info", trainers())
def test_parameters_without_gradient_are_skipped(info):
    """Unused and frozen parameters keep their values bitwise, their state never advances from its start (the
    engine draws noise for them, so their state exists, at step 0), and every used parameter moves."""
    model = WithExtras(info.model())
    opt = info.build(model)
    idle = [*model.unused.parameters(), *model.frozen.parameters()]
    idle_before, body_before = [p.detach().clone() for p in idle], params_of(model.body)
    if info.joint:  # one posterior over all parameters: an unused one is refused, and nothing changes
        with pytest.raises(RuntimeError, match=r"unused\.weight, unused\.bias got no gradient.*freeze"):
            info.train(model, opt, 1)
        assert_same(params_of(model.body), body_before)
        assert_same([p.detach() for p in idle], idle_before)
        assert opt.num_steps == 0 and all(s.get("step", 0) == 0 for s in opt.state.values())
        return
    info.train(model, opt, 1)
    idle_state = saved([opt.state.get(p, {}) for p in idle])
    info.train(model, opt, 2)
    assert_same([p.detach() for p in idle], idle_before)
    assert_same(saved([opt.state.get(p, {}) for p in idle]), idle_state)
    assert all(opt.state.get(p, {}).get("step", 0) == 0 for p in idle)
    assert not any(torch.equal(a, b) for a, b in zip(params_of(model.body), body_before, strict=True))
