"""Shared helpers: the data folder and a small model with its batch. Every trainer, with its closure and
training loop, is described once in optimizer_db.py."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]

# Child processes (tests/golden's pinned runs) import ngvi from this checkout's src/, as pytest does
# (pythonpath = ["src"]), not from wherever the environment installed it (another worktree's, say).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))

# pytest-xdist runs two workers on two cores; one torch thread each avoids oversubscription (small ops
# slow down 5-20x when two processes each spin two threads)
torch.set_num_threads(1)


def data_dir() -> Path:
    """The benchmark data: $NGVI_DATA, else ../shared/data beside the checkout (as in CI)."""
    return Path(os.environ.get("NGVI_DATA", REPO.parent / "shared" / "data"))


def make_mlp(seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)).to(dtype)


def regression_batch(seed: int = 1, n: int = 16, dtype: torch.dtype = torch.float64):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=gen, dtype=dtype)
    y = torch.sin(x.sum(1, keepdim=True)) + 0.1 * torch.randn(n, 1, generator=gen, dtype=dtype)
    return x, y


def fit_full_batch_regression(make, x, y, tau: float, steps: int, decay: float):
    """Bayesian linear regression y ~ N(xw + b, 1/τ) on the whole of (x, y) with the true Fisher: an
    nn.Linear (seeded) and ``make(model, **true_fisher)``, ``steps`` steps with lr decaying as decayᵗ (down
    to 0.5% of its start). Returns the posterior."""
    torch.manual_seed(0)
    model = nn.Linear(x.shape[1], 1).double()
    opt = make(model, curvature="fisher", likelihood="gaussian", noise_prec=tau, seed=0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: max(decay**t, 0.005))

    def closure():
        opt.zero_grad()
        out = model(x)
        return 0.5 * tau * (out - y).square().sum(1).mean(), out

    for _ in range(steps):
        opt.step(closure)
        sched.step()
    return opt.posterior()
