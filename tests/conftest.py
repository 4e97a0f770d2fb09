"""Shared helpers: the data folder and a small model with its batch. Every trainer, with its closure and
training loop, is described once in optimizer_db.py."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]

# Child processes (tests/golden's pinned runs) import ngvi from this checkout's src/, as pytest does
# (pythonpath = ["src"]), not from wherever the environment installed it (another worktree's, say).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))

# pytest-xdist runs two workers on two cores; one torch thread each avoids oversubscription (small ops
# slow down 5-20x when two processes each spin two threads)
torch.set_num_threads(1)


def _data_root() -> Path:
    """The benchmark data: $NGVI_DATA, else ../shared/data beside the checkout (as in CI)."""
    return Path(os.environ.get("NGVI_DATA", REPO.parent / "shared" / "data"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "data(*parts): the test needs these parts of the benchmark data (see the data_dir fixture)"
    )


def need_data(*parts: str) -> Path:
    """The benchmark data folder, or a skip (with the reason) when it, or one of ``parts``, is missing. For
    fixtures wider than a test; a test takes the ``data_dir`` fixture."""
    root = _data_root()
    if not (root / "SHA256SUMS").is_file():
        pytest.skip(f"no benchmark data in {root}: set NGVI_DATA or put it in ../shared/data")
    missing = [p for p in parts if not (root / p).exists()]
    if missing:
        pytest.skip(f"no {', '.join(missing)} in the benchmark data in {root}")
    return root


@pytest.fixture
def data_dir(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The benchmark data folder, the way a test gets it: skips the test, with the reason, when the folder
    (or a part named by ``@pytest.mark.data("uci", ...)``) is missing. Sets $NGVI_DATA to it."""
    marker = request.node.get_closest_marker("data")
    root = need_data(*(marker.args if marker else ()))
    monkeypatch.setenv("NGVI_DATA", str(root))
    return root


@pytest.fixture(autouse=True)
def _no_data_unless_asked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that reads the data without the data_dir fixture fails everywhere, not only where the data
    is missing: it finds no $NGVI_DATA."""
    if "data_dir" not in request.fixturenames:
        monkeypatch.delenv("NGVI_DATA", raising=False)


def make_mlp(seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)).to(dtype)


def regression_batch(seed: int = 1, n: int = 16, dtype: torch.dtype = torch.float64):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=gen, dtype=dtype)
    y = torch.sin(x.sum(1, keepdim=True)) + 0.1 * torch.randn(n, 1, generator=gen, dtype=dtype)
    return x, y


def bayesian_linear_regression(n: int = 400, d: int = 4, tau: float = 2.0, prior: float = 1.0, seed: int = 0):
    """y = xw + 0.7 + noise of precision τ on correlated features, float64; → (x, y, [x, 1], the exact
    posterior precision τ[x,1]ᵀ[x,1] + λI, the exact posterior mean)."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.eye(d) + 0.4 * torch.randn(d, d, generator=g)  # correlated features
    x = (torch.randn(n, d, generator=g) @ mix).double()
    w = torch.randn(d, 1, generator=g).double()
    y = x @ w + 0.7 + torch.randn(n, 1, generator=g).double() / math.sqrt(tau)
    xb = torch.cat([x, torch.ones(n, 1, dtype=torch.float64)], 1)  # the bias is the weight of a 1
    precision = tau * xb.T @ xb + prior * torch.eye(d + 1, dtype=torch.float64)
    mean = torch.linalg.solve(precision, tau * xb.T @ y).squeeze(1)
    return x, y, xb, precision, mean


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


@pytest.fixture
def injected_noise(monkeypatch):
    """Every ε read in order from one fixed standard-normal sequence, whatever the tensor it fills."""
    sequence = torch.randn(1 << 16, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    position = [0]

    def fill(self, out, segments=None):
        start, position[0] = position[0], position[0] + out.numel()
        return out.copy_(sequence[start : position[0]].view(out.shape))

    def restart():
        position[0] = 0

    from ngvi.optim.engine import noise as noise_module

    monkeypatch.setattr(noise_module.NoiseSource, "_fill", fill)
    return restart
