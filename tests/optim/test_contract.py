"""The interface every trainer shares, checked for each entry of the optimizer database
(tests/optimizer_db.py): constructor errors, parameter groups, dtypes, zero_grad, the closure and manual
forms, and the posterior."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ngvi
from optimizer_db import BAD_ARGUMENTS, TRAINERS, assert_same, params_of, saved, trainers

pytestmark = [
    pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True"),
    pytest.mark.filterwarnings("ignore:hessian= is deprecated:DeprecationWarning"),
]


# ------------------------------------------------------------------------------------------------------------
# Construction
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("info", "kwargs", "message"),
    [
        pytest.param(info, kwargs, message, id=f"{info.name}-{','.join(map(str, kwargs.items()))}")
        for info in TRAINERS
        for kwargs, message in (*BAD_ARGUMENTS, *info.bad_arguments)
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(info, kwargs, message):
    with pytest.raises(ValueError, match=message):
        info.build(info.model(), **kwargs)


@pytest.mark.parametrize("seed", [-1, 2**63, 2**70, True], ids=["-1", "2**63", "2**70", "True"])
@pytest.mark.parametrize("info", trainers(lambda info: info.engine))
def test_seed_is_checked_in_the_constructor(info, seed):
    """Seeds torch's generators take but the checkpoint refuses (-1), or that overflowed only at the first
    draw (2**70; never, for a trainer that draws nothing), are refused at once, by name and range."""
    with pytest.raises(ValueError, match=rf"^seed must be an int in \[0, 2\*\*63\) or None, got {seed!r}$"):
        info.build(info.model(), seed=seed)
    opt = info.build(info.model(), seed=0)
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*63\)"):
        opt.seed = seed
    assert opt.seed == 0


@pytest.mark.parametrize("info", trainers(lambda info: info.engine))
def test_largest_seed_trains_and_its_checkpoint_reloads(info):
    model = info.model()
    opt = info.build(model, seed=2**63 - 1)
    info.train(model, opt, 2)
    fresh = info.build(info.model(), seed=0)
    fresh.load_state_dict(saved(opt.state_dict()))
    assert fresh.seed == 2**63 - 1
    assert_same(saved(fresh.state_dict()), saved(opt.state_dict()))


@pytest.mark.parametrize("info", trainers(lambda info: info.takes_model))
def test_trainers_that_take_the_model_refuse_its_parameters_with_a_type_error(info):
    name = info.cls.__name__
    model = info.model()
    for params, kind in ((model.parameters(), "generator"), (list(model.parameters()), "list")):
        with pytest.raises(
            TypeError,
            match=rf"^{name} takes the model \(an nn\.Module\) .*, got {kind}; write {name}\(model, ",
        ):
            info.factory(params)


@pytest.mark.parametrize("info", trainers())
def test_param_groups_have_their_own_hyperparameters(info):
    """A second group with lr=0 keeps its weights bitwise while the first trains; trainers that hook the
    model's layers refuse a second group, by name, and stay as they were."""
    model = info.model()
    body, head = model[:-1], model[-1]
    if not info.add_param_group:
        opt = info.build(model)
        groups = [dict(g) for g in opt.param_groups]
        with pytest.raises(ValueError, match=r"add_param_group\(\) is not supported"):
            opt.add_param_group({"params": [nn.Parameter(torch.zeros(2, dtype=torch.float64))]})
        assert [dict(g) for g in opt.param_groups] == groups
        return
    opt = info.build(body)
    opt.add_param_group({"params": list(head.parameters()), "lr": 0.0})
    assert [g["lr"] for g in opt.param_groups][-2:] == [opt.defaults["lr"], 0.0]
    body_before, head_before = params_of(body), params_of(head)
    info.train(model, opt, 3)
    assert_same(params_of(head), head_before)
    assert not any(torch.equal(a, b) for a, b in zip(params_of(body), body_before, strict=True))
    if info.posterior is not None:
        assert [m.shape for m in opt.posterior().mean] == [p.shape for p in model.parameters()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("info", trainers())
def test_state_and_posterior_keep_the_parameter_dtype(info, dtype):
    assert dtype in info.dtypes
    model = info.model(dtype=dtype)
    opt = info.build(model)
    before = params_of(model)
    info.train(model, opt, 3)
    for p, p0 in zip(model.parameters(), before, strict=True):
        assert p.dtype == dtype and torch.isfinite(p).all() and not torch.equal(p, p0)
        for key, value in opt.state[p].items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:  # Adam's 0-dim step is float32
                assert value.dtype == dtype, key
    if info.posterior is not None:
        post = opt.posterior()
        assert {t.dtype for t in post.mean + post.variance} == {dtype}


@pytest.mark.parametrize("info", trainers(lambda info: not info.takes_model))
def test_mixed_dtypes_in_one_optimizer(info):
    torch.manual_seed(0)
    w32 = nn.Parameter(torch.randn(4, 3))
    w64 = nn.Parameter(torch.randn(3, dtype=torch.float64))
    opt = info.build(nn.ParameterList([w32, w64]))
    x = torch.randn(8, 4)

    def closure():
        opt.zero_grad()
        loss = ((x @ w32).double() @ w64).pow(2).mean()
        loss.backward(create_graph=info.closure_style == "create_graph")
        return loss

    for _ in range(3):
        opt.step(closure)
    for p in (w32, w64):
        for value in opt.state[p].values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                assert value.dtype == p.dtype
        assert torch.isfinite(p).all()
    if info.posterior is not None:
        assert [m.dtype for m in opt.posterior().mean] == [torch.float32, torch.float64]


# ------------------------------------------------------------------------------------------------------------
# Gradients, closures and the manual form
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("info", trainers())
def test_zero_grad_clears_the_trainers_gradients(info):
    """zero_grad(set_to_none=False) zeroes every gradient in place; zero_grad() drops them."""
    model = info.model()
    opt = info.build(model)
    info.train(model, opt, 1)
    x, y = info.batch()
    info.problem.loss(model(x), y).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is g and not g.any() for p, g in zip(model.parameters(), grads, strict=True))
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("info", trainers())
def test_uniform_backward_equals_the_trainers_own_closure(info):
    """``opt.backward(loss, output)`` in the closure takes bitwise the steps of the trainer's own closure
    form (loss.backward(), backward(create_graph=True), or returning (loss, output)), for every trainer."""
    runs = []
    for uniform in (False, True):
        model = info.model()
        opt = info.build(model)
        assert isinstance(opt, ngvi.PosteriorOptimizer)
        x, y = info.batch()
        closure = info.closure(opt, model, x, y, uniform=uniform)
        torch.manual_seed(1)
        runs.append(([opt.step(closure) for _ in range(3)], params_of(model)))
    assert_same(runs[0], runs[1])


@pytest.mark.parametrize(
    ("info", "samples"),
    [
        pytest.param(info, k, id=f"{info.name}-{k}")
        for info in TRAINERS
        for k in ((1, 3) if info.manual_form == "samples" and info.mc_samples else (1,))
    ],
)
def test_manual_form_equals_the_closure_form(info, samples):
    """step(closure) with mc_samples=k is bitwise k sampled_params(train=True) blocks and step() (for BAdam
    a backward pass at the mean and step(); for Adam one backward pass and step())."""
    runs = []
    for manual in (False, True):
        model = info.model()
        opt = info.build(model, **({} if manual or samples == 1 else {"mc_samples": samples}))
        x, y = info.batch()
        closure = info.closure(opt, model, x, y, uniform=True)
        torch.manual_seed(1)
        for _ in range(3):
            if not manual:
                opt.step(closure)
                continue
            for _ in range(samples):
                with opt.sampled_params(train=True):
                    closure()
            opt.step()
        runs.append(params_of(model))
    assert_same(runs[0], runs[1])


# ------------------------------------------------------------------------------------------------------------
# The posterior
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("info", trainers(lambda info: info.posterior is not None))
def test_posterior_is_a_snapshot_of_the_trained_parameters(info):
    """posterior() has one (mean, variance) per parameter of the trainer, in order and shape; the mean is the
    parameters bitwise (also read inside a sample); variances are positive and finite; it is a copy."""
    model = info.model()
    opt = info.build(model)
    info.train(model, opt, 3)
    post = opt.posterior()
    expected = {
        "diagonal": ngvi.DiagonalGaussian,
        "kronecker": ngvi.KroneckerGaussian,
        "full": ngvi.FullGaussian,
        "blktri": ngvi.BlockTridiagonalGaussian,
    }[info.posterior]
    assert type(post) is expected
    params = [p for g in opt.param_groups for p in g["params"]]
    assert [v.shape for v in post.variance] == [p.shape for p in params]
    assert_same(post.mean, [p.detach() for p in params])
    assert all(torch.isfinite(v).all() and (v > 0).all() for v in post.variance)
    with opt.sampled_params():
        assert_same(opt.posterior().mean, post.mean)
    snapshot = [t.clone() for t in post.mean + post.variance]
    info.train(model, opt, 1)
    assert_same(post.mean + post.variance, snapshot)


@pytest.mark.parametrize("info", trainers(lambda info: info.posterior is None))
def test_trainers_without_a_gaussian_posterior_say_so(info):
    opt = info.build(info.model())
    with pytest.raises(NotImplementedError, match=info.no_posterior):
        opt.posterior()
