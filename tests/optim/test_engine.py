"""The engine beyond the guarantees every trainer shares (tests/optim/test_guarantees.py): what a non-finite
gradient's message names, call order, per-group priors, schedulers, Hutchinson across groups; its parts on
their own (the sample accumulator, sample-scope plugins); and its vocabulary (renamed keywords, aliases).
The noise source is tested in test_noise.py."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import ngvi
from conftest import make_mlp, regression_batch
from ngvi.optim.engine.accumulator import SampleAccumulator
from optimizer_db import BY_NAME, assert_same, params_of

pytestmark = pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")


VADAM = BY_NAME["vadam"]  # closures and training loops of the regression problem


# ---------------------------------------------------------------------------------------------------
# Non-finite gradients, validation and call order
# ---------------------------------------------------------------------------------------------------
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
        opt.step(VADAM.closure(opt, model, x, y))
    with opt.sampled_params(train=True):
        VADAM.closure(opt, model, x, y)()
    with pytest.raises(RuntimeError, match="pending"):
        opt.step(VADAM.closure(opt, model, x, y))
    with pytest.raises(RuntimeError, match="between steps"):
        opt.load_state_dict(opt.state_dict())
    opt.step()  # the manual form consumes the pending sample
    with pytest.raises(TypeError, match="must return the loss"):
        opt.step(lambda: "not a loss")


# ---------------------------------------------------------------------------------------------------
# Parameter groups and schedulers
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
        init_prec=None,  # q₀ = the prior of each group
    )
    frozen = params_of(model[0])
    var_before = opt.posterior().variance
    assert torch.allclose(var_before[0], torch.full_like(var_before[0], 1 / 4.0))  # q₀ = prior of its group
    assert torch.allclose(var_before[2], torch.full_like(var_before[2], 1.0))
    VADAM.train(model, opt, 5)
    assert_same(params_of(model[0]), frozen)  # lr = 0 in group 0
    assert not torch.equal(params_of(model[2])[0], var_before[2])


def test_lr_scheduler_drives_the_mean_update():
    model = make_mlp()
    opt = ngvi.Vadam(model.parameters(), data_size=10, lr=0.05, init_prec=50.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 1.0 if epoch < 2 else 0.0)
    x, y = regression_batch()
    for _ in range(2):
        opt.step(VADAM.closure(opt, model, x, y))
        sched.step()
    assert opt.param_groups[0]["lr"] == 0.0
    frozen = params_of(model)
    opt.step(VADAM.closure(opt, model, x, y))
    assert_same(params_of(model), frozen)
    assert opt.state[next(model.parameters())]["step"] == 3  # the state still advanced


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
        opt = ngvi.VON(params, 64, lr=1e-2, beta=0.05, init_prec=50.0, curvature="hutchinson", seed=1)

        def closure(opt=opt, left=left, right=right):
            opt.zero_grad()
            loss = ((left(x) - y) ** 2).mean() + ((right(x) + y) ** 2).mean()
            loss.backward(create_graph=True)
            return loss

        for _ in range(3):
            opt.step(closure)
        runs.append(params_of(left) + params_of(right))
    assert_same(runs[0], runs[1])


# ---------------------------------------------------------------------------------------------------
# The sample accumulator
# ---------------------------------------------------------------------------------------------------
class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2))


def test_accumulator_means_are_the_sample_means():
    model = _Model()
    opt = ngvi.Vadam(model.parameters(), 10, seed=0)
    acc = SampleAccumulator()
    grads = [torch.randn(3), torch.randn(3), torch.randn(3)]
    for g in grads:
        model.a.grad, model.b.grad = g.clone(), None  # b has no gradient: it is not accumulated
        acc.add_sample(opt, keep_grad_refs=False)
    (sums,) = acc.sums(opt.param_groups)
    assert sums.params == [model.a] and acc.count == 3
    acc.mean_([sums])
    torch.testing.assert_close(sums.grads[0], torch.stack(grads).mean(0), rtol=0, atol=1e-6)
    torch.testing.assert_close(sums.curvs[0], torch.stack(grads).square().mean(0), rtol=0, atol=1e-6)


def test_accumulator_keeps_the_first_gradient_by_reference_only_when_asked():
    model = _Model()
    opt = ngvi.Vadam(model.parameters(), 10, seed=0, flat=False)  # the per-tensor path (flat: a copy)
    for keep in (True, False):
        acc = SampleAccumulator()
        model.a.grad, model.b.grad = torch.ones(3), torch.ones(2)
        acc.add_sample(opt, keep_grad_refs=keep)
        assert (acc.grads[model.a].data_ptr() == model.a.grad.data_ptr()) == keep  # a view of p.grad


def test_accumulator_names_the_nonfinite_parameter():
    model = _Model()
    opt = ngvi.Vadam(model.parameters(), 10, seed=0)
    acc = SampleAccumulator()
    model.a.grad, model.b.grad = torch.ones(3), torch.tensor([1.0, float("inf")])
    acc.add_sample(opt, keep_grad_refs=False)
    sums = acc.sums(opt.param_groups)
    assert not acc.all_finite(sums, torch.tensor(1.0))
    assert acc.nonfinite_places(sums, opt.param_groups) == ["param_groups[0]['params'][1] (shape (2,))"]


# ---------------------------------------------------------------------------------------------------
# Plugins
# ---------------------------------------------------------------------------------------------------
class Recorder:
    """A sample-scope plugin that records what it sees."""

    def __init__(self, model: nn.Module, opt_ref: list):
        self.model, self.opt_ref, self.events = model, opt_ref, []

    @contextlib.contextmanager
    def scope(self, *, train: bool):
        weight = self.model.weight.detach().clone()
        mean = self.opt_ref[0].mean_of(self.model.weight).clone()
        self.events.append(("enter", train, not torch.equal(weight, mean)))  # entered after the draw
        try:
            yield
        finally:
            pending = self.opt_ref[0].accumulator.count
            self.events.append(("exit", pending))


def test_plugins_are_entered_after_the_draw_and_left_after_accumulation():
    model = nn.Linear(3, 1)
    ref: list = []
    recorder = Recorder(model, ref)
    opt = ngvi.Vadam(model.parameters(), 10, init_prec=20.0, mc_samples=2, seed=0)
    opt.plugins = (*opt.plugins, recorder)
    ref.append(opt)
    x = torch.randn(4, 3)

    def closure():
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        return loss

    opt.step(closure)
    with opt.sampled_params():
        pass
    # two training samples (each sample is accumulated before the plugin exits), then one prediction
    assert recorder.events == [("enter", True, True), ("exit", 1), ("enter", True, True), ("exit", 2),
                               ("enter", False, True), ("exit", 0)]  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# The vocabulary
# ---------------------------------------------------------------------------------------------------
def test_old_keyword_spellings_warn_and_keep_working():
    model = nn.Linear(2, 1)
    with pytest.warns(DeprecationWarning, match="hessian= is deprecated"):
        opt = ngvi.VON(model.parameters(), 10, hessian="hutchinson")
    assert opt.curvature == "hutchinson" and opt.hessian == "hutchinson"
    with pytest.raises(ValueError, match="not both"):
        ngvi.VON(model.parameters(), 10, curvature="price", hessian="price")
    with pytest.raises(ValueError, match=r"beta=0\.001"):  # the old decay meaning of Vprop's beta
        ngvi.Vprop(model.parameters(), 10, beta=0.999)


def test_vocabulary_aliases_are_the_same_optimizer():
    """prior_prec everywhere: NoisyAdam's prior_var = 1/prior_prec, IVON's weight_decay = prior_prec/N
    (values chosen exactly representable, so the trajectories agree bitwise)."""
    x = torch.randn(8, 2)

    def run(make):
        torch.manual_seed(0)
        model = nn.Linear(2, 1)
        opt = make(model)

        def closure():
            opt.zero_grad()
            loss = model(x).square().mean()
            opt.backward(loss)
            return loss

        for _ in range(3):
            opt.step(closure)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    pairs = [
        (lambda m: ngvi.NoisyAdam(m.parameters(), 16, prior_var=0.25, seed=0),
         lambda m: ngvi.NoisyAdam(m.parameters(), 16, prior_prec=4.0, seed=0)),
        (lambda m: ngvi.NoisyKFAC(m, 16, prior_var=0.5, seed=0),
         lambda m: ngvi.NoisyKFAC(m, 16, prior_prec=2.0, seed=0)),
        (lambda m: ngvi.IVON(m.parameters(), 16, weight_decay=0.125, seed=0),
         lambda m: ngvi.IVON(m.parameters(), 16, prior_prec=2.0, seed=0)),
    ]  # fmt: skip
    for paper_name, shared_name in pairs:
        assert torch.equal(run(paper_name), run(shared_name))


def test_every_optimizer_accepts_the_shared_vocabulary():
    model = nn.Linear(2, 1)
    for make in (
        lambda: ngvi.Vadam(model.parameters(), 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.Vprop(model.parameters(), 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.VON(model.parameters(), 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.IVON(model.parameters(), 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.NoisyAdam(model.parameters(), 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.BAdam(model.parameters(), 8, prior_prec=2.0, mc_samples=1),
        lambda: ngvi.VadaGrad(model.parameters(), data_size=8, prior_prec=0.0, mc_samples=2),
        lambda: ngvi.VOGN(model, 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.NoisyKFAC(model, 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.baselines.BBVI(model, 8, prior_prec=2.0, mc_samples=2),
        lambda: ngvi.baselines.MAP(model, 8, prior_prec=2.0, mc_samples=1),
    ):
        assert isinstance(make(), ngvi.PosteriorOptimizer)


@pytest.mark.parametrize("name", ["Vadam", "IVON", "VON", "BAdam"])
def test_init_state_creates_what_the_first_step_would_and_changes_nothing_else(name):
    """``init_state()`` (what ``torch.distributed.checkpoint.load`` needs of a fresh optimizer): every
    trainable parameter gets its state; the steps that follow are bitwise those without it."""
    runs = []
    for init in (False, True):
        model = _Model()
        opt = getattr(ngvi, name)(model.parameters(), 10, seed=0)
        if init:
            opt.init_state()
            assert set(opt.state_dict()["state"]) == {0, 1} and opt.num_steps == 0
        for _ in range(3):

            def closure(model=model, opt=opt):
                opt.zero_grad()
                loss = (model.a.sum() - 1) ** 2 + model.b.square().sum()
                loss.backward()
                return loss

            opt.step(closure)
        runs.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))
