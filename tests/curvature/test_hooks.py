"""Brute force: hooked per-example statistics equal loops over single examples, in float64, to 1e-8.

For every model below, the reference is computed one example at a time with plain autograd, independently of
the library's hooks, layer views and unfolding:

* Σᵢ (∇fᵢ)²: ``fᵢ.backward()`` on example i alone, square the parameter gradients, average;
* K-FAC factors: per example and call, the conv input patches āₜ are the output of a copy of the layer
  whose filters are the one-hot basis of its weight space (s is linear in W, so no padding or unfolding
  logic is repeated), and δₜ = ∂fᵢ/∂sₜ comes from ``retain_grad`` on the layer output;
  A = (1/M)Σᵢ Σₜ āāᵀ and S = (1/(MT))Σᵢ Σₜ δδᵀ.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ngvi.curvature import Bernoulli, Categorical, CurvatureHooks, Gaussian, statistics

TOL = 1e-8


@pytest.fixture(autouse=True)
def float64_one_thread():
    """float64 for 1e-8 comparisons; one intra-op thread, since these small ops crawl when two xdist
    workers' thread pools compete for 2 cores. Both are restored after each test."""
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    yield
    torch.set_default_dtype(dtype)
    torch.set_num_threads(threads)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


# ------------------------------------------------------------------------------------------------------------
# Models: (factory, input shape, per-example NLL of (output, target) -> [M])
# ------------------------------------------------------------------------------------------------------------
def regression_nll(out, y):
    return 0.5 * (out - y).square().flatten(1).sum(1)


class Nested(nn.Module):
    """Containers in containers, functional activations, conv → flatten → linear."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(2, 4, 3, padding=1, bias=False), nn.Tanh()),
            nn.ModuleDict({"down": nn.Conv2d(4, 4, 2, stride=2, groups=2)}),
        )
        self.head = nn.ModuleList([nn.Linear(4 * 3 * 3, 5), nn.Linear(5, 3, bias=False)])

    def forward(self, x):
        h = self.features[0](x)
        h = F.softplus(self.features[1]["down"](h))
        h = torch.sigmoid(self.head[0](h.flatten(1)))
        return self.head[1](h)


class Twice(nn.Module):
    """One Linear and one Conv2d each applied twice (the conv at two spatial sizes)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3)
        self.lin = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        h = torch.tanh(self.conv(torch.tanh(self.conv(x))))  # 7x7 -> 5x5 -> 3x3
        h = h.mean(dim=(2, 3)).repeat(1, 2)
        h = self.lin(torch.relu(self.lin(h)))
        return self.out(h)


class Sequence(nn.Module):
    """A Linear applied to [M, T, d] inputs: per-example gradients sum over the T positions."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.out = nn.Linear(4, 2, bias=False)

    def forward(self, x):
        return self.out(torch.tanh(self.lin(x)).mean(1))


class InplaceRelu(nn.Module):
    """The hooked layer's output is modified in place right after the layer."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 5), nn.Linear(5, 2)
        self.inplace = True

    def forward(self, x):
        return self.b(F.relu(self.a(x), inplace=self.inplace))


def reference_twin(model: nn.Module) -> nn.Module:
    """The model for the brute-force loops: the same, except that in-place ops are made out of place (so
    that ``retain_grad`` on a layer output sees the layer's own output)."""
    twin = copy.deepcopy(model)
    for m in twin.modules():
        if hasattr(m, "inplace"):
            m.inplace = False
    return twin


def conv_net(**conv_kwargs):
    def make():
        return nn.Sequential(nn.Conv2d(4, 4, **conv_kwargs), nn.Tanh(), nn.Flatten(), nn.LazyLinear(3))

    return make


class Normalised(nn.Module):
    """LayerNorm over one and over two trailing dims (one without bias), GroupNorm after a conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.lin = nn.Linear(4 * 3 * 3, 6)
        self.ln = nn.LayerNorm(6)
        self.seq_ln = nn.LayerNorm([2, 3], bias=False)
        self.out = nn.Linear(6, 2)

    def forward(self, x):
        h = torch.tanh(self.gn(self.conv(x))).flatten(1)
        h = torch.tanh(self.ln(self.lin(h)))
        h = self.seq_ln(h.reshape(-1, 2, 3)).reshape(-1, 6)
        return self.out(torch.sin(h))


class BatchNormed(nn.Module):
    """Conv → BatchNorm2d → tanh → Linear in eval mode (running statistics, set to non-trivial values): the
    examples are independent, so the single-example loops are exact."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(3)
        self.out = nn.Linear(3 * 4 * 4, 2)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)
        self.eval()

    def forward(self, x):
        return self.out(torch.tanh(self.bn(self.conv(x))).flatten(1))


CASES = {
    "linear": (lambda: nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)), (6, 5)),
    "linear-nobias": (lambda: nn.Sequential(nn.Linear(5, 4, bias=False), nn.ReLU(), nn.Linear(4, 3)), (6, 5)),
    "conv-plain": (conv_net(kernel_size=3), (5, 4, 6, 6)),
    "conv-stride-pad": (conv_net(kernel_size=3, stride=2, padding=1), (5, 4, 7, 7)),
    "conv-dilation": (conv_net(kernel_size=(2, 3), dilation=(2, 1), padding=(1, 0)), (5, 4, 7, 6)),
    "conv-groups-nobias": (conv_net(kernel_size=3, groups=2, bias=False), (5, 4, 6, 6)),
    "conv-depthwise": (conv_net(kernel_size=3, groups=4, stride=(1, 2)), (5, 4, 6, 7)),
    "conv-same-even": (conv_net(kernel_size=(2, 4), padding="same", dilation=(1, 2)), (5, 4, 5, 6)),
    "conv-valid": (conv_net(kernel_size=2, padding="valid"), (5, 4, 5, 5)),
    "conv-reflect": (conv_net(kernel_size=3, padding=1, padding_mode="reflect"), (5, 4, 5, 5)),
    "conv-circular": (
        conv_net(kernel_size=3, padding=(2, 1), padding_mode="circular", stride=2),
        (5, 4, 6, 5),
    ),
    "nested": (Nested, (5, 2, 6, 6)),
    "twice": (Twice, (5, 2, 7, 7)),
    "sequence": (Sequence, (5, 3, 3)),
    "inplace": (InplaceRelu, (6, 3)),
    "norms": (Normalised, (5, 2, 3, 3)),
    "batchnorm-eval": (BatchNormed, (5, 2, 4, 4)),
}


def build(case: str, seed: int = 0):
    make, shape = CASES[case]
    torch.manual_seed(seed)
    model = make()
    x = torch.randn(*shape)
    model(x)  # materialise lazy layers
    y = torch.randn_like(model(x))
    return model, x, y


# ------------------------------------------------------------------------------------------------------------
# Brute force, one example at a time
# ------------------------------------------------------------------------------------------------------------
def brute_mean_sq_grads(model, x, nll_single) -> dict:
    """{parameter name: (1/M) Σᵢ (∇fᵢ)²}; ``nll_single(model, i)`` is example i's NLL."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    acc = {n: torch.zeros_like(p) for n, p in params.items()}
    for i in range(x.shape[0]):
        model.zero_grad()
        nll_single(model, i).backward()
        for n, p in params.items():
            acc[n] += p.grad.square()
    return {n: v / x.shape[0] for n, v in acc.items()}


NORMS = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm2d)


def per_element(module: nn.Module, t: torch.Tensor) -> torch.Tensor:
    """[1, ...] laid out as [K, T, 1], one group per element of a normalisation layer's weight."""
    k = module.weight.numel()
    if isinstance(module, nn.GroupNorm | nn.BatchNorm2d):
        return t.reshape(k, -1, 1)
    return t.reshape(-1, k).T.unsqueeze(-1)


def layer_patches(module: nn.Module, x_i: torch.Tensor) -> torch.Tensor:
    """[G, T, d] input patches of one call on one example, without unfolding: s is linear in W, so a copy
    of the conv whose filters are the one-hot basis of the weight space outputs the patches themselves.
    For a normalisation layer the "patch" of element k is x̂ₖ: the layer's own output with w = 1, b = 0."""
    if isinstance(module, nn.Linear):
        return x_i.reshape(1, -1, module.in_features)
    if isinstance(module, NORMS):
        clean = copy.deepcopy(module)
        clean._forward_hooks.clear()
        with torch.no_grad():
            clean.weight.fill_(1.0)
            if clean.bias is not None:
                clean.bias.zero_()
            return per_element(module, clean(x_i))
    groups, d = module.groups, module.weight[0].numel()
    probe = nn.Conv2d(
        module.in_channels,
        groups * d,
        module.kernel_size,
        stride=module.stride,
        padding=module.padding,
        dilation=module.dilation,
        groups=groups,
        bias=False,
        padding_mode=module.padding_mode,
    )
    with torch.no_grad():
        probe.weight.copy_(torch.eye(d).repeat(groups, 1).reshape(probe.weight.shape))
        out = probe(x_i)  # [1, G·d, Ho, Wo]
    return out.reshape(groups, d, -1).transpose(1, 2)


def brute_kfac(model, x, nll_single) -> dict:
    """{module name: (A, S)} with the bias column appended when the bias is trained."""
    names = {m: n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d, *NORMS))}
    layers = list(names)
    calls: dict = {}

    def hook(module, args, output):
        output.retain_grad()
        calls.setdefault(module, []).append((args[0].detach(), output))

    handles = [m.register_forward_hook(hook) for m in layers]
    sums = {m: [0.0, 0.0, 0] for m in layers}  # Σ āāᵀ, Σ δδᵀ, T
    try:
        for i in range(x.shape[0]):
            calls.clear()
            model.zero_grad()
            nll_single(model, i).backward()
            for m in layers:
                groups = getattr(m, "groups", 1)
                positions = 0
                for x_in, out in calls[m]:
                    a = layer_patches(m, x_in)  # [G, T, d]
                    if m.bias is not None:
                        a = torch.cat([a, torch.ones_like(a[..., :1])], dim=-1)
                    if isinstance(m, NORMS):
                        delta = per_element(m, out.grad)
                    elif isinstance(m, nn.Conv2d):  # [1, out, Ho, Wo] -> [G, T, o]
                        delta = out.grad.reshape(groups, m.out_channels // groups, -1).transpose(1, 2)
                    else:  # [1, ..., out] -> [1, T, out]
                        delta = out.grad.reshape(1, -1, m.out_features)
                    sums[m][0] = sums[m][0] + a.transpose(1, 2) @ a
                    sums[m][1] = sums[m][1] + delta.transpose(1, 2) @ delta
                    positions += a.shape[1]
                sums[m][2] = positions
    finally:
        for h in handles:
            h.remove()
    n = x.shape[0]
    return {names[m]: (aa / n, ss / (n * t)) for m, (aa, ss, t) in sums.items()}


def hooked(model, x, run_backward, capture="grads", loss_reduction="mean", chunk_bytes=64 * 2**20):
    hooks = CurvatureHooks(model, loss_reduction=loss_reduction, chunk_bytes=chunk_bytes)
    with hooks.recording(capture):
        run_backward(hooks)
        sq = hooks.mean_sq_grads()
        factors = {hooks.layers[i].name: f for i, f in hooks.kfac_factors().items()}
    assert all(not m._forward_hooks for m in model.modules())
    return sq, factors


def assert_matches(model, sq, factors, ref_sq, ref_factors, errors):
    for name, p in model.named_parameters():
        err = rel_err(sq[p], ref_sq[name])
        errors.append(err)
        assert err < TOL, f"{name}: relative error {err:.2e}"
    for m, (a_ref, s_ref) in ref_factors.items():
        a, s = factors[m]
        for what, got, ref in (("A", a, a_ref), ("S", s, s_ref)):
            err = rel_err(got, ref)
            errors.append(err)
            assert got.shape == ref.shape and err < TOL, f"{m}: {what} relative error {err:.2e}"


# ------------------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("loss_reduction", ["mean", "sum"])
def test_empirical_statistics_match_single_example_loops(case, loss_reduction):
    model, x, y = build(case)

    def single(net, i):
        return regression_nll(net(x[i : i + 1]), y[i : i + 1])[0]

    twin = reference_twin(model)
    ref_sq, ref_factors = brute_mean_sq_grads(twin, x, single), brute_kfac(twin, x, single)

    def backward(_):
        model.zero_grad()
        nll = regression_nll(model(x), y)
        (nll.mean() if loss_reduction == "mean" else nll.sum()).backward()

    sq, factors = hooked(model, x, backward, loss_reduction=loss_reduction)
    assert_matches(model, sq, factors, ref_sq, ref_factors, [])


@pytest.mark.parametrize("case", ["twice", "conv-groups-nobias", "sequence"])
def test_chunking_does_not_change_the_result(case):
    model, x, y = build(case)

    def backward(_):
        model.zero_grad()
        regression_nll(model(x), y).mean().backward()

    whole = hooked(model, x, backward)
    one_at_a_time = hooked(model, x, backward, chunk_bytes=1)
    for p in model.parameters():
        assert rel_err(one_at_a_time[0][p], whole[0][p]) < 1e-12
    for m, (a, s) in whole[1].items():
        assert rel_err(one_at_a_time[1][m][0], a) < 1e-12 and rel_err(one_at_a_time[1][m][1], s) < 1e-12


def classification_case(case: str, likelihood):
    model, x, y = build(case)
    if isinstance(likelihood, Categorical):
        model = nn.Sequential(model, nn.Linear(y.shape[1], 4))
    return model, x


@pytest.mark.parametrize("case", ["nested", "twice", "conv-same-even", "inplace", "sequence", "norms"])
@pytest.mark.parametrize("likelihood", [Gaussian(2.5), Bernoulli(), Categorical()], ids=lambda lik: lik.name)
def test_sampled_target_statistics_match_single_example_loops(case, likelihood):
    """The "fisher" pass: the hooked statistics for given sampled targets equal the per-example loop."""
    model, x = classification_case(case, likelihood)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        target = likelihood.sample(model(x), gen)

    def single(net, i):
        return likelihood.nll(net(x[i : i + 1]), target[i : i + 1])

    twin = reference_twin(model)
    ref_sq, ref_factors = brute_mean_sq_grads(twin, x, single), brute_kfac(twin, x, single)

    def backward(hooks):
        model.zero_grad()
        out = model(x)
        hooks.backward_sampled(out, likelihood.nll_grad(out, target))

    sq, factors = hooked(model, x, backward, capture="sampled")
    assert all(p.grad is None for p in model.parameters())  # the sampled pass computes no weight gradients
    assert_matches(model, sq, factors, ref_sq, ref_factors, [])


@pytest.mark.parametrize("likelihood", [Gaussian(0.7), Bernoulli(), Categorical()], ids=lambda lik: lik.name)
def test_likelihood_gradient_is_the_gradient_of_its_nll(likelihood):
    torch.manual_seed(0)
    out = torch.randn(7, 4, 3, requires_grad=True)
    target = likelihood.sample(out, torch.Generator().manual_seed(0))
    (auto,) = torch.autograd.grad(likelihood.nll(out, target), out)
    assert rel_err(likelihood.nll_grad(out, target), auto) < 1e-12


@pytest.mark.parametrize("likelihood", [Gaussian(4.0), Bernoulli(), Categorical()], ids=lambda lik: lik.name)
def test_sampled_targets_follow_the_predictive(likelihood):
    """E_ỹ[∇ₒ(−log p)] = 0 and E_ỹ[∇∇ᵀ] = the Fisher of the output (Gaussian: τI; softmax: diag(p) − ppᵀ)."""
    torch.manual_seed(0)
    out = torch.randn(1, 3).expand(40000, 3).contiguous()
    grads = likelihood.nll_grad(out, likelihood.sample(out, torch.Generator().manual_seed(3)))
    fisher = grads.T @ grads / grads.shape[0]
    o = out[0]
    if isinstance(likelihood, Gaussian):
        expected = 4.0 * torch.eye(3)
    elif isinstance(likelihood, Bernoulli):
        expected = torch.diag(torch.sigmoid(o) * (1 - torch.sigmoid(o)))
    else:
        p = torch.softmax(o, 0)
        expected = torch.diag(p) - torch.outer(p, p)
    assert grads.mean(0).abs().max() < 5 * expected.diagonal().sqrt().max() / 200  # 5 standard errors
    assert (fisher - expected).abs().max() < 0.05 * expected.abs().max()


def test_batchnorm_in_training_mode_gets_the_exact_per_example_squares_of_its_own_parameters():
    """With batch statistics, f_i depends on the batch-norm scale and shift only through example i's own
    output: ∇fᵢ = Σₜ δᵢₜ x̂ᵢₜ exactly. Brute force: the whole batch forward, example i's loss backward."""
    torch.manual_seed(0)
    model = BatchNormed().train()
    x = torch.randn(6, 2, 4, 4)
    y = torch.randn(6, 2)
    bn = [model.bn.weight, model.bn.bias]
    ref = [torch.zeros_like(p) for p in bn]
    for i in range(x.shape[0]):
        grads = torch.autograd.grad(regression_nll(model(x), y)[i], bn)
        for r, g in zip(ref, grads, strict=True):
            r += g.square() / x.shape[0]

    def backward(_):
        model.zero_grad()
        regression_nll(model(x), y).mean().backward()

    with pytest.warns(UserWarning, match="BatchNorm layers in training mode"):
        sq, _ = hooked(model, x, backward)
    for p, r in zip(bn, ref, strict=True):
        assert rel_err(sq[p], r) < TOL
    hooks = CurvatureHooks(model)
    assert hooks.point_params == set(bn)  # batch-norm parameters are point estimates


def test_kfac_factors_are_written_in_place_without_zero_fill_or_copies():
    """The factor products write into one [vec A, vec S] buffer: no zero-filled accumulator, no concatenation
    of the bias row and column, no flattening copy (these were 30% of a CNN step). The values are the brute
    force's (the tests above); here the ops and the storage."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten(), nn.Linear(12, 4)).double()
    x = torch.randn(5, 2, 4, 4, dtype=torch.float64)
    hooks = CurvatureHooks(model)  # one product per factor: straight into the buffer
    with hooks.recording():
        model(x).square().sum().backward()
        with torch.profiler.profile(record_shapes=True) as prof:
            factors = hooks.kfac_factors()
    shapes = set()  # A, S, A without its bias row and column, and their flat forms
    for a, s in factors.values():
        g, d = a.shape[:2]
        shapes |= {(g, d, d), (g, d - 1, d - 1), tuple(s.shape), (a.numel(),), (s.numel(),)}
    bad = {"aten::cat", "aten::fill_", "aten::zero_", "aten::zeros", "aten::copy_", "aten::lerp"}
    big = [
        (e.name, e.input_shapes)
        for e in prof.events()
        if e.name in bad and any(tuple(shape) in shapes for shape in e.input_shapes)
    ]
    assert not big, big  # (the old code: zeros, then cat of the bias row and column, then a flattening cat)
    for a, s in factors.values():
        flat = statistics.flat_factors(a, s)
        assert flat.data_ptr() == a.data_ptr() and flat.numel() == a.numel() + s.numel()
        assert torch.equal(flat, torch.cat([a.reshape(-1), s.reshape(-1)]))
