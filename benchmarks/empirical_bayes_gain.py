"""Issue 32, item 3a: what ``empirical_bayes=`` (λ learned in training) buys on the issue's 8-D regression.

``python benchmarks/empirical_bayes_gain.py [--steps 2000] [--out FILE.json]``: the problem, model, data
splits, training loop and test numbers of ``benchmarks/calibrate_gain.py`` (f(x) = sin(2x·w₁) + tanh(x·w₂),
x ~ N(0, I₈), noise s.d. 0.3 known to the loss; 1,000 training and 2,000 test points; MLP 8-64-64-1 tanh;
2,000 steps of batch 50; every rule with its defaults, VON at lr 0.01). Each rule is trained from the
default prior (λ = 1; IVON's δ = 10⁻⁴, λ = 0.1) and from a prior 10³ times too strong, three ways: λ fixed
(off), learned per parameter group (``empirical_bayes=True``: every 100 steps from step 100) and per layer
(``"layer"``, for the rules that take parameters). Test NLL (nats) and 95% coverage from 64 draws of
``ngvi.predict`` with the noise s.d. 0.3; no held-out data is used.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

import ngvi
from ngvi.optim.engine.empirical_bayes import prior_precisions

sys.path.insert(0, str(Path(__file__).parent))
from calibrate_gain import BATCH, N_TRAIN, NOISE, D, data, test_numbers

RULES = {  # (factory, takes parameters: per-layer λ offered)
    "Vadam": (
        lambda m, n, lam, eb: ngvi.Vadam(m.parameters(), n, prior_prec=lam, seed=0, empirical_bayes=eb),
        True,
    ),
    "Vprop": (
        lambda m, n, lam, eb: ngvi.Vprop(m.parameters(), n, prior_prec=lam, seed=0, empirical_bayes=eb),
        True,
    ),
    "VON": (
        lambda m, n, lam, eb: ngvi.VON(
            m.parameters(), n, lr=0.01, prior_prec=lam, seed=0, empirical_bayes=eb
        ),
        True,
    ),
    "VOGN": (lambda m, n, lam, eb: ngvi.VOGN(m, n, prior_prec=lam, seed=0, empirical_bayes=eb), False),
    "IVON": (
        lambda m, n, lam, eb: ngvi.IVON(
            m.parameters(), n, weight_decay=1e-4 * lam, seed=0, empirical_bayes=eb
        ),
        True,
    ),
    "noisy Adam (ef)": (
        lambda m, n, lam, eb: ngvi.NoisyAdam(
            m, n, curvature="ef", prior_prec=lam, seed=0, empirical_bayes=eb
        ),
        False,
    ),
    "noisy K-FAC": (
        lambda m, n, lam, eb: ngvi.NoisyKFAC(m, n, prior_prec=lam, seed=0, empirical_bayes=eb),
        False,
    ),
    "BAdam": (
        lambda m, n, lam, eb: ngvi.BAdam(m.parameters(), n, prior_prec=lam, seed=0, empirical_bayes=eb),
        True,
    ),
}
SETTINGS = {"default prior": 1.0, "prior ×10³": 1e3}


def train(rule: str, prior: float, eb, sets, steps: int):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = RULES[rule][0](model, N_TRAIN, prior, eb)
    x, y = sets["train"]
    order = torch.Generator().manual_seed(1)
    for _ in range(steps):
        idx = torch.randint(0, N_TRAIN, (BATCH,), generator=order)

        def closure(xb=x[idx], yb=y[idx]):
            opt.zero_grad()
            loss = (model(xb) - yb).square().mean() / (2 * NOISE**2)
            opt.backward(loss, None)
            return loss

        opt.step(closure)
    return model, opt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sets = data()
    rows = []
    for setting, prior in SETTINGS.items():
        for rule, (_, per_layer) in RULES.items():
            for mode in ("off", "group", "layer") if per_layer else ("off", "group"):
                start = time.perf_counter()
                model, opt = train(rule, prior, None if mode == "off" else mode, sets, args.steps)
                seconds = time.perf_counter() - start
                lams = prior_precisions(opt)
                row = {"setting": setting, "rule": rule, "mode": mode, "seconds": seconds,
                       "lambda": [min(lams), max(lams)], **test_numbers(model, opt, sets, NOISE)}  # fmt: skip
                rows.append(row)
                print(
                    f"| {setting} | {rule} | {mode} | {min(lams):.3g}–{max(lams):.3g} | {row['nll']:.3f} | "
                    f"{row['coverage_95']:.3f} | {seconds:.1f} |",
                    flush=True,
                )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"steps": args.steps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
