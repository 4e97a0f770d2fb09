"""Property tests: over arbitrary gradient sequences, every rule keeps the posterior precision positive and
finite (VON and IVON by their Riemannian correction, the others by construction)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ngvi

RULES = {
    "vadam": lambda p: ngvi.Vadam([p], 50, lr=0.1, init_prec=10.0),
    "vprop": lambda p: ngvi.Vprop([p], 50, lr=0.1, beta=0.5, init_prec=10.0),
    "vadagrad": lambda p: ngvi.VadaGrad([p], lr=0.1, beta=1.0),
    "von": lambda p: ngvi.VON([p], 50, lr=0.1, beta=0.9, init_prec=10.0),
    "von_full_step": lambda p: ngvi.VON([p], 50, lr=0.1, beta=1.0, init_prec=10.0),
    "ivon": lambda p: ngvi.IVON([p], 50, lr=0.1, betas=(0.9, 0.5), hess_init=0.1),
    "noisy_adam": lambda p: ngvi.NoisyAdam([p], 50, lr=0.1),
    "badam": lambda p: ngvi.BAdam([p], 50, lr=0.1),
}

gradients = st.lists(
    st.lists(st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False), min_size=4, max_size=4),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(rule=st.sampled_from(sorted(RULES)), grads=gradients, seed=st.integers(0, 2**16))
def test_precision_stays_positive_and_finite(rule, grads, seed):
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    opt = RULES[rule](p)
    opt.seed = seed
    for g in grads:
        with opt.sampled_params(train=True):
            p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        precision = opt.posterior().precision[0]
        assert torch.isfinite(precision).all() and (precision > 0).all(), (rule, precision)
        assert torch.isfinite(p).all()
