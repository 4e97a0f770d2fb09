"""Issue 32, item 3b: what ``ngvi.calibrate`` buys on the issue's 8-D regression.

``python benchmarks/calibrate_gain.py [--steps 2000] [--out FILE.json]``: f(x) = sin(2x·w₁) + tanh(x·w₂),
x ~ N(0, I₈), Gaussian noise s.d. 0.3; 1,000 training points, 500 validation and 2,000 test points from the
same distribution; an MLP 8-64-64-1 (tanh), batches of 50, every rule with its defaults (VON at lr 0.01, as
in the issue). Three settings: the loss mse/(2·0.3²) with the default prior ("defaults"), the same with
a prior 10³ times too strong or too weak ("λ ×10³", "λ ×10⁻³": ``prior_prec`` times 10^±3, IVON's
``weight_decay`` the same), and the loss mse/2 (the noise taken as 1, "loss σ = 1") with the default prior.
``ngvi.calibrate`` fits the noise s.d. alone (``fit_prior=False``), then λ and the noise s.d. together, on
the validation split (32 draws); the table gives the test NLL (nats, 64 draws of ``ngvi.predict``) and the
95% coverage before (noise s.d. as the loss assumed: 0.3, or 1), with σ alone, and with both.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
from torch import nn
from tqdm import tqdm

import ngvi
from ngvi import metrics
from ngvi.report import pit

D, N_TRAIN, N_VAL, N_TEST, BATCH, NOISE = 8, 1000, 500, 2000, 50, 0.3

RULES = {
    "Vadam": lambda m, n, lam: ngvi.Vadam(m.parameters(), n, prior_prec=lam, seed=0),
    "Vprop": lambda m, n, lam: ngvi.Vprop(m.parameters(), n, prior_prec=lam, seed=0),
    "VON": lambda m, n, lam: ngvi.VON(m.parameters(), n, lr=0.01, prior_prec=lam, seed=0),
    "VOGN": lambda m, n, lam: ngvi.VOGN(m, n, prior_prec=lam, seed=0),
    "IVON": lambda m, n, lam: ngvi.IVON(m.parameters(), n, weight_decay=1e-4 * lam, seed=0),
    "noisy Adam (ef)": lambda m, n, lam: ngvi.NoisyAdam(m, n, curvature="ef", prior_prec=lam, seed=0),
    "BAdam": lambda m, n, lam: ngvi.BAdam(m.parameters(), n, prior_prec=lam, seed=0),
}
#: (prior multiple, the noise s.d. the loss assumes)
SETTINGS = {
    "defaults": (1.0, NOISE),
    "λ ×10³": (1e3, NOISE),
    "λ ×10⁻³": (1e-3, NOISE),
    "loss σ = 1": (1.0, 1.0),
}


def split(n: int, gen: torch.Generator, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, D, generator=gen)
    f = torch.sin(2 * x @ w[:, :1]) + torch.tanh(x @ w[:, 1:])
    return x, f + NOISE * torch.randn(n, 1, generator=gen)


def data() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(D, 2, generator=gen) / D**0.5
    return {name: split(n, gen, w) for name, n in (("train", N_TRAIN), ("val", N_VAL), ("test", N_TEST))}


def train(rule: str, prior: float, loss_noise: float, sets, steps: int):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = RULES[rule](model, N_TRAIN, prior)
    x, y = sets["train"]
    order = torch.Generator().manual_seed(1)
    for _ in range(steps):
        idx = torch.randint(0, N_TRAIN, (BATCH,), generator=order)

        def closure(xb=x[idx], yb=y[idx]):
            opt.zero_grad()
            loss = (model(xb) - yb).square().mean() / (2 * loss_noise**2)
            loss.backward()
            return loss

        opt.step(closure)
    return model, opt


def test_numbers(model, opt, sets, noise_std: float) -> dict[str, float]:
    x, y = sets["test"]
    f = ngvi.predict(model, opt, x, 64)
    u = pit(f, y, noise_std)
    return {
        "nll": -metrics.gaussian_log_likelihood(f, y, 1 / noise_std**2),
        "coverage_95": float(((u - 0.5).abs() <= 0.475).double().mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sets = data()
    rows = []
    jobs = [(rule, setting) for setting in SETTINGS for rule in RULES]
    for rule, setting in tqdm(jobs, desc="train + calibrate"):
        prior, loss_noise = SETTINGS[setting]
        model, opt = train(rule, prior, loss_noise, sets, args.steps)
        before = test_numbers(model, opt, sets, loss_noise)
        noise_only = ngvi.calibrate(model, opt, sets["val"], noise_std=loss_noise, fit_prior=False)
        sigma_only = test_numbers(model, opt, sets, noise_only.noise_std)
        start = time.perf_counter()
        cal = ngvi.calibrate(model, opt, sets["val"], noise_std=loss_noise)
        seconds = time.perf_counter() - start
        after = test_numbers(model, opt, sets, cal.noise_std)
        rows.append(
            {"rule": rule, "setting": setting, "prior_before": cal.prior_prec_before[0],
             "prior_after": cal.prior_prec, "noise_after": cal.noise_std, "loss_noise": loss_noise,
             "noise_only": noise_only.noise_std, "before": before, "sigma_only": sigma_only,
             "after": after, "val_nll_before": cal.nll_before, "val_nll_after": cal.nll_after,
             "seconds": seconds}
        )  # fmt: skip
    print("| setting | method | λ before → after | σ: alone, with λ | test NLL: before, σ alone, λ and σ | "
          "95% coverage: before, σ alone, λ and σ | calibrate (s) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['setting']} | {r['rule']} | {r['prior_before']:.3g} → {r['prior_after']:.3g} | "
            f"{r['noise_only']:.3f}, {r['noise_after']:.3f} | {r['before']['nll']:.3f}, "
            f"{r['sigma_only']['nll']:.3f}, {r['after']['nll']:.3f} | {r['before']['coverage_95']:.3f}, "
            f"{r['sigma_only']['coverage_95']:.3f}, {r['after']['coverage_95']:.3f} | {r['seconds']:.1f} |"
        )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"steps": args.steps, "rows": rows}, f, indent=1)
    finite = [r for r in rows if math.isfinite(r["after"]["nll"])]
    print(f"{len(finite)} of {len(rows)} rows finite after calibration")


if __name__ == "__main__":
    main()
