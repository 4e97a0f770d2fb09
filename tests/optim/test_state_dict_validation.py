"""load_state_dict refuses state it cannot use, at load time, and leaves the optimizer as it was.

A refused load must leave an optimizer whose next steps equal those of one that never saw the bad state;
an accepted one must resume exactly. The fuzz test corrupts valid state dicts at random (missing keys, wrong
dtypes, wrong shapes, NaN, wrong counters) and holds every outcome to one of those two.
"""

from __future__ import annotations

import copy
import io
import random

import pytest
import torch
from torch import nn

from optimizer_db import BY_NAME, trainers

N = 64


def mlp(hidden: int = 8, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, 1)).double()


FUZZED = ("vadam", "ivon", "vogn", "noisy_kfac", "bbvi")  # entries of the optimizer database


def build(name: str, model: nn.Module):
    return BY_NAME[name].build(model, seed=1)


def batch():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(16, 3, generator=gen, dtype=torch.float64)
    return x, torch.sin(x.sum(1, keepdim=True))


def train(model: nn.Module, opt, steps: int) -> list[torch.Tensor]:
    x, y = batch()

    def closure():
        opt.zero_grad()
        out = model(x)
        loss = 0.5 * ((out - y) ** 2).mean()
        opt.backward(loss, out)
        return loss

    return [opt.step(closure) for _ in range(steps)]


def saved(opt) -> dict:
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def trained(name: str, steps: int = 3, hidden: int = 8):
    model = mlp(hidden)
    opt = build(name, model)
    train(model, opt, steps)
    return model, opt


def assert_refused_and_unchanged(name: str, bad_state, match: str | None = None) -> None:
    """Loading ``bad_state`` into a trained optimizer raises ValueError, and the optimizer then trains
    exactly like a copy that never saw it."""
    model, opt = trained(name)
    twin_model, twin = copy.deepcopy((model, opt))
    with pytest.raises(ValueError, match=match):
        opt.load_state_dict(bad_state)
    assert torch.equal(torch.stack(train(model, opt, 2)), torch.stack(train(twin_model, twin, 2)))
    for p, q in zip(model.parameters(), twin_model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_state_of_another_ngvi_class_is_refused_by_name():
    _, vadam = trained("vadam")
    assert_refused_and_unchanged("ivon", saved(vadam), match="saved by Vadam, not IVON")
    _, vogn = trained("vogn")
    assert_refused_and_unchanged("vadam", saved(vogn), match="saved by VOGN, not Vadam")


def test_torch_optimizer_state_is_refused():
    model = mlp()
    adam = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 3, dtype=torch.float64)).sum().backward()
    adam.step()
    assert_refused_and_unchanged("vadam", adam.state_dict(), match="not saved by an ngvi optimizer")


def test_state_of_a_model_of_another_size_is_refused_with_the_shapes():
    _, wide = trained("vadam", hidden=50)
    assert_refused_and_unchanged("vadam", saved(wide), match=r"shape \(8, 3\) here but \(50, 3\)")


def test_older_state_without_a_class_record_is_checked_by_its_keys():
    _, vadam = trained("vadam")
    state = saved(vadam)
    del state["ngvi"]["class"], state["ngvi"]["shapes"]
    assert_refused_and_unchanged("ivon", state, match="saved by another optimizer class")


# -- fuzz ----------------------------------------------------------------------------------------------
def _paths(tree, prefix=()):
    """Every (path, value) below ``tree``, dicts and lists alike."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for key, value in items:
        yield (*prefix, key), value
        yield from _paths(value, (*prefix, key))


def _parent(tree, path):
    for key in path[:-1]:
        tree = tree[key]
    return tree


def corrupt(state: dict, rng: random.Random) -> tuple[dict, str]:
    """One random corruption of a state dict, and what it was."""
    state = copy.deepcopy(state)
    paths = [p for p, _ in _paths(state)]
    tensors = [p for p, v in _paths(state) if isinstance(v, torch.Tensor) and v.is_floating_point()]
    kind = rng.choice(["drop", "nan", "dtype", "shape", "counter", "type"])
    if kind == "drop":
        path = rng.choice([p for p in paths if not isinstance(_parent(state, p), list)])
        del _parent(state, path)[path[-1]]
    elif kind == "nan":
        path = rng.choice(tensors)
        value = _parent(state, path)[path[-1]].clone(memory_format=torch.contiguous_format)
        value.view(-1)[rng.randrange(value.numel())] = float("nan")
        _parent(state, path)[path[-1]] = value
    elif kind == "dtype":
        path = rng.choice(tensors)
        _parent(state, path)[path[-1]] = _parent(state, path)[path[-1]].to(
            rng.choice([torch.int64, torch.float32])
        )
    elif kind == "shape":
        path = rng.choice(tensors)
        value = _parent(state, path)[path[-1]]
        _parent(state, path)[path[-1]] = torch.zeros(value.numel() + 1, dtype=value.dtype)
    elif kind == "counter":
        key = rng.choice(["num_steps", "skipped_steps", "seed", "num_draws"])
        state["ngvi"][key] = rng.choice([-1, 2.5, "x", None])
    else:
        path = rng.choice(paths)
        _parent(state, path)[path[-1]] = rng.choice(["junk", None, [1, 2]])
    return state, f"{kind} at {path if kind not in ('counter',) else key}"


@pytest.mark.parametrize("name", FUZZED)
def test_fuzzed_state_is_refused_unchanged_or_resumes_correctly(name):
    rng = random.Random(f"fuzz-{name}")
    model, opt = trained(name)
    good, good_model = saved(opt), copy.deepcopy(model.state_dict())
    reference = torch.stack(train(*copy.deepcopy((model, opt)), 2))
    outcomes = {"refused": 0, "resumed": 0}
    for _ in range(40):
        bad, what = corrupt(good, rng)
        target_model = mlp()
        target_model.load_state_dict(good_model)
        target = build(name, target_model)
        target.load_state_dict(copy.deepcopy(good))  # torch's load shares the tensors it is given
        before = saved(target)
        try:
            target.load_state_dict(bad)
        except ValueError:
            outcomes["refused"] += 1
            after = saved(target)  # refused: nothing changed, and it resumes as the good state does
            assert torch.equal(after["ngvi"]["rng"]["cpu"], before["ngvi"]["rng"]["cpu"]), what
            assert torch.equal(torch.stack(train(target_model, target, 2)), reference), what
            continue
        outcomes["resumed"] += 1  # accepted: then it must resume exactly (a cast dtype may round: allclose)
        resumed = torch.stack(train(target_model, target, 2))
        torch.testing.assert_close(resumed, reference, rtol=1e-5, atol=1e-7, msg=what)
    assert outcomes["refused"] > 20, outcomes  # most corruptions are caught at load time


# -- checkpoints of legitimate states (issue 20, item 2) ----------------------------------------------------
class _WithUnusedHead(nn.Module):
    """A model with a parameter that never gets a gradient (an unused head): its state is never created."""

    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body
        self.unused = nn.Linear(2, 2).to(next(body.parameters()).dtype)

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("info", trainers(lambda i: not i.joint))
def test_a_parameter_that_never_got_a_gradient_resumes(info):
    """As torch.optim.Adam does: a checkpoint without state for an unused parameter loads, and resumes
    bitwise (issue 20, 2.1: BAdam refused it)."""
    model = _WithUnusedHead(info.model())
    opt = info.build(model, **({"seed": 3} if info.engine else {}))
    info.train(model, opt, 2)
    twin_model = copy.deepcopy(model)
    twin = info.build(twin_model, **({"seed": 3} if info.engine else {}))
    twin.load_state_dict(saved(opt))
    assert torch.equal(torch.stack(info.train(model, opt, 2)), torch.stack(info.train(twin_model, twin, 2)))
    for p, q in zip(model.parameters(), twin_model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_missing_entry_of_a_parameter_that_had_state_is_refused():
    """...but the state of a parameter that had state is not silently dropped (a truncated file)."""
    _, opt = trained("vadam")
    state = saved(opt)
    del state["state"][1]
    match = r"the state of param_groups\[0\]\['params'\]\[1\] is missing"
    assert_refused_and_unchanged("vadam", state, match=match)


def test_an_empty_entry_is_refused_not_reinitialised():
    """An entry {} would silently restart that parameter's posterior (issue 20, 2.4)."""
    _, opt = trained("ivon")
    state = saved(opt)
    state["state"][0] = {}
    match = r"the state of param_groups\[0\]\['params'\]\[0\] is empty"
    assert_refused_and_unchanged("ivon", state, match=match)


@pytest.mark.parametrize("name", ["noisy_kfac", "nng_blktri", "nng_full", "kfac"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_kfac_family_with_momentum_resumes_its_own_state(name, dtype):
    """The heavy-ball buffer lives with a layer's first parameter; the bias's float32 master alone must
    not be asked for one (issue 20, 2.2)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).to(dtype)
    opt = BY_NAME[name].build(model, seed=1, momentum=0.5)
    x, y = batch()

    def step(m, o):
        def closure():
            o.zero_grad()
            out = m(x.to(dtype))
            loss = 0.5 * (out.float() - y.float()).square().mean()
            o.backward(loss, out)
            return loss

        return o.step(closure)

    for _ in range(2):
        step(model, opt)
    twin_model = copy.deepcopy(model)
    twin = BY_NAME[name].build(twin_model, seed=1, momentum=0.5)
    twin.load_state_dict(saved(opt))
    assert torch.equal(step(model, opt), step(twin_model, twin))
    for p, q in zip(model.parameters(), twin_model.parameters(), strict=True):
        assert torch.equal(p, q)
