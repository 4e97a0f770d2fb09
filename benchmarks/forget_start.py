"""Issue 44, item 1: how fast each diagonal rule's defaults forget their curvature start, by ``forget_start``.

Bayesian linear regression with features that are identically zero in the training data (their weights are
constrained by the prior alone), against the exact mean-field posterior
(:func:`ngvi.baselines.exact.linear_regression_mean_field`). Every rule is built with ``data_size`` and
``prior_prec`` and nothing else, except the candidate (:mod:`ngvi.optim.forgetting`):

* ``constant``: ``forget_start=None``, the rule's constant curvature weight ρ (the rules before issue 44);
* ``early 1e-2``, ``early 3e-3 (auto)`` (``"auto"``, IVON's and noisy Adam's default): ρₑ until the
  start's precision is 1% of the prior's, then ρ;
* ``running t0=0/1/10``: a running average ρ_t = max(ρ, 1/(t₀ + t)) (Adam's bias correction for t₀ = 0,
  i.e. the start taken from the first estimates; the start counted as t₀ estimates otherwise), set from
  outside through the group's β as a scheduler would (not for Vadam and Vprop, whose step's bias
  correction this would not follow);
* IVON also with a faster constant β₂ = 0.999.

The lr follows a cosine decay to 0 over the run
(CHOOSING's advice); full batch for the rules with a true curvature (VON, IVON, VOGN), batches of one for
the squared-gradient rules (Vadam, Vprop, noisy Adam: their ĝ² is the per-example EF only at M = 1,
Khan et al. 2018 Thm. 1). Columns at each checkpoint: the worst constrained mean error in exact posterior
s.d., the worst constrained precision error, and the smallest variance of an unconstrained weight as a
fraction of the prior's (the target 1).

    python benchmarks/forget_start.py --steps 4000 --out benchmarks/forget_start.json   # ≈ 4 CPU-min
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from torch import nn

import ngvi
from ngvi.baselines.exact import linear_regression_mean_field

N, D, ZERO, TAU, LAM = 200, 6, (4, 5), 4.0, 1.0
#: name → (forget_start, the running average's t₀ or None)
CANDIDATES = {
    "constant": (None, None),
    "early 1e-2": (1e-2, None),
    "early 3e-3 (auto)": ("auto", None),
    "running t0=0": (None, 0.0),
    "running t0=1": (None, 1.0),
    "running t0=10": (None, 10.0),
}
RULES = {
    "vadam": (lambda m, t0, **kw: ngvi.Vadam(m.parameters(), N, prior_prec=LAM, forget_start=t0, **kw), 1),
    "vprop": (lambda m, t0, **kw: ngvi.Vprop(m.parameters(), N, prior_prec=LAM, forget_start=t0, **kw), 1),
    "noisy_adam": (
        lambda m, t0, **kw: ngvi.NoisyAdam(m.parameters(), N, prior_prec=LAM, forget_start=t0, **kw),
        1,
    ),
    "von": (lambda m, t0, **kw: ngvi.VON(m.parameters(), N, prior_prec=LAM, forget_start=t0, **kw), N),
    "vogn": (lambda m, t0, **kw: ngvi.VOGN(m, N, prior_prec=LAM, forget_start=t0, **kw), N),
    "ivon": (lambda m, t0, **kw: ngvi.IVON(m.parameters(), N, prior_prec=LAM, forget_start=t0, **kw), N),
}
#: the rules whose curvature weight a scheduler can set from outside (the running-average candidates)
RUNNING_OK = ("noisy_adam", "von", "vogn", "ivon")
#: Vadam and Vprop step in Adam units: 10⁻², the top of CHOOSING's "your Adam lr" (10⁻³ does not reach the
#: posterior mean in these step counts at batch size 1)
LR = {"vadam": {"lr": 1e-2}, "vprop": {"lr": 1e-2}}


def problem(seed: int = 0, tau: float = TAU):
    """(x [N, D] with the ZERO columns 0, y [N, 1], the exact mean-field posterior of [w, b])."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=gen, dtype=torch.float64)
    x[:, list(ZERO)] = 0.0
    w = torch.randn(D, 1, generator=gen, dtype=torch.float64)
    y = x @ w + 0.5 + torch.randn(N, 1, generator=gen, dtype=torch.float64) / math.sqrt(tau)
    design = torch.cat([x, torch.ones(N, 1, dtype=torch.float64)], 1)
    exact = linear_regression_mean_field(design, y[:, 0], tau, LAM)
    return x, y, exact.mean[0], exact.variance[0]


def errors(opt, mean, var) -> dict[str, float]:
    post = opt.posterior()
    q_mean = torch.cat([post.mean[0].reshape(-1), post.mean[1].reshape(-1)])
    q_var = torch.cat([post.variance[0].reshape(-1), post.variance[1].reshape(-1)])
    free = torch.zeros(D + 1, dtype=torch.bool)
    free[list(ZERO)] = True
    z = ((q_mean - mean) / var.sqrt())[~free].abs().max().item()
    prec = ((var / q_var) - 1)[~free].abs().max().item()
    return {
        "mean_sd": z,
        "prec_rel": prec,
        "free_var_ratio": (q_var[free] * LAM).min().item(),
        "free_mean_sd": (q_mean[free] * math.sqrt(LAM)).abs().max().item(),
    }


def running_average(opt, t: int, t0: float) -> None:
    """ρ_t = max(ρ, 1/(t₀ + t)) written into the group's curvature weight before step t."""
    for group in opt.param_groups:
        rate = group.setdefault("_rate", 1 - group["betas"][1] if "betas" in group else group["beta"])
        now = max(rate, 1.0 / (t0 + t)) if t0 + t > 0 else rate
        if "betas" in group:
            group["betas"] = (group["betas"][0], 1 - now)
        else:
            group["beta"] = now


def run(rule: str, variant: str, steps: int, seed: int = 0, tau: float = TAU, **kw) -> dict[str, object]:
    make, batch = RULES[rule]
    x, y, mean, var = problem(seed, tau)
    torch.manual_seed(seed)
    model = nn.Linear(D, 1).double()
    forget, t0 = CANDIDATES.get(variant, (None, None))
    opt = make(model, forget, seed=seed, **kw)
    cosine = lambda t: 0.5 * (1 + math.cos(math.pi * min(t, steps) / steps))  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine)
    gen = torch.Generator().manual_seed(seed + 1)
    order = torch.randperm(N, generator=gen)
    marks, out, pos = {steps // 4, steps // 2, steps}, {}, 0

    def closure():
        opt.zero_grad()
        loss = 0.5 * tau * (model(xb) - yb).square().mean()
        loss.backward()
        return loss

    start = time.perf_counter()
    for t in range(1, steps + 1):
        if batch == N:
            xb, yb = x, y
        else:
            if pos + batch > N:
                order, pos = torch.randperm(N, generator=gen), 0
            idx = order[pos : pos + batch]
            pos += batch
            xb, yb = x[idx], y[idx]
        if t0 is not None:
            running_average(opt, t, t0)
        opt.step(closure)
        sched.step()
        if t in marks:
            out[t] = errors(opt, mean, var)
    return {
        "rule": rule,
        "variant": variant,
        "steps": steps,
        "tau": tau,
        "seed": seed,
        "options": {k: str(v) for k, v in kw.items()},
        "seconds": time.perf_counter() - start,
        "at": out,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--tau", type=float, default=TAU)
    parser.add_argument("--rules", default=",".join(RULES))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/forget_start.json"))
    args = parser.parse_args()
    rows = []
    for rule in args.rules.split(","):
        variants = [(name, {}) for name, (_, t0) in CANDIDATES.items() if t0 is None or rule in RUNNING_OK]
        if rule == "ivon":
            variants.append(("constant, beta2=0.999", {"betas": (0.9, 0.999)}))
        for name, kw in variants:
            for seed in range(args.seeds):
                r = run(rule, name, args.steps, seed, args.tau, **{**LR.get(rule, {}), **kw})
                rows.append(r)
                cells = "  ".join(
                    f"[{t}] z {e['mean_sd']:.2f} P {e['prec_rel']:.2f} free {e['free_var_ratio']:.3f}"
                    for t, e in r["at"].items()
                )
                print(f"{rule:10s} {name:22s} seed {seed}: {cells} ({r['seconds']:.1f}s)", flush=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
