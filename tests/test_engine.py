"""Engine-wide guarantees, checked for every diagonal rule: exception safety, NaN handling, grad=None,
bit-identical resume, validation, parameter groups, schedulers, dtypes, call order, copying."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

import ngvi
from conftest import build, make_closure, make_mlp, regression_batch, train

pytestmark = pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def assert_same_state(sd1, sd2):
    """Two optimizer state_dicts are identical (tensors bitwise)."""
    assert sd1.keys() == sd2.keys()
    for k in sd1:
        v1, v2 = sd1[k], sd2[k]
        if isinstance(v1, dict):
            assert_same_state(v1, v2)
        elif isinstance(v1, torch.Tensor):
            assert torch.equal(v1, v2), k
        elif isinstance(v1, list):
            assert len(v1) == len(v2)
            for a, b in zip(v1, v2, strict=True):
                if isinstance(a, dict):
                    assert_same_state(a, b)
                else:
                    assert a == b, k
        else:
            assert v1 == v2, k


def snapshot(opt):
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# ---------------------------------------------------------------------------------------------------
# Exception safety
# ---------------------------------------------------------------------------------------------------
def test_exception_inside_sampled_params_restores_weights(optimizer_name):
    model = make_mlp()
    opt, create_graph = build(optimizer_name, model)
    train(model, opt, 3, create_graph)
    before = params_of(model)
    with pytest.raises(KeyError, match="boom"), opt.sampled_params(train=True):
        assert not all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
        raise KeyError("boom")
    assert_same(params_of(model), before)
    with opt.sampled_params():  # still usable afterwards, not stuck "inside a sample"
        pass


def test_exception_in_closure_leaves_params_state_and_rng_unchanged(optimizer_name):
    model = make_mlp()
    opt, create_graph = build(
        optimizer_name, model, **({} if optimizer_name == "badam" else {"mc_samples": 2})
    )
    train(model, opt, 3, create_graph)
    before_params, before_state = params_of(model), snapshot(opt)
    x, y = regression_batch()
    calls = {"n": 0}

    def failing():
        calls["n"] += 1
        make_closure(model, opt, x, y, create_graph)()
        if calls["n"] == opt.mc_samples:  # fail on the last MC sample, after earlier ones accumulated
            raise RuntimeError("data loader died")
        return torch.tensor(0.0)

    with pytest.raises(RuntimeError, match="data loader died"):
        opt.step(failing)
    assert_same(params_of(model), before_params)
    assert_same_state(snapshot(opt), before_state)
    # and the next step is the one an untouched optimizer would have taken
    twin_model = make_mlp()
    twin_model.load_state_dict(model.state_dict())
    twin, _ = build(optimizer_name, twin_model, **({} if optimizer_name == "badam" else {"mc_samples": 2}))
    twin.load_state_dict(before_state)
    train(model, opt, 1, create_graph)
    train(twin_model, twin, 1, create_graph)
    assert_same(params_of(model), params_of(twin_model))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_gradient_raises_and_changes_nothing(optimizer_name, bad):
    model = make_mlp()
    opt, create_graph = build(optimizer_name, model)
    train(model, opt, 2, create_graph)
    before_params, before_state = params_of(model), snapshot(opt)
    x, y = regression_batch()
    x = x.clone()
    x[0, 0] = bad
    with pytest.raises(ngvi.NonFiniteGradientError, match="unchanged"):
        opt.step(make_closure(model, opt, x, y, create_graph))
    assert_same(params_of(model), before_params)
    assert_same_state(snapshot(opt), before_state)


def test_nonfinite_gradient_names_the_parameter():
    model = make_mlp()
    opt = ngvi.Vadam(model.parameters(), data_size=10)
    with opt.sampled_params(train=True):
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        model[2].bias.grad[0] = float("nan")
    with pytest.raises(
        ngvi.NonFiniteGradientError, match=r"param_groups\[0\]\['params'\]\[3\] \(shape \(1,\)\)"
    ):
        opt.step()


def test_skip_nonfinite_skips_and_counts(optimizer_name):
    model = make_mlp()
    opt, create_graph = build(optimizer_name, model, skip_nonfinite=True)
    before_params = params_of(model)
    x, y = regression_batch()
    x = x.clone()
    x[0, 0] = float("nan")
    loss = opt.step(make_closure(model, opt, x, y, create_graph))
    assert not torch.isfinite(loss)
    assert opt.skipped_steps == 1 and opt.num_steps == 0
    assert_same(params_of(model), before_params)
    assert opt.state_dict()["ngvi"]["skipped_steps"] == 1


# ---------------------------------------------------------------------------------------------------
# grad=None, resume, copying
# ---------------------------------------------------------------------------------------------------
class WithUnusedHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = make_mlp()
        self.unused = nn.Linear(3, 2).double()
        self.frozen = nn.Linear(3, 1).double().requires_grad_(False)

    def forward(self, x):
        return self.body(x)


def test_parameters_without_gradient_are_skipped(optimizer_name):
    model = WithUnusedHead()
    opt, create_graph = build(optimizer_name, model)
    unused_before = params_of(model.unused) + params_of(model.frozen)
    body_before = params_of(model.body)
    train(model.body, opt, 3, create_graph)
    assert_same(params_of(model.unused) + params_of(model.frozen), unused_before)
    assert not any(torch.equal(a, b) for a, b in zip(params_of(model.body), body_before, strict=True))
    assert all(opt.state[p].get("step", 0) == 0 for p in model.unused.parameters())
    assert opt.posterior().numel() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("mc_samples", [1, 3])
def test_resume_is_bit_identical(optimizer_name, mc_samples):
    kwargs = {} if optimizer_name == "badam" else {"mc_samples": mc_samples}
    model = make_mlp()
    opt, create_graph = build(optimizer_name, model, **kwargs)
    train(model, opt, 10, create_graph)
    straight = params_of(model)

    model = make_mlp()
    opt, _ = build(optimizer_name, model, **kwargs)
    train(model, opt, 5, create_graph)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    model2 = make_mlp(seed=123)  # different init: everything must come from the checkpoint
    opt2, _ = build(optimizer_name, model2, **kwargs, seed=999)
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    train(model2, opt2, 5, create_graph)
    assert_same(params_of(model2), straight)
    assert opt2.num_steps == 10


def test_deepcopy_and_pickle_continue_identically(optimizer_name):
    model = make_mlp()
    opt, create_graph = build(optimizer_name, model)
    train(model, opt, 3, create_graph)
    model_copy, opt_copy = copy.deepcopy((model, opt))
    model_pkl, opt_pkl = pickle.loads(pickle.dumps((model, opt)))
    for m, o in [(model, opt), (model_copy, opt_copy), (model_pkl, opt_pkl)]:
        train(m, o, 3, create_graph)
    assert_same(params_of(model_copy), params_of(model))
    assert_same(params_of(model_pkl), params_of(model))


def test_same_seed_same_run_and_global_seed_controls_default(optimizer_name):
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        model = make_mlp()
        opt, create_graph = build(optimizer_name, model)  # seed=None: drawn from torch's global RNG
        train(model, opt, 4, create_graph)
        runs.append(params_of(model))
    assert_same(runs[0], runs[1])


# ---------------------------------------------------------------------------------------------------
# Validation and call order
# ---------------------------------------------------------------------------------------------------
BAD_HYPERPARAMETERS = [
    (ngvi.Vadam, {"data_size": 10, "lr": -1.0}, "lr"),
    (ngvi.Vadam, {"data_size": 0}, "data_size"),
    (ngvi.Vadam, {"data_size": 10, "betas": (0.9, 1.0)}, r"betas\[1\]"),
    (ngvi.Vadam, {"data_size": 10, "betas": 0.9}, "betas"),
    (ngvi.Vadam, {"data_size": 10, "prior_prec": 0.0}, "prior_prec"),
    (ngvi.Vadam, {"data_size": 10, "prior_prec": 2.0, "init_prec": 1.0}, "init_prec"),
    (ngvi.Vadam, {"data_size": 10, "mc_samples": 0}, "mc_samples"),
    (ngvi.Vadam, {"data_size": 10, "lr": float("nan")}, "lr"),
    (ngvi.Vadam, {"data_size": "many"}, "data_size"),
    (ngvi.Vprop, {"data_size": 10, "beta": 1.5}, "beta"),
    (ngvi.VadaGrad, {"init_prec": 0.0}, "init_prec"),
    (ngvi.VadaGrad, {"beta": -0.1}, "beta"),
    (ngvi.VON, {"data_size": 10, "hessian": "exact"}, "hessian"),
    (ngvi.VON, {"data_size": 10, "beta": 2.0}, "beta"),
    (ngvi.IVON, {"data_size": 10, "hess_init": -1.0}, "hess_init"),
    (ngvi.IVON, {"data_size": 10, "clip_radius": 0.0}, "clip_radius"),
    (ngvi.IVON, {"data_size": 10, "weight_decay": -1e-4}, "weight_decay"),
    (ngvi.NoisyAdam, {"data_size": 10, "prior_var": 0.0}, "prior_var"),
    (ngvi.NoisyAdam, {"data_size": 10, "kl_weight": -1.0}, "kl_weight"),
    (ngvi.NoisyAdam, {"data_size": 10, "damping": -1.0}, "damping"),
    (ngvi.BAdam, {"data_size": 10, "eps": 0.0}, "eps"),
    (ngvi.Vadam, {"data_size": 10, "seed": 1.5}, "seed"),
]


@pytest.mark.parametrize(("cls", "kwargs", "name"), BAD_HYPERPARAMETERS)
def test_bad_hyperparameters_name_the_argument(cls, kwargs, name):
    with pytest.raises(ValueError, match=name):
        cls(make_mlp().parameters(), **kwargs)


def test_bad_hyperparameter_in_a_param_group_is_caught():
    model = make_mlp()
    with pytest.raises(ValueError, match="prior_prec"):
        ngvi.Vadam(
            [{"params": model[0].parameters(), "prior_prec": -1.0}, {"params": model[2].parameters()}], 10
        )


def test_wrong_call_order_gives_clear_errors():
    model = make_mlp()
    opt = ngvi.Vadam(model.parameters(), data_size=10)
    x, y = regression_batch()
    with pytest.raises(RuntimeError, match="pass a closure"):
        opt.step()
    with opt.sampled_params(), pytest.raises(RuntimeError, match="nested"), opt.sampled_params():
        pass
    with opt.sampled_params(), pytest.raises(RuntimeError, match="inside sampled_params"):
        opt.step(make_closure(model, opt, x, y))
    with opt.sampled_params(train=True):
        make_closure(model, opt, x, y)()
    with pytest.raises(RuntimeError, match="pending"):
        opt.step(make_closure(model, opt, x, y))
    with pytest.raises(RuntimeError, match="between steps"):
        opt.load_state_dict(opt.state_dict())
    opt.step()  # the manual form consumes the pending sample
    with pytest.raises(TypeError, match="must return the loss"):
        opt.step(lambda: "not a loss")


def test_manual_form_equals_closure_form():
    x, y = regression_batch()
    model_a, model_b = make_mlp(), make_mlp()
    opt_a = ngvi.Vadam(model_a.parameters(), 10, lr=0.01, init_prec=50.0, mc_samples=3, seed=4)
    opt_b = ngvi.Vadam(model_b.parameters(), 10, lr=0.01, init_prec=50.0, seed=4)
    for _ in range(4):
        opt_a.step(make_closure(model_a, opt_a, x, y))
        for _ in range(3):
            with opt_b.sampled_params(train=True):
                make_closure(model_b, opt_b, x, y)()
        opt_b.step()
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-15)


def test_badam_steps_without_closure_like_adam():
    x, y = regression_batch()
    model = make_mlp()
    opt = ngvi.BAdam(model.parameters(), 10, lr=0.01)
    opt.zero_grad()
    (0.5 * ((model(x) - y) ** 2).mean()).backward()
    before = params_of(model)
    opt.step()
    assert not torch.equal(params_of(model)[0], before[0])


# ---------------------------------------------------------------------------------------------------
# Parameter groups, schedulers, dtypes
# ---------------------------------------------------------------------------------------------------
def test_param_groups_have_their_own_lr_and_prior():
    model = make_mlp()
    opt = ngvi.Vadam(
        [
            {"params": model[0].parameters(), "lr": 0.0, "prior_prec": 4.0},
            {"params": model[2].parameters(), "prior_prec": 1.0},
        ],
        data_size=10,
        lr=0.05,
    )
    frozen = params_of(model[0])
    var_before = opt.posterior().variance
    assert torch.allclose(var_before[0], torch.full_like(var_before[0], 1 / 4.0))  # q₀ = prior of its group
    assert torch.allclose(var_before[2], torch.full_like(var_before[2], 1.0))
    train(model, opt, 5)
    assert_same(params_of(model[0]), frozen)  # lr = 0 in group 0
    assert not torch.equal(params_of(model[2])[0], var_before[2])


def test_lr_scheduler_drives_the_mean_update():
    model = make_mlp()
    opt = ngvi.Vadam(model.parameters(), data_size=10, lr=0.05, init_prec=50.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 1.0 if epoch < 2 else 0.0)
    x, y = regression_batch()
    for _ in range(2):
        opt.step(make_closure(model, opt, x, y))
        sched.step()
    assert opt.param_groups[0]["lr"] == 0.0
    frozen = params_of(model)
    opt.step(make_closure(model, opt, x, y))
    assert_same(params_of(model), frozen)
    assert opt.state[next(model.parameters())]["step"] == 3  # the state still advanced


def test_mixed_dtypes_in_one_optimizer(optimizer_name):
    torch.manual_seed(0)
    w32 = nn.Parameter(torch.randn(4, 3))
    w64 = nn.Parameter(torch.randn(3, dtype=torch.float64))
    opt, create_graph = build(optimizer_name, nn.ParameterList([w32, w64]))
    x = torch.randn(8, 4)

    def closure():
        opt.zero_grad()
        loss = ((x @ w32).double() @ w64).pow(2).mean()
        loss.backward(create_graph=create_graph)
        return loss

    for _ in range(3):
        opt.step(closure)
    for p in (w32, w64):
        for value in opt.state[p].values():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                assert value.dtype == p.dtype
        assert torch.isfinite(p).all()
    post = opt.posterior()
    assert [m.dtype for m in post.mean] == [torch.float32, torch.float64]


def test_posterior_inside_sampled_params_reports_the_mean():
    model = make_mlp()
    opt = ngvi.Vadam(model.parameters(), data_size=10, init_prec=20.0)
    mean = params_of(model)
    with opt.sampled_params():
        post = opt.posterior()
    assert_same(post.mean, mean)


def test_hutchinson_with_several_parameter_groups():
    """Groups share one double-backward graph and each takes its product z_g ⊙ (H_gg z_g) through it (an
    unbiased estimate of diag H like the full product). With a block-diagonal Hessian (two independent
    regressions) the per-group and the one-group estimates coincide, so the runs must agree exactly."""
    x, y = regression_batch()
    runs = []
    for split in (False, True):
        torch.manual_seed(0)
        left, right = nn.Linear(3, 1).double(), nn.Linear(3, 1).double()
        params = (
            [{"params": left.parameters()}, {"params": right.parameters()}]
            if split
            else [*left.parameters(), *right.parameters()]
        )
        opt = ngvi.VON(params, 64, lr=1e-2, beta=0.05, init_prec=50.0, hessian="hutchinson", seed=1)

        def closure(opt=opt, left=left, right=right):
            opt.zero_grad()
            loss = ((left(x) - y) ** 2).mean() + ((right(x) + y) ** 2).mean()
            loss.backward(create_graph=True)
            return loss

        for _ in range(3):
            opt.step(closure)
        runs.append(params_of(left) + params_of(right))
    assert_same(runs[0], runs[1])


def test_every_trainer_takes_the_uniform_backward():
    """`opt.backward(loss, output)` in the closure works for every trainer: VON's Hutchinson keeps the graph,
    the true-Fisher VOGN/NoisyKFAC sample targets, the rest call loss.backward(); each is a PosteriorOptimizer
    and its step equals that of the trainer's own closure form."""
    from ngvi.baselines import BBVI, MAP, MCDropout

    def mlp(dropout: bool = False) -> nn.Module:
        torch.manual_seed(0)
        drop = [nn.Dropout(0.1)] if dropout else []
        return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), *drop, nn.Linear(8, 1))

    x, y = torch.randn(32, 3), torch.randn(32, 1)
    trainers = {
        "vadam": (lambda m: ngvi.Vadam(m.parameters(), 32, seed=0), "loss"),
        "von_hutchinson": (lambda m: ngvi.VON(m.parameters(), 32, hessian="hutchinson", seed=0), "graph"),
        "vogn_fisher": (lambda m: ngvi.VOGN(m, 32, curvature="fisher", likelihood="gaussian", seed=0), "out"),
        "kfac_fisher": (
            lambda m: ngvi.NoisyKFAC(m, 32, curvature="fisher", likelihood="gaussian", seed=0),
            "out",
        ),
        "bbvi": (lambda m: BBVI(m, 32, seed=0), "loss"),
        "map": (lambda m: MAP(m, 32), "loss"),
        "mc_dropout": (lambda m: MCDropout(m, 32), "loss"),
    }
    for name, (factory, own_form) in trainers.items():
        finals = []
        for uniform in (True, False):
            model = mlp(dropout=name == "mc_dropout")
            opt = factory(model)
            assert isinstance(opt, ngvi.PosteriorOptimizer), name

            def closure(opt=opt, model=model, uniform=uniform, own_form=own_form):
                opt.zero_grad()
                out = model(x)
                loss = 0.5 * ((out - y) ** 2).mean()
                if uniform:
                    opt.backward(loss, out)
                elif own_form == "out":
                    return loss, out
                else:
                    loss.backward(create_graph=own_form == "graph")
                return loss

            torch.manual_seed(1)
            for _ in range(3):
                opt.step(closure)
            finals.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        assert torch.equal(finals[0], finals[1]), name
