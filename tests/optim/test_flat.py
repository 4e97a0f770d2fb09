"""The flat buffers of the element-wise rules (ngvi.optim.engine.flat): what they change and what they keep.

* Fed the same ε, the flat path and the per-tensor path (``flat=False``, the reference) give bitwise the same
  trajectories, for every element-wise rule, with several MC samples, several groups, antithetic noise,
  the device-side finiteness check and float32 masters of bfloat16 parameters. ε is injected by replacing
  the noise source's fill with reads from one fixed sequence, so both paths take the same numbers in the
  same order (the flat path in one read per bucket, the per-tensor path in one per parameter).
* The new stream (one ``normal_`` per bucket) is standard normal, the same at any split of the bucket into
  tensors in distribution, and independent across neighbouring tensors.
* The work of a step does not grow with the number of tensors: ATen ops and allocations per step are the same
  for 8 and for 128 tensors of the same total size (the issue's bound: ≤ 1.25×); for the rules whose ĥ comes
  from the layers' hooks (VOGN, noisy Adam's per-example curvature), beyond those per-layer statistics.
* A bucket never serves stale buffers: a rebound parameter, a replaced state, a parameter without a gradient.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import ngvi
from host_reads import OpCounter
from ngvi.optim.engine import flat as flat_layout
from optimizer_db import BY_NAME, trainers

DEFAULT_RULES = ("Vadam", "Vprop", "VON", "VadaGrad", "IVON", "NoisyAdam", "BAdam")


def mlp(seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(seed)  # tensors of several sizes, none a multiple of 16
    return nn.Sequential(nn.Linear(3, 11), nn.Tanh(), nn.Linear(11, 7), nn.Tanh(), nn.Linear(7, 1)).to(dtype)


def _flat(info) -> bool:
    return flat_layout.enabled(info.build(mlp()))


#: the entries that take the flat path (VON's Hutchinson estimator, for one, needs the graph per tensor)
ELEMENTWISE = trainers(lambda info: info.engine and info.cls._elementwise and _flat(info))


def trajectory(info, flat: bool, dtype=torch.float64, groups: bool = False, steps: int = 6, **options):
    # the rules that hook the layers (VOGN, noisy Adam's per-example curvature) take their problem's model
    model = info.model(dtype=dtype) if info.takes_model else mlp(dtype=dtype)
    params = model if info.takes_model else model.parameters()
    if groups:  # two groups with their own learning rates
        first, *rest = list(model.parameters())
        params = [{"params": [first], "lr": 0.02}, {"params": rest}]
    opt = info.factory(params, seed=3, flat=flat, **options)
    losses = info.train(model, opt, steps)
    with opt.sampled_params():
        sample = [p.detach().clone() for p in model.parameters()]
    post = opt.posterior()
    assert bool(opt._buckets) == flat
    return [torch.stack(losses).detach(), *post.mean, *post.variance, *sample]


VARIANTS = {
    "defaults": {},
    "two_samples": {"mc_samples": 2},
    "two_groups": {"groups": True},
    "antithetic": {"noise": "antithetic"},
    "device_check": {"finite_check": "device"},
    "bfloat16": {"dtype": torch.bfloat16},
    "chunks": {},  # the CPU's pieces (flat.chunks) at a size these small models reach
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("info", ELEMENTWISE)
def test_fed_the_same_noise_the_flat_path_is_bitwise_the_per_tensor_path(
    info, variant, injected_noise, monkeypatch
):
    options = VARIANTS[variant]
    if variant == "chunks":
        monkeypatch.setattr(flat_layout, "CPU_CHUNK", 16)
    if "mc_samples" in options and not info.mc_samples:
        pytest.skip(f"{info.name} takes one sample per step")
    if "groups" in options and not info.add_param_group:
        pytest.skip(f"{info.name} keeps the model in one group")
    runs = []
    for flat in (False, True):
        injected_noise()
        runs.append(trajectory(info, flat, **options))
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("info", ELEMENTWISE)
def test_chunked_noise_is_the_same_stream_on_both_paths(info):
    """noise="chunked" keys each weight's ε by its parameter and place, not by the bucket: the flat path
    draws what the per-tensor path draws (and what FSDP2's shards draw, tests/test_fsdp2.py)."""
    runs = [trajectory(info, flat, noise="chunked") for flat in (False, True)]
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def _forty_tensors(name: str) -> tuple[list[nn.Parameter], object]:
    """40 tensors of many sizes and their optimizer with σ = 1/5 (init_prec fixed): Vadam on the
    parameters, or VOGN, whose own draw μ + ε⊙(s + λ̃)^(−1/2)/√N the bucket forms, on 20 Linear layers."""
    torch.manual_seed(0)
    if name == "Vadam":
        sizes = [1 + (37 * i) % 157 for i in range(40)]
        params = [nn.Parameter(torch.randn(n, dtype=torch.float64)) for n in sizes]
        return params, ngvi.Vadam(params, data_size=100, prior_prec=1.0, init_prec=25.0, seed=11)
    model = nn.Sequential(*(nn.Linear(1 + i % 7, 1 + (5 * i) % 13) for i in range(20))).double()
    return list(model.parameters()), ngvi.VOGN(model, data_size=100, prior_prec=1.0, init_prec=25.0, seed=11)


@pytest.mark.parametrize("name", ["Vadam", "VOGN"])
def test_the_bucket_stream_is_standard_normal_and_independent_across_tensors(name):
    """ε = (θ − μ)/σ over 400 draws of 40 tensors (sizes 1 … 157 for Vadam, 1 … 91 for VOGN's layers)."""
    params, opt = _forty_tensors(name)
    sizes = [p.numel() for p in params]
    mean = torch.cat([p.detach().flatten() for p in params]).clone()
    draws = []
    for _ in range(400):
        with opt.sampled_params():
            draws.append((torch.cat([p.detach().flatten() for p in params]) - mean) * 5.0)
    eps = torch.stack(draws)  # (draws, weights)
    n = eps.numel()
    assert len(opt._buckets) == 1  # one bucket, one draw per sample
    assert abs(eps.mean().item()) < 4 / math.sqrt(n)
    assert abs(eps.var().item() - 1) < 4 * math.sqrt(2 / n)
    # Kolmogorov–Smirnov against Φ (critical value at α = 0.001: 1.95/√n)
    values = eps.flatten().sort().values
    cdf = 0.5 * (1 + torch.erf(values / math.sqrt(2)))
    grid = torch.arange(1, n + 1, dtype=torch.float64) / n
    ks = torch.maximum((grid - cdf).abs(), (grid - 1 / n - cdf).abs()).max().item()
    assert ks < 1.95 / math.sqrt(n)
    # neighbouring tensors: the last weight of one and the first of the next, and their tensor means
    ends = torch.tensor(sizes).cumsum(0)
    k = eps.shape[0]
    for i in range(len(sizes) - 1):
        boundary = (eps[:, ends[i] - 1], eps[:, ends[i]])
        means = (eps[:, ends[i] - sizes[i] : ends[i]].mean(1), eps[:, ends[i] : ends[i + 1]].mean(1))
        for a, b in (boundary, means):
            corr = torch.corrcoef(torch.stack([a, b]))[0, 1].item()
            assert abs(corr) < 4.5 / math.sqrt(k), (i, corr)
    # and consecutive draws are independent
    corr = torch.corrcoef(torch.stack([eps[:-1].flatten(), eps[1:].flatten()]))[0, 1].item()
    assert abs(corr) < 4 / math.sqrt(n)


def chain(tensors: int, total_width: int = 4096) -> nn.Module:
    """``tensors`` tensors (weights and biases) of ~the same total size."""
    layers = tensors // 2
    width = round(math.sqrt(total_width * 16 / layers))
    torch.manual_seed(0)
    return nn.Sequential(*(m for _ in range(layers) for m in (nn.Linear(width, width), nn.Tanh())))


class Allocations(TorchDispatchMode):
    """Tensors an op returns that do not alias an input: the allocations of the step."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func._schema.is_mutable and not any(a.alias_info for a in func._schema.returns):
            flat = out if isinstance(out, list | tuple) else [out]
            self.count += sum(isinstance(t, torch.Tensor) for t in flat)
        return out


def per_step(opt, model, counter_type) -> int:
    width = model[0].in_features
    x = torch.randn(4, width)

    def closure():
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    with counter_type() as in_step:
        opt.step(closure)
    with counter_type() as in_closure:
        closure()
    if isinstance(in_step, OpCounter):
        return sum(in_step.ops.values()) - sum(in_closure.ops.values())
    return in_step.count - in_closure.count


@pytest.mark.parametrize("counter", [OpCounter, Allocations], ids=["ops", "allocations"])
@pytest.mark.parametrize("name", DEFAULT_RULES)
def test_the_work_of_a_step_does_not_grow_with_the_number_of_tensors(name, counter):
    counts = {}
    for tensors in (8, 128):
        model = chain(tensors)
        opt = getattr(ngvi, name)(model.parameters(), data_size=100)
        counts[tensors] = per_step(opt, model, counter)
    assert counts[128] <= 1.25 * counts[8], counts
    if counter is OpCounter:  # the per-tensor path is the contrast: it grows with the tensors
        per_tensor = {}
        for tensors in (8, 128):
            model = chain(tensors)
            opt = getattr(ngvi, name)(model.parameters(), data_size=100, flat=False)
            per_tensor[tensors] = per_step(opt, model, counter)
        assert per_tensor[128] > 3 * per_tensor[8]


def engine_ops(opt, model) -> tuple[int, int]:
    """ATen ops of a step of a hooked rule outside the closure (counted inside the step: the hooks record
    during it) and outside the layers' statistics (Σᵢgᵢ² per layer: per-layer work, as the backward pass is),
    and the host reads among them."""
    x = torch.randn(4, model[0].in_features)
    inner, stats = [], []

    def closure():
        with OpCounter() as c:
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
        inner.append(c.total)
        return loss

    hooks = opt.curvature_estimator.hooks
    statistics = hooks.mean_sq_grads

    def counted():
        with OpCounter() as c:
            out = statistics()
        stats.append(c.total)
        return out

    hooks.mean_sq_grads = counted
    for _ in range(3):
        opt.step(closure)
    with OpCounter() as step:
        opt.step(closure)
    return step.total - inner[-1] - stats[-1], step.sync_count


@pytest.mark.parametrize(
    "build",
    [
        lambda m, **kw: ngvi.VOGN(m, data_size=100, **kw),
        lambda m, **kw: ngvi.NoisyAdam(m, data_size=100, curvature="ef", **kw),
    ],
    ids=["VOGN", "NoisyAdam_ef"],
)
def test_a_hooked_rule_s_step_does_not_grow_with_the_tensors_beyond_its_layers_statistics(build):
    """VOGN and noisy Adam's per-example curvature: their ĥ comes from each layer's hooks (one product per
    layer, as the backward pass), gathered into the bucket with one multi-tensor op; the rest of the step
    is the flat path's (measured: 58 ops at 8 and at 128 tensors; per tensor 224–234 and 2,132–2,622)."""
    counts, per_tensor = {}, {}
    for t in (8, 128):
        model = chain(t)
        counts[t] = engine_ops(build(model), model)
        model = chain(t)
        per_tensor[t] = engine_ops(build(model, flat=False), model)
    assert counts[128][0] <= 1.25 * counts[8][0], counts
    assert per_tensor[128][0] > 3 * per_tensor[8][0], per_tensor


def test_parameters_and_state_are_views_of_one_buffer_per_group():
    model = mlp()
    opt = ngvi.IVON(model.parameters(), data_size=64, seed=0)
    BY_NAME["ivon"].train(model, opt, 2)
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    hess = {opt.state[p]["hess"].untyped_storage().data_ptr() for p in model.parameters()}
    assert len(storages) == 1 and len(hess) == 1


def test_a_rebound_parameter_rebuilds_the_bucket_and_keeps_its_value():
    model = mlp()
    opt = ngvi.Vadam(model.parameters(), data_size=64, seed=0)
    BY_NAME["vadam"].train(model, opt, 2)
    weight = model[0].weight
    weight.data = weight.detach() + 1.0  # a new tensor, outside the bucket
    moved = weight.detach().clone()
    with opt.sampled_params():
        pass
    assert torch.equal(weight.detach(), moved)  # μ was taken from the new tensor
    assert weight.untyped_storage().data_ptr() == model[2].weight.untyped_storage().data_ptr()
    BY_NAME["vadam"].train(model, opt, 2)  # and it trains on


def test_a_replaced_state_is_used_not_the_stale_buffer():
    model = mlp()
    opt = ngvi.IVON(model.parameters(), data_size=64, seed=0)
    BY_NAME["ivon"].train(model, opt, 2)
    p = model[0].weight
    opt.state[p]["hess"] = torch.full_like(p, 9.0)  # e.g. what a load or a user writes
    with opt.sampled_params():
        pass
    assert torch.equal(opt.state[p]["hess"], torch.full_like(p, 9.0))
    prec = opt.posterior().variance[0].reciprocal()
    torch.testing.assert_close(prec, torch.full_like(p, 64 * (9.0 + opt.param_groups[0]["weight_decay"])))


def test_a_parameter_without_gradient_takes_the_per_tensor_path_and_stays_right(injected_noise):
    """A step in which one parameter gets no gradient updates the others only; the next steps are still
    the per-tensor path's, fed the same noise."""
    runs = []
    for flat in (False, True):
        injected_noise()
        model = mlp()
        # kl_clip=None: the trust region's ν is a sum over the group, whose rounding depends on the layout
        # (one flat buffer or one tensor per parameter), so with it the two paths agree to rounding only
        opt = ngvi.IVON(model.parameters(), data_size=64, seed=0, flat=flat, kl_clip=None)
        x = torch.randn(8, 3, dtype=torch.float64)

        def closure(skip_first=False, model=model, opt=opt, x=x):
            opt.zero_grad()
            h = model[1](x @ model[0].weight.T.detach() if skip_first else model[0](x))
            loss = model[4](model[3](model[2](h))).square().mean()
            loss.backward()
            return loss

        opt.step(closure)
        opt.step(lambda: closure(skip_first=True))
        opt.step(closure)
        runs.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_a_model_whose_parameters_share_a_bucket_saves_and_loads(tmp_path):
    """The parameters are views of one buffer: torch.save and safetensors' save_file of the state dict keep
    every tensor (safetensors' save_model refuses shared storage: flat=False, or save the state dict)."""
    safetensors = pytest.importorskip("safetensors.torch")
    model = mlp()
    opt = ngvi.Vadam(model.parameters(), data_size=64, seed=0)
    BY_NAME["vadam"].train(model, opt, 2)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save(model.state_dict(), tmp_path / "model.pt")
    safetensors.save_file(model.state_dict(), tmp_path / "model.safetensors")
    for loaded in (
        torch.load(tmp_path / "model.pt", weights_only=True),
        safetensors.load_file(tmp_path / "model.safetensors"),
    ):
        fresh = mlp(seed=1)
        fresh.load_state_dict(loaded)
        assert all(torch.equal(fresh.state_dict()[k], v) for k, v in expected.items())


def test_compiled_flat_rule_compiles_one_graph_per_core_whatever_the_tensor_shapes():
    """``compile=True`` on a bucket: one graph per core (σ, the update) for a model of six tensor shapes, as
    for one of a single shape; the per-tensor path compiled one per structure of shapes (150 tensors of
    the launch-bound chain: 101 s to compile on this CPU, 5.4 s flat)."""
    from ngvi.optim import functional as F

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    opt = ngvi.IVON(model.parameters(), data_size=64, seed=0, compile=True)
    before = set(F._capture._COMPILED)
    BY_NAME["ivon"].train(model, opt, 2)
    assert len(set(F._capture._COMPILED) - before) == 2  # diagonal_sigma and ivon_update_


def test_non_contiguous_and_expanded_gradients_are_gathered_as_the_per_tensor_path_reads_them():
    """p.grad may be a transposed or an expanded (stride 0) tensor: the bucket copies its values."""
    runs = []
    for flat in (False, True):
        model = mlp()
        opt = ngvi.Vadam(model.parameters(), data_size=64, seed=0, flat=flat)
        for step in range(3):
            with opt.sampled_params(train=True):
                for i, p in enumerate(model.parameters()):
                    if p.dim() == 2:
                        p.grad = torch.full(p.shape[::-1], 0.1 * (i + step), dtype=p.dtype).t()
                    else:
                        p.grad = torch.tensor(0.2 * (i - step), dtype=p.dtype).expand(p.shape)
            opt.step()
        runs.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_p_grad_after_a_step_and_zeroing_in_place_in_the_next_closure_are_as_per_tensor(injected_noise):
    """After ``step(closure)`` each ``p.grad`` views the bucket's copy of ĝ (not held twice): the same values
    as the per-tensor path's ``p.grad``; the next draw detaches them, so a closure that zeroes in place
    (``zero_grad(set_to_none=False)``) cannot write into the sample."""
    runs = []
    for flat in (False, True):
        injected_noise()
        model = mlp()
        # kl_clip=None: the trust region's ν is taken per pass (the per-tensor path's quarter slices, the flat
        # path's chunks), so where it binds the two paths differ; this test is about p.grad
        opt = ngvi.IVON(model.parameters(), data_size=64, seed=0, flat=flat, kl_clip=None)
        x, y = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, 1, dtype=torch.float64)

        def closure(model=model, opt=opt, x=x, y=y):
            opt.zero_grad(set_to_none=False)
            loss = (model(x) - y).square().mean()
            loss.backward()
            return loss

        grads = []
        for _ in range(3):
            opt.step(closure)
            grads += [p.grad.clone() for p in model.parameters()]
        runs.append(grads + [p.detach().clone() for p in model.parameters()])
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
