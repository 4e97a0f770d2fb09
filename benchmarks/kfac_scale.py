"""Issue 32, item 1: the K-FAC family's defaults against the likelihood's scale and the data size.

``python benchmarks/kfac_scale.py [steps]``: an 8-D regression (1,000 points, f(x) = sin(x·w₁) + tanh(x·w₂),
Gaussian noise s.d. σ), an MLP 8-64-64-1 (tanh), batch 50, the loss mse/(2σ²) (the Gaussian NLL), for
σ ∈ {0.05, 0.3, 1, 3}, and a 4-class cross-entropy problem; every member with its defaults, data_size N from
10² to 10⁵; prints the first step's ‖Δμ‖, the first 20 steps' largest, and the train loss after ``steps``
(or the step at which it diverged), beside Adam (lr 1e-3) on the same batches.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

import ngvi

N_TRAIN, D, BATCH = 1000, 8, 50


def problem(kind: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N_TRAIN, D, generator=gen)
    w1, w2 = torch.randn(D, 1, generator=gen) / D**0.5, torch.randn(D, 1, generator=gen) / D**0.5
    f = torch.sin(2 * x @ w1) + torch.tanh(x @ w2)
    if kind == "ce":
        y = (f.squeeze(1) * 1.5 + 2).clamp(0, 3.999).floor().long()
        return x, y, lambda out, yb: nn.functional.cross_entropy(out, yb), 4
    sigma = float(kind)
    y = f + sigma * torch.randn(N_TRAIN, 1, generator=gen)
    return x, y, lambda out, yb: (out - yb).square().mean() / (2 * sigma**2), 1


def model(outputs: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, outputs))


MAKERS = {
    "noisy_kfac": lambda m, n: ngvi.NoisyKFAC(m, n, seed=0),
    "nng_blktri": lambda m, n: ngvi.NNGBlkTri(m, n, seed=0),
    "kfac": lambda m, n: ngvi.baselines.KFAC(m, n, seed=0),
    "adam": lambda m, n: torch.optim.Adam(m.parameters(), lr=1e-3),
}


def run(name: str, kind: str, n: int, steps: int) -> dict:
    x, y, loss_fn, outputs = problem(kind)
    net = model(outputs)
    opt = MAKERS[name](net, n)
    order = torch.Generator().manual_seed(1)
    norms, diverged = [], None
    params = [p for p in net.parameters()]
    for t in range(steps):
        idx = torch.randint(0, N_TRAIN, (BATCH,), generator=order)

        def closure(xb=x[idx], yb=y[idx]):
            opt.zero_grad()
            loss = loss_fn(net(xb), yb)
            loss.backward()
            return loss

        before = [p.detach().clone() for p in params] if t < 20 else None
        try:
            opt.step(closure)
        except FloatingPointError:
            diverged = t + 1
            break
        if before is not None:
            means = [getattr(opt, "mean_of", lambda p: p)(p) for p in params]
            norms.append(
                sum((m - b).square().sum() for m, b in zip(means, before, strict=True)).sqrt().item()
            )
    with torch.no_grad():
        final = loss_fn(net(x), y).item() if diverged is None else float("nan")
    return {
        "first": norms[0] if norms else float("nan"),
        "max20": max(norms, default=float("nan")),
        "loss": final,
        "diverged": diverged,
    }


def main(steps: int = 1000) -> None:
    for kind in ("0.05", "0.3", "1", "3", "ce"):
        for n in (100, 1000, 100_000):
            for name in MAKERS:
                if name == "adam" and n != 1000:
                    continue
                r = run(name, kind, n, steps)
                print(
                    f"{kind:>5} N={n:<7} {name:<11} |Δμ|₁={r['first']:.3g} max₂₀={r['max20']:.3g} "
                    f"loss={r['loss']:.4g} diverged@{r['diverged']}",
                    flush=True,
                )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
