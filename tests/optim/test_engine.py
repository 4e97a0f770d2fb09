"""The engine's behaviour beyond the guarantees every trainer shares (tests/optim/test_guarantees.py): what a
non-finite gradient's message names, call order, per-group priors, schedulers, Hutchinson across groups."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ngvi
from conftest import make_mlp, regression_batch
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
