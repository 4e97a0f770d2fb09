"""The measurements behind docs/CHOOSING.md's "Why the defaults are what they are" (issue 15).

    PYTHONPATH=src:tests/optim python docs/results/defaults/measure.py > docs/results/defaults/measured.md

(1–2 min wall on one thread of the shared 2-core machine.)

On the issue's toy (tests/optim/test_defaults.py: 512 × 8 inputs, linear target, 8-32-1 ReLU MLP, batch 64):

1. Vadam's ablation, seeds 0–2, train MSE after 40 and 200 steps and the median σ: without noise
   (σ ≈ 10⁻⁶), with σ held at a constant, and at init_prec = 100 with the paper's step (eq. 92) and the
   debiased one.
2. Long runs, 3000 steps, seeds 0–1, at the defaults with a constant lr and with a cosine decay to 0, and
   VOGN / noisy K-FAC with the true Fisher: train MSE and the median σ at steps 200, 1000, 3000.
"""

from __future__ import annotations

import warnings

import torch
from test_defaults import BATCH, DEFAULTS, N, toy_data, toy_model

import ngvi

ADAM = lambda m, s: torch.optim.Adam(m.parameters(), lr=1e-2)  # noqa: E731


class FixedSigma(ngvi.Vadam):
    """Vadam whose samples use a constant σ (the update is Vadam's): the cost of the noise alone."""

    sigma = 1.0

    def _precision_core(self, group, states):
        core, lists, hyper = super()._precision_core(group, states)
        return core, lists, {**hyper, "scale": 0.0, "shift": self.sigma**-2}


def fixed(sigma: float):
    return lambda m, s: type("Fixed", (FixedSigma,), {"sigma": sigma})(
        m.parameters(), N, lr=1e-2, init_prec=None, seed=s
    )


def run(
    make, seed: int, steps: int, at: tuple[int, ...], cosine: bool = False
) -> dict[int, tuple[float, float]]:
    """{step: (train MSE at the mean, median σ)}; NaN after a divergence."""
    x, y = toy_data()
    model = toy_model(seed)
    opt = make(model, seed)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps) if cosine else None
    order = torch.Generator().manual_seed(100 + seed)
    out, k = {}, 0
    while k < steps:
        for idx in torch.randperm(N, generator=order).split(BATCH):

            def closure(xb=x[idx], yb=y[idx]):
                opt.zero_grad()
                o = model(xb)
                loss = 0.5 * (o - yb).square().mean()
                backward = getattr(opt, "backward", None)
                backward(loss, o) if backward else loss.backward()
                return loss

            try:
                opt.step(closure)
            except ngvi.NonFiniteGradientError:
                return {**{t: (float("nan"), float("nan")) for t in at}, **out}
            k += 1
            if sched:
                sched.step()
            if k in at:
                with torch.no_grad():
                    mse = (model(x) - y).square().mean().item()
                sigma = (
                    opt.diagnostics().sigma_quantiles[0.5] if hasattr(opt, "diagnostics") else float("nan")
                )
                out[k] = (mse, sigma)
            if k == steps:
                break
    return out


def main() -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    print("## 1. Vadam on the toy: train MSE after 40 / 200 steps (median σ at 200), seeds 0, 1, 2\n")
    print("| setting | seed 0 | seed 1 | seed 2 |\n|---|---|---|---|")
    ablation = {
        "Adam, lr 1e-2": ADAM,
        "Vadam without noise (σ ≈ 1e-6)": fixed(1e-6),
        **{f"Vadam, σ held at {s}": fixed(s) for s in (1.0, 0.3, 0.1, 0.03, 0.01)},
        "Vadam, init_prec=None (the old default)": lambda m, s: ngvi.Vadam(
            m.parameters(), N, lr=1e-2, init_prec=None, step_moment="paper", seed=s
        ),
        "Vadam, init_prec=100, step_moment='paper' (eq. 92)": lambda m, s: ngvi.Vadam(
            m.parameters(), N, lr=1e-2, init_prec=100.0, step_moment="paper", seed=s
        ),
        "Vadam, init_prec=100, step_moment='debiased'": lambda m, s: ngvi.Vadam(
            m.parameters(), N, lr=1e-2, init_prec=100.0, seed=s
        ),
        "Vadam, the new defaults (init_prec='auto')": DEFAULTS["vadam"],
    }
    for name, make in ablation.items():
        cells = [run(make, s, 200, (40, 200)) for s in (0, 1, 2)]
        text = [f"{c[40][0]:.3f} / {c[200][0]:.3f} ({c[200][1]:.2g})" for c in cells]
        print(f"| {name} | " + " | ".join(text) + " |", flush=True)
    print("\n## 2. 3000 steps: train MSE (median σ) at steps 200 / 1000 / 3000\n")
    print("| optimizer | schedule | seed 0 | seed 1 |\n|---|---|---|---|")
    fisher = {"curvature": "fisher", "likelihood": "gaussian"}
    long = {
        "Adam": ADAM,
        **DEFAULTS,
        "vogn, true Fisher": lambda m, s: ngvi.VOGN(m, N, seed=s, **fisher),
        "noisy_kfac, true Fisher": lambda m, s: ngvi.NoisyKFAC(m, N, seed=s, **fisher),
    }
    for name, make in long.items():
        for cosine in (False, True):
            if cosine and "Fisher" in name:
                continue
            cells = [run(make, s, 3000, (200, 1000, 3000), cosine) for s in (0, 1)]
            text = [" / ".join(f"{c[t][0]:.3f} ({c[t][1]:.2g})" for t in (200, 1000, 3000)) for c in cells]
            print(f"| {name} | {'cosine' if cosine else 'constant'} | " + " | ".join(text) + " |", flush=True)


if __name__ == "__main__":
    main()
