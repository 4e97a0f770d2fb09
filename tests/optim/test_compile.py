"""``compile=True``: the rules' update cores run through ``torch.compile`` (inductor) and agree with eager.

Each case trains a small float64 model for 20 steps eagerly and compiled, from the same seeds, with a
LambdaLR scheduler that changes lr at every step, and compares the posteriors.

Tolerance: rtol 1e-12 (float64). The compiled kernels do the same maths with fused, possibly reassociated
arithmetic (e.g. m + c·(u/d) instead of addcdiv): a few ulps (~1e-16 relative) per operation. The noise ε is
the engine's own stream in both runs, so the trajectories differ only by that round-off carried through 20
steps: measured ≤ 8e-16 relative (several rules are bitwise equal); 1e-12 leaves three orders of headroom
for other CPUs' vector widths while still catching any real difference in the maths (≥ 1e-8 here).

After two warm-up steps every step runs under ``error_on_recompile`` and no new graph may be compiled: lr,
the betas and the step count enter as 0-dim tensors, so neither the scheduler nor the growing step count
recompiles. Compilation takes seconds per graph, so the models have one or two parameter tensors.
"""

from __future__ import annotations

import contextlib
import copy
import pickle

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import ngvi
from ngvi.baselines import BBVI
from ngvi.optim.engine.empirical_bayes import EmpiricalBayes

N = 64
STEPS = 20
RTOL = 1e-12

# name -> (factory(model, compile), model has a bias)
RULES = {
    "vadam": (lambda m, c: ngvi.Vadam(m.parameters(), N, lr=1e-2, init_prec=50.0, seed=3, compile=c), True),
    "vprop": (lambda m, c: ngvi.Vprop(m.parameters(), N, lr=1e-2, init_prec=50.0, seed=3, compile=c), False),
    "ivon": (
        lambda m, c: ngvi.IVON(m.parameters(), N, lr=0.05, clip_radius=0.5, seed=3, compile=c),
        False,
    ),
    "von": (
        lambda m, c: ngvi.VON(m.parameters(), N, lr=1e-2, beta=0.05, init_prec=50.0, seed=3, compile=c),
        False,
    ),
    "noisy_adam": (
        lambda m, c: ngvi.NoisyAdam(m.parameters(), N, lr=1e-2, damping=1e-3, seed=3, compile=c),
        False,
    ),
    "vadagrad": (
        lambda m, c: ngvi.VadaGrad(m.parameters(), lr=1e-2, init_prec=100.0, seed=3, compile=c),
        False,
    ),
    "badam": (lambda m, c: ngvi.BAdam(m.parameters(), N, lr=1e-2, prior_prec=1.0, seed=3, compile=c), False),
    "vogn_momentum": (
        lambda m, c: ngvi.VOGN(m, N, lr=1e-2, beta=0.05, momentum=0.5, init_prec=50.0, seed=3, compile=c),
        False,
    ),
    "bbvi": (lambda m, c: BBVI(m, N, lr=1e-2, seed=3, compile=c), False),
}


def train(name: str, compile: bool):
    factory, bias = RULES[name]
    torch.manual_seed(0)
    model = nn.Linear(3, 2, bias=bias).double()
    opt = factory(model, compile)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (1.0 + 0.1 * t))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(16, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(16, 2, generator=gen, dtype=torch.float64)

    def closure():
        opt.zero_grad()
        loss = torch.log(torch.cosh(model(x) - y)).sum(1).mean()
        loss.backward()
        return loss

    graphs = []
    for i in range(STEPS):
        strict = compile and i >= 2
        with torch._dynamo.config.patch(error_on_recompile=True) if strict else contextlib.nullcontext():
            opt.step(closure)
        sched.step()
        graphs.append(counters["stats"]["unique_graphs"])
    return opt, opt.posterior(), graphs


@pytest.mark.parametrize("name", list(RULES))
def test_compiled_rule_agrees_with_eager_and_does_not_recompile(name):
    _, eager, _ = train(name, compile=False)
    opt, compiled, graphs = train(name, compile=True)
    assert graphs[2] == graphs[-1], f"graphs compiled after warm-up: {graphs}"
    for a, b in zip(compiled.mean + compiled.variance, eager.mean + eager.variance, strict=True):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=1e-15)
    # the compiled functions live in a module-level cache, not on the optimizer
    for clone in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))):
        assert clone.compile is True
        assert clone.state_dict()["ngvi"]["num_steps"] == STEPS


@pytest.mark.parametrize("name", ["vadam", "ivon"])
def test_a_prior_learned_by_empirical_bayes_does_not_recompile(name):
    """Empirical Bayes writes a new λ into the group every ``every`` steps (IVON: as weight_decay = λ/N);
    the compiled core reads hyperparameters as tensors, so a new value is a new input, not a new graph."""
    cls = {"vadam": ngvi.Vadam, "ivon": ngvi.IVON}[name]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    opt = cls(model.parameters(), 64, seed=0, compile=True, empirical_bayes=EmpiricalBayes(every=5))
    key = "weight_decay" if name == "ivon" else "prior_prec"

    def closure():
        opt.zero_grad()
        loss = (model(x) - y).square().mean()
        loss.backward()
        return loss

    seen = set()
    for i in range(40):
        with torch._dynamo.config.patch(error_on_recompile=True) if i >= 2 else contextlib.nullcontext():
            opt.step(closure)
        seen.add(float(opt.param_groups[0][key]))
    assert len(seen) >= 5, seen  # λ did change, so the test would have seen a recompile
