"""The device path of the finiteness contract (ngvi.optim.engine.device_check), checked on the CPU.

CI has no GPU, so the properties that matter there are checked here with ``finite_check="device"``
(opt-in: the module's docstring says why it is not yet the default on a GPU): no value is read back to the
host during a step (counted with a TorchDispatchMode: ``aten._local_scalar_dense``, ``item``,
``is_nonzero``, ``nonzero``), the trajectories are bitwise those of the host path when every value is
finite, and a non-finite step changes nothing.
"""

from __future__ import annotations

import pytest
import torch

import ngvi
from host_reads import OpCounter
from ngvi.optim.engine.device_check import FEW, masked, nonfinite_flags, use_device_check
from ngvi.optim.kronecker import KroneckerFamily
from optimizer_db import TRAINERS, assert_same, params_of, trainers

MASKABLE = [info for info in TRAINERS if info.engine and info.cls._maskable_update]


def device_path(info, model, **overrides):
    return info.build(model, finite_check="device", **overrides)


@pytest.mark.parametrize("info", trainers(lambda i: i in MASKABLE and not issubclass(i.cls, KroneckerFamily)))
def test_a_steady_step_reads_nothing_back(info):
    """0 host reads per step for every rule the device path covers (the diagonal rules, VOGN, BBVI, ...),
    as entered in the test database, after the first steps (whose diagnostics read the state once). The
    K-FAC family reads once at each inversion and nowhere else: tests/optim/test_kfac_host_reads.py."""
    model = info.model(dtype=torch.float32)
    opt = device_path(info, model)
    x, y = info.batch(dtype=torch.float32)
    closure = info.closure(opt, model, x, y)
    for _ in range(2):
        opt.step(closure)
    with OpCounter() as counter:
        for _ in range(3):
            opt.step(closure)
    assert counter.syncs == {}, counter.syncs


@pytest.mark.parametrize("name", ["Vadam", "Vprop", "VON", "IVON", "NoisyAdam", "VadaGrad", "BAdam"])
def test_defaults_read_nothing_back(name):
    """Each diagonal rule with its defaults (only data_size given)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    cls = getattr(ngvi, name)
    kwargs = {} if name == "VadaGrad" else {"data_size": 100}
    opt = cls(model.parameters(), finite_check="device", **kwargs)

    def closure():
        opt.zero_grad()
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        opt.backward(loss, out)
        return loss

    for _ in range(2):
        opt.step(closure)
    with OpCounter() as counter:
        loss = opt.step(closure)
    assert counter.syncs == {}
    assert isinstance(loss, torch.Tensor)  # the closure's loss stays a tensor


def test_the_host_path_reads_once_per_step():
    """The counter itself works: the host path (the CPU default) reads the finiteness flag back."""
    info = next(i for i in TRAINERS if i.name == "vadam")
    model = info.model(dtype=torch.float32)
    opt = info.build(model)
    x, y = info.batch(dtype=torch.float32)
    closure = info.closure(opt, model, x, y)
    opt.step(closure)
    with OpCounter() as counter:
        opt.step(closure)
    assert counter.syncs.get("aten._local_scalar_dense") == 1


@pytest.mark.parametrize("info", trainers(lambda i: i in MASKABLE))
def test_device_path_is_bitwise_the_host_path(info):
    """With every value finite the mask selects the update's own result: the same bits as the host path."""
    runs = []
    for check in ("host", "device"):
        model = info.model()
        opt = info.build(model, finite_check=check)
        losses = info.train(model, opt, steps=4)
        runs.append((params_of(model), opt.state_dict()["state"], losses))
    assert_same(runs[0], runs[1])


def test_the_golden_cases_are_bitwise_on_the_device_path(monkeypatch):
    """The pinned golden configurations, stepped through the device path, give the host path's digests."""
    import golden.trajectories as golden

    cases = [n for n, (factory, _) in golden.CASES.items() if n not in ("map", "mc_dropout")]
    cases = [n for n in cases if "kfac" not in n]
    host = {n: golden.run_case(n, "linear")["digests"] for n in cases}
    for name in cases:
        factory, style = golden.CASES[name]

        def on_device(m, k, factory=factory):
            opt = factory(m, k)
            opt.finite_check = "device"
            return opt

        monkeypatch.setitem(golden.CASES, name, (on_device, style))
    for name in cases:
        assert golden.run_case(name, "linear")["digests"] == host[name], name


def nan_closure(opt, model, x, y, poison):
    def closure():
        opt.zero_grad()
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y) * (float("nan") if poison else 1.0)
        loss.backward()
        return loss

    return closure


def problem():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    return model, torch.randn(8, 3), torch.randn(8, 1)


@pytest.mark.parametrize("name", ["Vadam", "IVON", "VON"])
def test_a_nan_step_changes_nothing_and_is_counted(name):
    model, x, y = problem()
    opt = getattr(ngvi, name)(model.parameters(), data_size=50, finite_check="device", skip_nonfinite=True)
    opt.step(nan_closure(opt, model, x, y, poison=False))
    before = (params_of(model), {k: dict(v) for k, v in opt.state_dict()["state"].items()})
    steps = opt.num_steps
    opt.step(nan_closure(opt, model, x, y, poison=True))
    after = (params_of(model), {k: dict(v) for k, v in opt.state_dict()["state"].items()})
    # state_dict() read the flags: the masked step is counted; it still advanced the step clock
    assert opt.skipped_steps == 1 and opt.num_steps == steps + 1
    for entry in (*before[1].values(), *after[1].values()):  # the clock (t, Vadam's start weight) moved
        entry.pop("step"), entry.pop("start_weight", None)
    assert_same(before, after)
    opt.step(nan_closure(opt, model, x, y, poison=False))  # training goes on
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_the_error_comes_at_the_next_step_and_names_the_parameter():
    model, x, y = problem()
    opt = ngvi.IVON(model.parameters(), data_size=50, finite_check="device")
    opt.step(nan_closure(opt, model, x, y, poison=False))

    def closure():  # a NaN only in the last layer's bias gradient
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        model[2].bias.grad.fill_(float("nan"))
        return loss

    mean = params_of(model)
    opt.step(closure)  # no error yet: the host has not read the flag
    assert_same(params_of(model), mean)  # masked
    with pytest.raises(
        ngvi.NonFiniteGradientError, match=r"step 2 .*param_groups\[0\]\['params'\]\[3\] \(shape \(1,\)\)"
    ):
        opt.step(nan_closure(opt, model, x, y, poison=False))
    assert_same(params_of(model), mean)  # the step that raised did not run
    opt.step(nan_closure(opt, model, x, y, poison=False))  # reported once; training can go on


@pytest.mark.parametrize("where", ["state_dict", "diagnostics", "posterior", "check_finite"])
def test_reading_the_optimizer_waits_for_the_flags(where):
    model, x, y = problem()
    opt = ngvi.Vadam(model.parameters(), data_size=50, finite_check="device")
    opt.step(nan_closure(opt, model, x, y, poison=True))
    with pytest.raises(ngvi.NonFiniteGradientError, match="masked on the device"):
        getattr(opt, where)()


def test_a_deferred_error_leaves_no_sample_behind_and_counts_no_skip():
    """Issue 42, item 3. The manual form: step N's error comes at step N+1's ``step()``, after its sample is
    pending. The error discards that sample, so a caller who catches it and goes on takes one sample per
    step (before: the next step averaged two with mc_samples=1), and a raised step is not a skipped one."""
    model, x, y = problem()
    opt = ngvi.IVON(model.parameters(), data_size=50, finite_check="device", seed=0)
    opt.step(nan_closure(opt, model, x, y, poison=True))  # masked, flagged, not yet read
    with opt.sampled_params(train=True):
        nan_closure(opt, model, x, y, poison=False)()
    assert opt.accumulator.count == 1
    with pytest.raises(ngvi.NonFiniteGradientError, match="1 pending posterior sample"):
        opt.step()
    assert opt.accumulator.count == 0 and opt.skipped_steps == 0
    with opt.sampled_params(train=True):
        nan_closure(opt, model, x, y, poison=False)()
    assert opt.accumulator.count == 1  # one sample, not two
    opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_loading_a_state_reports_a_masked_step_instead_of_dropping_it():
    model, x, y = problem()
    opt = ngvi.IVON(model.parameters(), data_size=50, finite_check="device", seed=0)
    opt.step(nan_closure(opt, model, x, y, poison=False))
    saved = opt.state_dict()
    opt.step(nan_closure(opt, model, x, y, poison=True))
    with pytest.warns(RuntimeWarning, match="step 2 had a non-finite value.*The state being loaded"):
        opt.load_state_dict(saved)
    assert len(opt._pending_checks) == 0


def test_the_hugging_face_callback_reads_the_last_flags_at_the_end_of_training():
    pytest.importorskip("transformers")
    from ngvi.integrations.hf import NGVICallback

    model, x, y = problem()
    opt = ngvi.IVON(model.parameters(), data_size=50, finite_check="device", seed=0)
    opt.step(nan_closure(opt, model, x, y, poison=True))  # the last step of a run
    callback = NGVICallback()
    callback._opt = opt
    with pytest.raises(ngvi.NonFiniteGradientError, match="step 1"):
        callback.on_train_end(None, None, None)


@pytest.mark.parametrize(("name", "copies"), [("IVON", 3), ("Vadam", 3), ("VON", 3), ("NoisyAdam", 3)])
def test_the_masks_memory_is_one_copy_of_mu_and_of_each_state_tensor(name, copies, monkeypatch):
    """The device check's mask (docs/ARCHITECTURE.md, "The device check's memory") snapshots what the
    update may write: μ and every state tensor (IVON: μ, ḡ, h), so the update's peak memory grows by that
    many floats per weight while it runs; measured here as the bytes the snapshot copies."""
    from ngvi.optim.engine import device_check

    snapshots = []
    real = device_check.masked

    def recording(written, bad, states=()):
        snapshots.append(sum(t.numel() * t.element_size() for t in dict.fromkeys(written)))
        return real(written, bad, states)

    monkeypatch.setattr(device_check, "masked", recording)
    monkeypatch.setattr("ngvi.optim.engine.optimizer.masked", recording)
    model, x, y = problem()
    opt = getattr(ngvi, name)(model.parameters(), data_size=50, finite_check="device", seed=0)
    opt.step(nan_closure(opt, model, x, y, poison=False))  # VON makes its momentum buffer here
    snapshots.clear()
    opt.step(nan_closure(opt, model, x, y, poison=False))
    weights = sum(p.numel() for p in model.parameters())
    assert sum(snapshots) == copies * weights * 4


def test_host_is_the_default_and_the_joint_posteriors_stay_on_the_host():
    model, x, y = problem()
    opt = ngvi.Vadam(model.parameters(), data_size=50)
    assert opt.finite_check == "auto" and not use_device_check(opt)  # "auto" on the CPU is the host path
    with pytest.raises(ngvi.NonFiniteGradientError, match="unchanged"):  # the host path's message, at once
        opt.step(nan_closure(opt, model, x, y, poison=True))
    with pytest.raises(ValueError, match="finite_check='host'"):
        ngvi.NNGBlkTri(model, data_size=50, finite_check="device")
    assert ngvi.NoisyKFAC(model, data_size=50, finite_check="device").finite_check == "device"
    with pytest.raises(ValueError, match="finite_check must be one of"):
        ngvi.Vadam(model.parameters(), data_size=50, finite_check="gpu")


def test_batch_norm_statistics_of_a_masked_step_are_put_back():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    opt = ngvi.Vadam(model.parameters(), data_size=50, finite_check="device", skip_nonfinite=True)
    opt.step(nan_closure(opt, model, x, y, poison=False))
    stats = [b.clone() for b in model[1].buffers()]
    opt.step(nan_closure(opt, model, x, y, poison=True))
    assert_same([b for b in model[1].buffers()][:2], stats[:2])  # running mean and variance


def test_flags_and_mask():
    a, b = torch.tensor([1.0, float("nan")]), torch.tensor([1e-30, 3.0], dtype=torch.float64)
    c = torch.tensor([float("-inf")], dtype=torch.bfloat16)
    assert nonfinite_flags([a, b, c]).tolist() == [True, False, True]
    assert nonfinite_flags([torch.full((3,), 3e38), torch.zeros(0)]).tolist() == [False, False]  # no overflow
    x, y = torch.arange(4.0), torch.arange(3, dtype=torch.float64).reshape(3, 1).t()
    for bad, expect in ((True, (x.clone(), y.clone())), (False, (x * 2 + 1, y * 2 + 1))):
        u, v = x.clone(), y.clone()
        with masked([u, v, u], torch.tensor(bad)):
            u.mul_(2).add_(1), v.mul_(2).add_(1)
        assert_same((u, v), expect)


@pytest.mark.parametrize("count", [2, FEW + 3])
def test_the_mask_selects_in_place_or_gathered_bitwise(count):
    """A few tensors (the flat buffers) are selected in place, many gathered and scattered: both give the
    block's result when the step is good and the snapshot when bad, bitwise, non-contiguous tensors too."""
    torch.manual_seed(0)
    start = [torch.randn(5, 3).t() if i % 2 else torch.randn(7) for i in range(count)]
    for bad in (False, True):
        ts = [t.clone() if t.is_contiguous() else t.clone().t().t() for t in start]
        with masked(ts, torch.tensor(bad)):
            for t in ts:
                t.mul_(3).sub_(0.5)
        assert_same(ts, start if bad else [t * 3 - 0.5 for t in start])


def test_auto_masks_on_an_accelerator_except_the_kfac_family():
    """``finite_check="auto"`` decides by where the parameters are: the device path off the CPU (a meta
    tensor stands in for a GPU's here), the host path on it and for the K-FAC family, whose mask cost more
    than the read on an H200 (docs/results/bench/gpu)."""
    on_gpu = torch.nn.Parameter(torch.zeros(3, device="meta"))
    assert use_device_check(ngvi.IVON([on_gpu], data_size=10))
    assert not use_device_check(ngvi.IVON([on_gpu], data_size=10, finite_check="host"))
    assert not use_device_check(ngvi.IVON([torch.nn.Parameter(torch.zeros(3))], data_size=10))
    assert not KroneckerFamily._device_check_by_default and ngvi.NNGFull._maskable_update is False


def test_an_update_that_raises_part_way_leaves_everything_as_it_was():
    u = torch.arange(3.0)
    with pytest.raises(RuntimeError, match="boom"), masked([u], torch.tensor(False)):
        u.add_(1)
        raise RuntimeError("boom")
    assert_same(u, torch.arange(3.0))
