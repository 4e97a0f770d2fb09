"""DeepEnsemble: K MAP networks from independent inits, behind the trainers' step/sampled_params protocol."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import ngvi
from ngvi.baselines import MAP, DeepEnsemble
from ngvi.experiments.core import METHODS, training
from optimizer_db import assert_same, params_of, saved

N = 64


def _mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)).double()


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 3, generator=g, dtype=torch.float64)
    return x, x.sum(1, keepdim=True).sin()


def _closure(opt, model, x, y):
    def closure():
        opt.zero_grad()
        out = model(x)
        loss = 0.5 * (out - y).square().mean()
        if isinstance(opt, DeepEnsemble):
            opt.backward(loss, out)  # the trainers' uniform backward
        else:
            loss.backward()  # the plain torch.optim.Adam reference
        return loss

    return closure


def _train(ens, model, steps, first_batch=0):
    return [ens.step(_closure(ens, model, *_batch(first_batch + t))) for t in range(steps)]


def _all_weights(ens):
    return [ens.member_weights(k) for k in range(ens.members)]


def _differ(a, b):
    return not all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


def test_members_differ_after_init_and_after_training_and_member_0_keeps_the_model():
    model = _mlp()
    init = params_of(model)
    ens = DeepEnsemble(model, N, members=3, lr=1e-2, seed=0)
    start = _all_weights(ens)
    assert_same(start[0], init)
    assert_same(params_of(model), init)  # the model holds member 0
    assert _differ(start[1], start[0]) and _differ(start[2], start[0]) and _differ(start[1], start[2])
    _train(ens, model, 5)
    end = _all_weights(ens)
    assert all(_differ(end[k], start[k]) for k in range(3))
    assert _differ(end[1], end[0]) and _differ(end[2], end[1])
    assert_same(params_of(model), end[0])


def test_each_member_is_a_plain_adam_map_run_bitwise():
    """Member k's trajectory is torch.optim.Adam(weight_decay=λ/N) from its init on the same batches."""
    model = _mlp()
    ens = DeepEnsemble(model, N, members=3, lr=1e-2, prior_prec=5.0, seed=3)
    inits = _all_weights(ens)
    losses = _train(ens, model, 4)
    member_losses = []
    for k in range(3):
        ref = _mlp()
        with torch.no_grad():
            for p, w in zip(ref.parameters(), inits[k], strict=True):
                p.copy_(w)
        adam = torch.optim.Adam(ref.parameters(), lr=1e-2, weight_decay=5.0 / N)
        member_losses.append([adam.step(_closure(adam, ref, *_batch(t))) for t in range(4)])
        assert_same(ens.member_weights(k), params_of(ref))
    for t, loss in enumerate(losses):  # the step's loss is the members' mean
        assert_same(loss, torch.stack([member_losses[k][t].detach() for k in range(3)]).mean())


def test_a_seed_reproduces_the_inits_and_leaves_the_global_rng_alone():
    torch.manual_seed(7)
    state = torch.get_rng_state()
    a = _all_weights(DeepEnsemble(_mlp(), N, members=3, seed=11))
    b = _all_weights(DeepEnsemble(_mlp(), N, members=3, seed=11))
    c = _all_weights(DeepEnsemble(_mlp(), N, members=3, seed=12))
    assert_same(a, b) and _differ(a[1], c[1])
    torch.manual_seed(7)
    assert torch.equal(state, torch.get_rng_state())


@pytest.mark.parametrize("vectorize", [False, True])
def test_predict_cycles_through_the_members(vectorize):
    """S = K·m samples use every member exactly m times, in turn (vectorize=True takes the same loop)."""
    model = _mlp()
    ens = DeepEnsemble(model, N, members=3, lr=1e-2, seed=0)
    _train(ens, model, 2)
    x, _ = _batch(99)
    per_member = []
    for k in range(3):
        with ens.member(k):
            per_member.append(model(x).detach())
    out = ngvi.predict(model, ens, x, samples=6, vectorize=vectorize)
    assert_same(out, torch.stack(per_member * 2))
    assert_same(ngvi.predict(model, ens, x, samples=0)[0], per_member[0])  # the model holds member 0
    ngvi.predict(model, ens, x, samples=1)  # the cycle carries on from where it stopped
    assert_same(ngvi.predict(model, ens, x, samples=3), torch.stack(per_member[1:] + per_member[:1]))


def test_predictive_sd_grows_away_from_the_data():
    """1-D regression on x ∈ [−1, 1]: the ensemble's s.d. at |x| = 4 is at least 3× its mean s.d. inside
    the data (averaged over 3 seeds; measured ≈ 20-40× with these settings)."""
    ratios = []
    for seed in range(3):
        g = torch.Generator().manual_seed(100 + seed)
        x = torch.rand(N, 1, generator=g) * 2 - 1
        y = torch.sin(3 * x) + 0.1 * torch.randn(N, 1, generator=g)
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(1, 32), nn.ReLU(), nn.Linear(32, 1))
        ens = DeepEnsemble(model, N, members=4, lr=3e-2, seed=seed)
        closure = _closure(ens, model, x, y)
        for _ in range(60):
            ens.step(closure)
        grid = torch.cat([torch.tensor([[-4.0], [4.0]]), torch.linspace(-1, 1, 21)[:, None]])
        sd = ngvi.predict(model, ens, grid, samples=4).std(0).squeeze(-1)
        ratios.append(sd[:2].mean() / sd[2:].mean())
    assert float(torch.stack(ratios).mean()) >= 3.0, ratios


def test_state_dict_round_trip_resumes_bitwise():
    runs = []
    for resume in (False, True):
        model = _mlp()
        ens = DeepEnsemble(model, N, members=3, lr=1e-2, seed=0)
        _train(ens, model, 3)
        ngvi.predict(model, ens, _batch(99)[0], samples=2)  # the cycle's position is state too
        if resume:
            state = saved(ens.state_dict())
            model = _mlp(5)
            ens = DeepEnsemble(model, N, members=3, lr=1e-2, seed=9)
            ens.load_state_dict(state)
            assert ens.num_steps == 3
        _train(ens, model, 3, first_batch=3)
        runs.append((_all_weights(ens), params_of(model), ngvi.predict(model, ens, _batch(99)[0], samples=4)))
    assert_same(runs[0], runs[1])


def test_foreign_or_mismatched_state_is_refused_in_one_line_and_changes_nothing():
    model = _mlp()
    ens = DeepEnsemble(model, N, members=3, seed=0)
    before = _all_weights(ens)
    other = DeepEnsemble(_mlp(), N, members=2, seed=0).state_dict()
    wide = DeepEnsemble(nn.Sequential(nn.Linear(3, 9), nn.Tanh(), nn.Linear(9, 1)).double(), N, members=3)
    cases = [
        (MAP(_mlp(), N).state_dict(), "not a DeepEnsemble state_dict"),
        ("weights", "not a DeepEnsemble state_dict"),
        (other, "the state has 2 members, this DeepEnsemble 3; build it with members=2"),
        (wide.state_dict(), "member 0's weights in the state have shapes"),
    ]
    for state, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            ens.load_state_dict(state)
        assert "\n" not in str(err.value)
    assert_same(_all_weights(ens), before)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"members": 0}, ValueError, "members must be a positive int, got 0"),
        ({"members": 2.5}, ValueError, "members must be a positive int, got 2.5"),
        ({"mc_samples": 2}, ValueError, "point estimates: mc_samples must be 1, got 2"),
        ({"lr": -1.0}, ValueError, "lr must be >= 0, got -1.0"),
        ({"prior_prec": -1.0}, ValueError, "prior_prec must be >= 0, got -1.0"),
        ({"data_size": 0}, ValueError, "data_size must be a positive int"),
        ({"seed": -1}, ValueError, r"seed must be an int in \[0, 2\*\*63\) or None, got -1"),
        ({"init": 3}, TypeError, "init must be a callable init"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(kwargs, error, message):
    with pytest.raises(error, match=message) as err:
        DeepEnsemble(_mlp(), **{"data_size": N, **kwargs})
    assert "\n" not in str(err.value)


def test_models_it_cannot_reinitialise_are_refused_in_one_line():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.w

    with pytest.raises(TypeError, match=r"takes the model \(an nn.Module\)"):
        DeepEnsemble(_mlp().parameters(), N)
    with pytest.raises(ValueError, match=r"\['0.w'\] belong to modules without one.*pass init=fn") as err:
        DeepEnsemble(nn.Sequential(Scale(), nn.Linear(3, 1)), N)
    with pytest.raises(ValueError, match="member 1's initial weights equal member 0's") as err2:
        DeepEnsemble(nn.Sequential(nn.LayerNorm(3)), N, members=2)
    assert "\n" not in str(err.value) + str(err2.value)
    ens = DeepEnsemble(nn.Sequential(Scale()), N, members=2, init=lambda m: m[0].w.normal_(), seed=0)
    assert _differ(ens.member_weights(0), ens.member_weights(1))


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        ("nan_grad", ngvi.NonFiniteGradientError, "member 1 has a non-finite gradient in the loss, 0.weight"),
        ("no_backward", RuntimeError, "member 1's closure left no gradient"),
        ("raises", KeyError, "boom"),
    ],
)
def test_a_failing_member_changes_no_member(bad, error, message):
    """Member 1's closure fails: member 0 (whose closure ran fine) does not move either."""
    model = _mlp()
    ens = DeepEnsemble(model, N, members=3, lr=1e-2, seed=0)
    _train(ens, model, 1)
    before, state = _all_weights(ens), saved(ens.state_dict())
    x, y = _batch(5)
    calls = []

    def closure():
        calls.append(1)
        ens.zero_grad()
        loss = 0.5 * (model(x) - y).square().mean()
        if len(calls) == 2:
            if bad == "raises":
                raise KeyError("boom")
            if bad == "nan_grad":
                loss = loss * float("nan")
            else:
                return loss
        loss.backward()
        return loss

    with pytest.raises(error, match=message):
        ens.step(closure)
    assert_same(_all_weights(ens), before)
    assert_same(saved(ens.state_dict()), state)
    assert_same(params_of(model), before[0])
    assert all(p.grad is None for p in model.parameters())


def test_protocol_odds_and_ends():
    model = _mlp()
    ens = DeepEnsemble(model, N, members=2, seed=0)
    assert isinstance(ens, ngvi.PosteriorOptimizer)
    with pytest.raises(NotImplementedError, match="uniform mixture of its members"):
        ens.posterior()
    with pytest.raises(RuntimeError, match="needs a closure"):
        ens.step()
    ens.begin_sample()
    assert_same(params_of(model), ens.member_weights(0))
    ens.end_sample()
    ens.begin_sample()
    assert_same(params_of(model), ens.member_weights(1))
    with pytest.raises(RuntimeError, match="end_sample"):
        ens.state_dict()
    ens.end_sample()
    assert_same(params_of(model), ens.member_weights(0))
    with pytest.raises(ValueError, match=r"member must be an int in \[0, 2\), got 2"):
        ens.member_weights(2)
    ens.param_groups[0]["lr"] = 0.0  # a schedule sets member 0's groups; every member follows
    before = _all_weights(ens)
    _train(ens, model, 2)
    assert_same(_all_weights(ens), before)
    assert ens.diagnostics().steps == 2 and ens.num_steps == 2


def test_the_harness_builds_trains_and_evaluates_it():
    """The registry's "deep_ensemble", the experiments' closure (opt.backward) and evaluate_classifier."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 3))
    ens = METHODS["deep_ensemble"].build(model, N, lr=1e-2, prior_prec=1.0, seed=0, members=3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, 2, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    losses = training.train(model, ens, x, y, nn.functional.cross_entropy, epochs=30)
    assert losses[-1] < losses[0]
    result = ngvi.evaluate_classifier(model, ens, x, y, samples=3)
    assert result.bma["accuracy"] > 0.7
    members = []
    for k in range(3):
        with ens.member(k):
            members.append(torch.softmax(model(x).double(), -1))
    torch.testing.assert_close(result.probs_bma, torch.stack(members).mean(0))  # the members' mixture


def test_frozen_parameters_and_buffers_are_shared_and_kept():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)).double()
    model[0].requires_grad_(False)
    with torch.no_grad():
        model[1].running_mean.fill_(0.5)
    frozen, state = params_of(model[0]), {k: v.clone() for k, v in model.state_dict().items()}
    ens = DeepEnsemble(model, N, members=3, seed=0)
    assert_same({k: v.clone() for k, v in model.state_dict().items()}, state)  # init put everything back
    trainable = [p.shape for p in model.parameters() if p.requires_grad]
    assert [w.shape for w in ens.member_weights(1)] == trainable
    _train(ens, model, 2)
    assert_same(params_of(model[0]), frozen)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_of_model_and_ensemble_continue_identically(how):
    model = _mlp()
    ens = DeepEnsemble(model, N, members=3, lr=1e-2, seed=0)
    _train(ens, model, 2)
    twin_model, twin = (
        copy.deepcopy((model, ens)) if how == "deepcopy" else pickle.loads(pickle.dumps((model, ens)))
    )
    _train(ens, model, 2, first_batch=2)
    _train(twin, twin_model, 2, first_batch=2)
    assert_same(_all_weights(twin), _all_weights(ens))
    assert_same(params_of(twin_model), params_of(model))
