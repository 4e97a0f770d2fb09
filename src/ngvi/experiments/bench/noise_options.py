"""What the engine's noise options buy and cost: generation time, and the statistics of the estimators.

    python -m ngvi.experiments.bench.noise_options --out docs/results/bench/noise.md

Time: drawing one ε for the MLP 784-1000-1000-10 (1.8M parameters), per sample, with torch's CPU generator
(mt19937 + vectorised Box-Muller) in float32 and float64, antithetic pairs (one draw per two samples), and
numpy's generators as candidate "faster generators".

Statistics, on a small tanh MLP regression at a fixed posterior q = N(μ, σ²) (no training, so only the
noise differs): the variance over 4000 pairs of the pair-mean gradient ½(ĝ(θ₁)+ĝ(θ₂)) and of the pair-mean
Price curvature ½(ĥ₁+ĥ₂), ĥ = ĝ⊙ε/σ, for independent pairs and for antithetic pairs (θ₂ = 2μ − θ₁), and the
mean of each estimator against the independent one (antithetic pairs keep each sample exact, so the means
must agree). Then end-to-end: IVON trained for 300 steps with mc_samples=1 from 8 seeds, per noise option;
the spread over seeds of the final μ and σ and the mean deviation from a long reference run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import ngvi


def timeit(fn, n: int = 15) -> float:
    fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def generation_times() -> list[tuple[str, float]]:
    shapes = [(1000, 784), (1000,), (1000, 1000), (1000,), (10, 1000), (10,)]
    f32 = [torch.empty(s) for s in shapes]
    f64 = [torch.empty(s, dtype=torch.float64) for s in shapes]
    gen = torch.Generator().manual_seed(0)
    n = sum(t.numel() for t in f32)
    flat = np.empty(n, dtype=np.float32)

    def draw(tensors):
        return lambda: [t.normal_(generator=gen) for t in tensors]

    def draw_and_cast():
        for t, d in zip(f32, f64, strict=True):
            d.copy_(t.normal_(generator=gen))

    single = timeit(draw(f32))
    pair = single / 2 + timeit(lambda: [t.neg_() for t in f32]) / 2  # one draw and one negation per pair
    rows = [
        ("torch normal_, float32 (default for float32 parameters)", single),
        ("torch normal_, float64 (default for float64 parameters)", timeit(draw(f64))),
        ("noise_dtype=float32 for float64 parameters (draw + cast)", timeit(draw_and_cast)),
        ("noise='antithetic', float32 (average per sample)", pair),
    ]
    for name in ("PCG64", "SFC64", "Philox"):
        rng = np.random.Generator(getattr(np.random, name)(0))
        fill = lambda rng=rng: rng.standard_normal(out=flat, dtype=np.float32)  # noqa: E731
        rows.append((f"numpy {name} standard_normal, float32 (ziggurat)", timeit(fill)))
    return rows


def toy(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 4, generator=gen, dtype=torch.float64)
    y = torch.sin(x.sum(1, keepdim=True)) + 0.1 * torch.randn(64, 1, generator=gen, dtype=torch.float64)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1)).double()
    return model, x, y


def estimator_statistics(pairs: int = 4000) -> dict[str, dict[str, float]]:
    model, x, y = toy()
    params = list(model.parameters())
    mu = [p.detach().clone() for p in params]
    sigma = 0.05
    gen = torch.Generator().manual_seed(1)

    def at(eps):
        with torch.no_grad():
            for p, m, e in zip(params, mu, eps, strict=True):
                p.copy_(m + sigma * e)
        model.zero_grad()
        (0.5 * ((model(x) - y) ** 2).mean() * 100).backward()  # τ = 100
        g = torch.cat([p.grad.flatten() for p in params])
        e = torch.cat([t.flatten() for t in eps])
        return g, g * e / sigma

    out = {}
    for mode in ("independent", "antithetic"):
        gs, hs = [], []
        for _ in range(pairs):
            e1 = [torch.randn(m.shape, generator=gen, dtype=m.dtype) for m in mu]
            e2 = (
                [-e for e in e1]
                if mode == "antithetic"
                else [torch.randn(m.shape, generator=gen, dtype=m.dtype) for m in mu]
            )
            (g1, h1), (g2, h2) = at(e1), at(e2)
            gs.append((g1 + g2) / 2)
            hs.append((h1 + h2) / 2)
        g, h = torch.stack(gs), torch.stack(hs)
        out[mode] = {
            "g_mean": g.mean(0),
            "g_var": g.var(0).mean().item(),
            "g_se": (g.var(0) / pairs).sqrt(),
            "h_mean": h.mean(0),
            "h_var": h.var(0).mean().item(),
            "h_se": (h.var(0) / pairs).sqrt(),
        }
    return out


def end_to_end(seeds: int = 8, steps: int = 300) -> dict[str, dict[str, float]]:
    def run(noise: str, seed: int, mc: int = 1, n_steps: int = steps):
        model, x, y = toy()
        hyper = dict(lr=0.05, betas=(0.9, 0.999), hess_init=10.0, weight_decay=1e-2)
        opt = ngvi.IVON(model.parameters(), 64, mc_samples=mc, seed=seed, engine={"noise": noise}, **hyper)

        def closure():
            opt.zero_grad()
            loss = 0.5 * ((model(x) - y) ** 2).mean() * 100
            loss.backward()
            return loss

        for _ in range(n_steps):
            opt.step(closure)
        post = opt.posterior()
        return torch.cat([m.flatten() for m in post.mean]), torch.cat([s.flatten() for s in post.std])

    ref_mu, ref_sd = run("normal", 123, mc=16)
    out = {}
    for noise in ("normal", "antithetic"):
        mus, sds = zip(*(run(noise, s) for s in range(seeds)), strict=True)
        mu, sd = torch.stack(mus), torch.stack(sds)
        out[noise] = {
            "mu_spread": mu.std(0).mean().item(),
            "sd_spread": (sd.std(0) / ref_sd).mean().item(),
            "mu_dev": (mu.mean(0) - ref_mu).abs().mean().item(),
            "sd_dev": ((sd.mean(0) - ref_sd).abs() / ref_sd).mean().item(),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="-", help="Markdown file ('-': print)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: see bench README)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lines = [
        "# Noise options: cost and statistics\n",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads.\n",
    ]
    lines.append("## Drawing ε for 1.8M parameters (MLP 784-1000-1000-10)\n")
    lines.append("| generator | ms per sample |\n|---|---|")
    lines += [f"| {name} | {ms:.2f} |" for name, ms in generation_times()]
    st = estimator_statistics()
    ind, anti = st["independent"], st["antithetic"]
    scale_g = ind["g_mean"].abs().mean().item()
    scale_h = ind["h_mean"].abs().mean().item()
    lines.append(
        "\n## Estimators at a fixed q (4000 pairs; variance of the pair mean, averaged over weights)\n"
    )
    lines.append(
        "| | independent pair | antithetic pair | ratio | |mean difference| / |mean| | "
        "its MC standard error / |mean| |\n|---|---|---|---|---|---|"
    )
    for key, what, scale in (("g", "gradient ĝ", scale_g), ("h", "Price curvature ĝ⊙ε/σ", scale_h)):
        diff = (anti[f"{key}_mean"] - ind[f"{key}_mean"]).abs().mean().item() / scale
        se = (ind[f"{key}_se"].square() + anti[f"{key}_se"].square()).sqrt().mean().item() / scale
        v_ind, v_anti = ind[f"{key}_var"], anti[f"{key}_var"]
        lines.append(
            f"| {what} | {v_ind:.3g} | {v_anti:.3g} | {v_anti / v_ind:.3f} | {diff:.3f} | {se:.3f} |"
        )
    e2e = end_to_end()
    lines.append("\n## IVON, 300 steps, mc_samples=1, 8 seeds (reference: mc_samples=16)\n")
    head = (
        "| noise | spread of μ over seeds | relative spread of σ | |mean μ − ref| | relative |mean σ − ref| |"
    )
    lines.append(head + "\n|---|---|---|---|---|")
    for noise, r in e2e.items():
        cells = [f"{r[k]:.4f}" for k in ("mu_spread", "sd_spread", "mu_dev", "sd_dev")]
        lines.append(f"| {noise} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    if args.out == "-":
        print(text)
    else:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(text)


if __name__ == "__main__":
    main()
