"""Issue 32, item 1: every posterior rule's defaults against the likelihood's scale and the data size.

``python benchmarks/scale_grid.py [steps] [--rules a,b] [--kinds 0.05,ce] [--sizes 1e2,1e6] [--json out]``:
an 8-D regression (400 training and 1,000 test points, f(x) = sin(x·w₁) + tanh(x·w₂), Gaussian noise s.d.
σ ∈ {0.05, 0.3, 1, 3}, the loss mse/(2σ²), the Gaussian NLL up to a constant) and a 4-class problem from the
same f (cross-entropy), an MLP 8-32-32-k (tanh), batches of 40, ``steps`` steps (default 300), each rule built
with ``data_size`` N and nothing else, N ∈ {10², 10³, 10⁴, 10⁵, 10⁶} (N may exceed the data: it emulates a
larger data set). Beside them Adam (lr 10⁻³) on the same batches. Per cell: whether it diverged (a non-finite
step, or a train loss at the mean above 10× the starting loss), the first step's ‖Δμ‖ and the largest of the
first 20, the train loss at the mean, the test NLL of the predictive (16 draws; the Gaussian with the noise σ
added, or the mean of the class probabilities), the 95% coverage (regression), and the largest σ of q over
the prior's 1/√λ. One thread.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
from torch import nn

import ngvi

N_TRAIN, N_TEST, D, HIDDEN, BATCH = 400, 1000, 8, 32, 40
KINDS = ("0.05", "0.3", "1", "3", "ce")
SIZES = (100, 1_000, 10_000, 100_000, 1_000_000)

#: every posterior rule with its defaults (the model-taking ones hook its layers); KFAC is a point estimate
MAKERS = {
    "vadam": lambda m, n: ngvi.Vadam(m.parameters(), n, seed=0),
    "vprop": lambda m, n: ngvi.Vprop(m.parameters(), n, seed=0),
    "von": lambda m, n: ngvi.VON(m.parameters(), n, seed=0),
    "vogn": lambda m, n: ngvi.VOGN(m, n, seed=0),
    "vadagrad": lambda m, n: ngvi.VadaGrad(m.parameters(), seed=0),
    "ivon": lambda m, n: ngvi.IVON(m.parameters(), n, seed=0),
    "noisy_adam": lambda m, n: ngvi.NoisyAdam(m.parameters(), n, seed=0),
    "badam": lambda m, n: ngvi.BAdam(m.parameters(), n, seed=0),
    "noisy_kfac": lambda m, n: ngvi.NoisyKFAC(m, n, seed=0),
    "nng_blktri": lambda m, n: ngvi.NNGBlkTri(m, n, seed=0),
    "kfac": lambda m, n: ngvi.baselines.KFAC(m, n, seed=0),
    "adam": lambda m, n: torch.optim.Adam(m.parameters(), lr=1e-3),
}
#: the prior precision λ each rule's default implies (σ of q should not exceed 1/√λ); None: no prior
PRIOR = {"vadam": 1.0, "vprop": 1.0, "von": 1.0, "vogn": 1.0, "noisy_adam": 1.0, "badam": None,
         "ivon": None, "vadagrad": None, "noisy_kfac": None, "nng_blktri": None}  # fmt: skip


def problem(kind: str, seed: int = 0):
    """(x, y, x_test, y_test, loss, outputs)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N_TRAIN + N_TEST, D, generator=gen)
    w1, w2 = torch.randn(D, 1, generator=gen) / D**0.5, torch.randn(D, 1, generator=gen) / D**0.5
    f = torch.sin(2 * x @ w1) + torch.tanh(x @ w2)
    if kind == "ce":
        y = (f.squeeze(1) * 1.5 + 2).clamp(0, 3.999).floor().long()
        loss, outputs = nn.functional.cross_entropy, 4
    else:
        sigma = float(kind)
        y = f + sigma * torch.randn(len(x), 1, generator=gen)
        loss, outputs = (lambda out, yb, s=sigma: (out - yb).square().mean() / (2 * s**2)), 1
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:], loss, outputs


def model(outputs: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(D, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, outputs)
    )


def predictive(kind: str, net, opt, x_test, y_test, bayes: bool) -> tuple[float, float | None]:
    """(test NLL, 95% coverage or None) of the predictive from 16 draws (the mean alone if not ``bayes``)."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        out = ngvi.predict(net, opt, x_test, samples=16, generator=gen) if bayes else net(x_test)[None]
    if kind == "ce":
        probs = out.softmax(-1).mean(0)
        return -probs.gather(1, y_test[:, None]).clamp_min(1e-12).log().mean().item(), None
    sigma = float(kind)
    mean, var = out.mean(0), out.var(0, unbiased=False) + sigma**2
    z = (y_test - mean) / var.sqrt()
    nll = (0.5 * z.square() + 0.5 * var.log() + 0.5 * math.log(2 * math.pi)).mean().item()
    return nll, (z.abs() <= 1.959964).float().mean().item()


def run(name: str, kind: str, n: int, steps: int) -> dict:
    x, y, x_test, y_test, loss_fn, outputs = problem(kind)
    net = model(outputs)
    opt = MAKERS[name](net, n)
    order = torch.Generator().manual_seed(1)
    params = list(net.parameters())
    mean_of = getattr(opt, "mean_of", lambda p: p)
    with torch.no_grad():
        start = loss_fn(net(x), y).item()
    norms, diverged, t0 = [], None, time.process_time()
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
        except (FloatingPointError, RuntimeError) as err:  # NonFiniteGradientError is a FloatingPointError
            diverged = f"step {t + 1}: {type(err).__name__}"
            break
        if before is not None:
            norms.append(
                sum((mean_of(p) - b).square().sum() for p, b in zip(params, before, strict=True))
                .sqrt()
                .item()
            )
    seconds = time.process_time() - t0
    with torch.no_grad():
        final = loss_fn(net(x), y).item() if diverged is None else float("nan")
    if diverged is None and not (math.isfinite(final) and final <= 10 * start):
        diverged = f"loss {start:.3g} -> {final:.3g}"
    bayes = name not in ("adam", "kfac")
    row = {"rule": name, "kind": kind, "n": n, "start": start, "loss": final, "diverged": diverged,
           "first": norms[0] if norms else float("nan"), "max20": max(norms, default=float("nan")),
           "seconds": seconds}  # fmt: skip
    if diverged is None:
        row["test_nll"], row["coverage"] = predictive(kind, net, opt, x_test, y_test, bayes)
        if bayes:
            sd = torch.cat([v.reshape(-1) for v in opt.posterior().variance]).sqrt()
            row["sd_max"], row["sd_median"] = sd.max().item(), sd.median().item()
            row["sd_finite"] = bool(torch.isfinite(sd).all() and (sd > 0).all())
            if PRIOR.get(name):
                row["sd_over_prior"] = row["sd_max"] * math.sqrt(PRIOR[name])
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", nargs="?", type=int, default=300)
    parser.add_argument("--rules", default=",".join(MAKERS))
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for kind in args.kinds.split(","):
        for n in (int(float(s)) for s in args.sizes.split(",")):
            for name in args.rules.split(","):
                r = run(name, kind, n, args.steps)
                rows.append(r)
                nan = float("nan")
                print(
                    f"{kind:>5} N={n:<8.0e} {name:<11} start={r['start']:<8.3g} loss={r['loss']:<9.4g} "
                    f"nll={r.get('test_nll', nan):<8.4g} cov={r.get('coverage') or nan:<6.3f} "
                    f"|Δμ|₁={r['first']:<8.3g} max₂₀={r['max20']:<8.3g} sd_max={r.get('sd_max', nan):<8.3g} "
                    f"{'DIVERGED ' + r['diverged'] if r['diverged'] else ''}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
