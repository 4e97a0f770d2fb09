"""Shared fixtures: small models, closures, and one factory per optimizer for the engine-wide tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import ngvi

REPO = Path(__file__).resolve().parents[1]

# pytest-xdist runs two workers on two cores; one torch thread each avoids oversubscription (small ops
# slow down 5-20x when two processes each spin two threads)
torch.set_num_threads(1)


def data_dir() -> Path:
    """The benchmark data: $NGVI_DATA, else ../shared/data beside the checkout (as in CI)."""
    return Path(os.environ.get("NGVI_DATA", REPO.parent / "shared" / "data"))


# name -> (factory(params), closure needs create_graph)
DIAGONAL_OPTIMIZERS: dict[str, tuple[Callable, bool]] = {
    "vadam": (lambda ps, **kw: ngvi.Vadam(ps, data_size=64, lr=1e-2, init_prec=50.0, **kw), False),
    "vprop": (lambda ps, **kw: ngvi.Vprop(ps, data_size=64, lr=1e-2, init_prec=50.0, **kw), False),
    "vadagrad": (lambda ps, **kw: ngvi.VadaGrad(ps, lr=1e-2, init_prec=100.0, **kw), False),
    "von_price": (
        lambda ps, **kw: ngvi.VON(ps, data_size=64, lr=1e-2, beta=0.05, init_prec=50.0, **kw),
        False,
    ),
    "von_hutchinson": (
        lambda ps, **kw: ngvi.VON(ps, 64, lr=1e-2, beta=0.05, init_prec=50.0, hessian="hutchinson", **kw),
        True,
    ),
    "ivon": (lambda ps, **kw: ngvi.IVON(ps, data_size=64, lr=0.05, hess_init=1.0, **kw), False),
    "noisy_adam": (lambda ps, **kw: ngvi.NoisyAdam(ps, data_size=64, lr=1e-2, **kw), False),
    "badam": (lambda ps, **kw: ngvi.BAdam(ps, data_size=64, lr=1e-2, prior_prec=1.0, **kw), False),
}


@pytest.fixture(params=sorted(DIAGONAL_OPTIMIZERS))
def optimizer_name(request) -> str:
    return request.param


def make_mlp(seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)).to(dtype)


def regression_batch(seed: int = 1, n: int = 16, dtype: torch.dtype = torch.float64):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=gen, dtype=dtype)
    y = torch.sin(x.sum(1, keepdim=True)) + 0.1 * torch.randn(n, 1, generator=gen, dtype=dtype)
    return x, y


def make_closure(model: nn.Module, opt, x, y, create_graph: bool = False) -> Callable:
    def closure():
        opt.zero_grad()
        loss = 0.5 * ((model(x) - y) ** 2).mean()
        loss.backward(create_graph=create_graph)
        return loss

    return closure


def build(name: str, model: nn.Module, **kwargs):
    factory, create_graph = DIAGONAL_OPTIMIZERS[name]
    return factory(model.parameters(), **kwargs), create_graph


def train(model: nn.Module, opt, steps: int, create_graph: bool = False, batch_seed: int = 1) -> None:
    x, y = regression_batch(batch_seed, dtype=next(model.parameters()).dtype)
    closure = make_closure(model, opt, x, y, create_graph)
    for _ in range(steps):
        opt.step(closure)
