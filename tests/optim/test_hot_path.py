"""The engine's fast paths give bitwise the results of the plain ones they replace."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ngvi
from ngvi._tensorlist import TensorList
from ngvi.optim.engine.perturbation import slices
from optimizer_db import BY_NAME, trainers


def wide_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)  # several parameters of different sizes, so that the slices differ from the group
    return nn.Sequential(nn.Linear(3, 40), nn.Tanh(), nn.Linear(40, 40), nn.Tanh(), nn.Linear(40, 1)).double()


def plain(opt):
    """The same optimizer, forced onto the plain paths: generic _perturb (or the rule's own, VOGN's), the
    whole-group _update."""
    draw = ngvi.VariationalOptimizer._perturb if type(opt)._diagonal_perturb else type(opt)._perturb

    class Plain(type(opt)):
        elementwise = False

        def _perturb(self, group, params, noise, states):
            return draw(self, group, params, noise, states)

        def _update(self, group, means, grads, curvs, states):
            assert len(means) == len(self.accumulator.params(group))
            return super()._update(group, means, grads, curvs, states)

    return Plain


@pytest.mark.parametrize("info", trainers(lambda info: info.engine and info.cls._elementwise))
def test_fused_perturbation_and_slices_are_bitwise_the_plain_engine(info):
    runs = []
    for force_plain in (False, True):
        model = info.model() if info.takes_model else wide_mlp()  # VOGN hooks its problem's layers
        # the per-tensor path (flat=False): the flat one is checked against it in test_flat.py
        opt = info.build(model, seed=3, flat=False, **({"mc_samples": 2} if info.mc_samples else {}))
        if force_plain:
            opt.__class__ = plain(opt)
            assert not opt._elementwise
        else:
            assert len(slices(list(model.parameters()), opt._elementwise)) > 1
        info.train(model, opt, 4)
        with opt.sampled_params():
            sample = [p.detach().clone() for p in model.parameters()]
        runs.append([p.detach().clone() for p in model.parameters()] + sample)
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_only_cpu_groups_are_sliced():
    params = [torch.zeros(10), torch.zeros(20), torch.zeros(5)]
    assert slices(params, True) == [slice(0, 1), slice(1, 2), slice(2, 3)]
    assert slices(params, False) == [slice(0, 3)]
    meta = [t.to("meta") for t in params]  # any device but the CPU: one slice, as torch.optim's foreach
    assert slices(meta, True) == [slice(0, 3)]


def test_elementwise_is_not_inherited_by_an_overriding_update():
    class GroupWide(ngvi.Vadam):
        def _update(self, group, means, grads, curvs, states):
            assert len(means) == len(group["params"])  # sees the whole group
            super()._update(group, means, grads, curvs, states)

    model = wide_mlp()
    opt = GroupWide(model.parameters(), 64, init_prec=50.0)
    assert ngvi.Vadam(model.parameters(), 64)._elementwise and not opt._elementwise
    BY_NAME["vadam"].train(model, opt, 2)


def test_finiteness_check_accepts_huge_values_and_rejects_nan_and_inf():
    big = torch.full((1000,), 1e30)  # its float32 2-norm overflows, the values are finite
    assert TensorList([big, torch.ones(3, dtype=torch.float64)]).all_finite()
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = big.clone()
        t[17] = bad
        assert not TensorList([torch.ones(2), t]).all_finite()
    assert TensorList([]).all_finite() and TensorList([torch.empty(0)]).all_finite()
    both = torch.ones(5)
    both[1], both[3] = float("inf"), -float("inf")  # a sum of +Inf and −Inf is NaN: still refused
    assert not TensorList([both]).all_finite()
    huge = torch.full((1000,), 1e30, dtype=torch.bfloat16)
    assert TensorList([huge]).all_finite()


def test_finiteness_check_on_cpu_does_not_square_into_subnormals():
    """Squared gradients of ~1e-24 square into subnormals (~20× slower on x86), so the CPU check must not
    take a 2-norm; the decision itself is checked above."""
    from torch.profiler import ProfilerActivity, profile

    tiny = [torch.full((4096,), 1e-24), torch.full((7,), 3e-20)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert TensorList(tiny).all_finite()
    ops = {e.key for e in prof.key_averages()}
    assert not ops & {"aten::linalg_vector_norm", "aten::_foreach_norm", "aten::norm", "aten::pow"}
