r"""``ngvi minima``: variational optimisation against gradient descent on a rugged 2-D landscape (Khan et al.
2018, App. L, Fig. 7).

**Landscape.** h(x, y) = exp{−(x sin 20y + y sin 20x)² − (x cos 10y − y sin 10x)²} (after Robert & Casella's
Fig. 5.2). h ≤ 1, with h = 1 on the whole line x = 0 and on narrow ridges elsewhere; the ridge is widest
around the origin, the "flat (and global)" optimum of App. L. Between the ridges h falls to 0 on plateaus
where the gradient vanishes. We minimise f = −h (App. L speaks of minima: those of −h).

**Methods**, each from the same 4 starting points (fixed before any run, away from the origin):

* gradient descent: θ ← θ − η∇f(θ), η = ``GD_LR``, for all ``--steps`` iterations (``torch.optim.SGD``);
* "Vadam to VadaGrad": first Vadam on E_q[N f(θ)] + τ KL(q ‖ p) with the KL weight τ annealed linearly
  from 1 to ``TAU_END`` over the first ``VADAM_FRACTION`` of the iterations (``prior_prec`` = τλ: the KL
  term is turned off gradually, App. L), then VadaGrad (τ = 0 exactly, App. F) from Vadam's final mean and
  precision, whose precision only grows, so that q contracts onto a point. The prior p is N(θ₀, I/λ)
  centred at the run's own start θ₀ (the parameter is the displacement θ − θ₀), so that it does not pull
  towards the origin, where the flat optimum is. ``MC_SAMPLES`` samples per step.

Reported: where each run ends (its mean, h and ‖θ‖ there), a figure of the paths over the landscape.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .core import args as types
from .core import training
from .core.methods import METHODS
from .core.report import figure, markdown_table, save_figure
from .core.runner import Experiment, Job, Run

#: the four starts of our Fig. 7 (the paper does not list its own)
STARTS = ((0.7, 0.8), (-0.8, 0.6), (-0.6, -0.9), (0.9, -0.5))
DATA_SIZE = 10  # N: q ∝ exp(−N f) p at τ = 1
PRIOR_PREC = 4.0  # λ: p = N(θ₀, I/4), a search radius of 0.5 around the start
#: q starts at the prior around the start, and the step is eqs. 88-93 as written (not the library's defaults)
VADAM = {"lr": 0.01, "betas": (0.9, 0.999), "init_prec": None, "step_moment": "paper"}
VADAGRAD = {"lr": 0.01, "beta": 0.01, "kl_clip": None}
#: below 2/curvature of the steepest ridges (widths ~0.03, curvature ~1e3): larger steps bounce on them
GD_LR = 1e-3
MC_SAMPLES = 8
VADAM_FRACTION = 0.6
TAU_END = 1e-4
FLATNESS_STD = 0.05
#: a run ends on the flat optimum if the mean of h around its end exceeds this (0.99 at the origin)
FLAT_THRESHOLD = 0.95
COLORS = ("tab:red", "tab:blue", "tab:green", "tab:purple")


def h(x: Tensor | np.ndarray, y: Tensor | np.ndarray) -> Tensor | np.ndarray:
    """exp{−(x sin 20y + y sin 20x)² − (x cos 10y − y sin 10x)²}, for tensors or arrays."""
    lib = torch if isinstance(x, Tensor) else np
    a = x * lib.sin(20 * y) + y * lib.sin(20 * x)
    b = x * lib.cos(10 * y) - y * lib.sin(10 * x)
    return lib.exp(-(a**2) - b**2)


def smoothed_h(point: list[float], std: float | None = None, points: int = 24) -> float:
    """E[h(θ)] for θ ~ N(point, std² I) (default std: FLATNESS_STD), by a product Gauss–Hermite rule: near
    1 only on a flat optimum (on the crest of a ridge narrower than ``std`` it is well below 1)."""
    std = FLATNESS_STD if std is None else std
    nodes, weights = np.polynomial.hermite.hermgauss(points)
    offsets = math.sqrt(2.0) * std * nodes
    gx, gy = np.meshgrid(point[0] + offsets, point[1] + offsets)
    return float((np.outer(weights, weights) * h(gx, gy)).sum() / math.pi)


class Displacement(nn.Module):
    """θ = θ₀ + δ with δ the trainable parameter (one scalar per coordinate, so each can have its own
    VadaGrad precision); the forward pass returns f(θ) = −h(θ), the "loss"."""

    def __init__(self, start: tuple[float, float]):
        super().__init__()
        self.register_buffer("start", torch.tensor(start, dtype=torch.float64))
        self.dx = nn.Parameter(torch.zeros((), dtype=torch.float64))
        self.dy = nn.Parameter(torch.zeros((), dtype=torch.float64))

    def theta(self) -> Tensor:
        return self.start + torch.stack([self.dx, self.dy])

    def forward(self, _: Tensor) -> Tensor:
        x, y = self.theta()
        return -h(x, y).reshape(1, 1)


def _loss(output: Tensor, _: Tensor) -> Tensor:
    return output.mean()


def run_gd(start: tuple[float, float], steps: int, record: int) -> tuple[list[list[float]], float]:
    model = Displacement(start)
    opt = torch.optim.SGD(model.parameters(), lr=GD_LR)
    return _train(model, opt, steps, record, None), 0.0


def run_variational(
    start: tuple[float, float], steps: int, record: int, seed: int
) -> tuple[list[list[float]], dict[str, Any]]:
    """Vadam with the KL weight annealed to TAU_END, then VadaGrad from its final q."""
    torch.manual_seed(seed)
    model = Displacement(start)
    vadam_steps = round(VADAM_FRACTION * steps)
    vadam = METHODS["vadam"].build(
        model, DATA_SIZE, prior_prec=PRIOR_PREC, mc_samples=MC_SAMPLES, seed=seed, **VADAM
    )

    def anneal(t: int) -> None:
        tau = 1.0 - (1.0 - TAU_END) * (t - 1) / max(1, vadam_steps - 1)
        for group in vadam.param_groups:
            group["prior_prec"] = tau * PRIOR_PREC

    path = _train(model, vadam, vadam_steps, record, anneal)
    post = vadam.posterior()
    handover = [float(v.reciprocal()) for v in post.variance]  # per-coordinate precision at the switch
    groups = [
        {"params": [p], "init_prec": prec} for p, prec in zip(model.parameters(), handover, strict=True)
    ]
    vadagrad = METHODS["vadagrad"].trainer_class()(groups, mc_samples=MC_SAMPLES, seed=seed + 1, **VADAGRAD)
    path += _train(model, vadagrad, steps - vadam_steps, record, None, offset=vadam_steps)[1:]
    final = vadagrad.posterior()
    return path, {
        "switch_std": [1 / math.sqrt(p) for p in handover],
        "final_std": [float(v.sqrt()) for v in final.variance],
    }


def _train(
    model: Displacement, trainer: Any, steps: int, record: int, schedule: Any, offset: int = 0
) -> list[list[float]]:
    """``steps`` full-batch steps on f; the path of θ (the mean) every ``record`` steps and at the end."""
    path = [[offset, *model.theta().tolist()]]

    def before_step(t: int) -> None:
        if schedule is not None:
            schedule(t)
        if t > 1 and (t - 1) % record == 0:
            path.append([offset + t - 1, *model.theta().tolist()])

    dummy = torch.zeros(1, 1, dtype=torch.float64)
    training.train_steps(
        model, trainer, dummy, dummy, _loss, steps=steps, batch_size=1, before_step=before_step
    )
    path.append([offset + steps, *model.theta().tolist()])
    return path


#: the options that --quick sets (when not given), with their defaults
DEFAULTS = {"steps": 5000, "seeds": 3}
QUICK = {"steps": 200, "seeds": 1}


class Minima(Experiment):
    name = "minima"
    help = "variational optimisation (Vadam to VadaGrad) against gradient descent on a 2-D landscape (App. L)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        types.add_count(parser, "--steps", None, "iterations per run (default 5000; --quick: 200)")
        types.add_count(
            parser,
            "--seeds",
            None,
            "variational runs per start, with different noise (default 3; --quick: 1)",
        )
        types.add_quick(parser, "200 iterations, 1 seed: a smoke run (options given explicitly win)")

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        return {
            **types.with_quick(args, DEFAULTS, QUICK),  # an explicit option wins over --quick
            "starts": [list(s) for s in STARTS],
        }

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        config = self.config(args)
        jobs = [
            Job(f"gd/start{i}", {"method": "gd", "start": list(start), "steps": config["steps"], "seed": 0})
            for i, start in enumerate(STARTS)
        ]
        jobs += [
            Job(
                f"vo/start{i}/seed{k}",
                {"method": "vo", "start": list(start), "steps": config["steps"], "seed": 100 * k + i},
            )
            for k in range(config["seeds"])
            for i, start in enumerate(STARTS)
        ]
        return jobs

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        start, steps = tuple(spec["start"]), spec["steps"]
        record = max(1, steps // 500)
        begin = time.process_time()
        if spec["method"] == "gd":
            path, extra = run_gd(start, steps, record)[0], {}
        else:
            path, extra = run_variational(start, steps, record, spec["seed"])
        end = path[-1][1:]
        return {
            "path": path,
            "end": end,
            "h_end": float(h(np.float64(end[0]), np.float64(end[1]))),
            "smoothed_h_end": smoothed_h(end),
            "radius_end": math.hypot(*end),
            "seconds": time.process_time() - begin,
            **extra,
        }

    def report(self, args: argparse.Namespace, run: Run) -> None:
        config, runs = self.config(args), run.results["runs"]
        rows = []
        for i, start in enumerate(STARTS):
            keys = [("gradient descent", f"gd/start{i}")]
            keys += [(f"Vadam to VadaGrad, seed {k}", f"vo/start{i}/seed{k}") for k in range(config["seeds"])]
            for label, key in keys:
                r = runs[key]
                rows.append(
                    [
                        f"({start[0]:+.2f}, {start[1]:+.2f})",
                        label,
                        f"({r['end'][0]:+.3f}, {r['end'][1]:+.3f})",
                        f"{r['h_end']:.3f}",
                        f"{r['smoothed_h_end']:.3f}",
                        f"{r['radius_end']:.3f}",
                        "—" if "final_std" not in r else f"{max(r['final_std']):.1e}",
                    ]
                )
        flat = lambda r: r["smoothed_h_end"] > FLAT_THRESHOLD  # noqa: E731
        vo = [runs[f"vo/start{i}/seed{k}"] for i in range(len(STARTS)) for k in range(config["seeds"])]
        gd = [runs[f"gd/start{i}"] for i in range(len(STARTS))]
        header = [
            "start",
            "run",
            "end (x, y)",
            "h at the end",
            f"mean h within σ = {FLATNESS_STD} (flatness)",
            "distance from the origin",
            "final σ (max)",
        ]
        text = (
            "# ngvi minima: variational optimisation against gradient descent "
            "(Khan et al. 2018, App. L, Fig. 7)\n\n"
            f"f = −h on ℝ², {config['steps']} iterations per run; gradient descent with step {GD_LR}; Vadam "
            f"(N = {DATA_SIZE}, λ = {PRIOR_PREC} around the start, lr {VADAM['lr']}, {MC_SAMPLES} samples, "
            f"KL weight 1 → {TAU_END} over the first {VADAM_FRACTION:.0%}) then VadaGrad "
            f"(lr {VADAGRAD['lr']}, β {VADAGRAD['beta']}). h = 1 is the optimum, reached on every ridge; "
            f"the flat one is the origin's: the mean of h over N(end, {FLATNESS_STD}² I) tells them apart. "
            "Figure: `minima.png` (seed 0 drawn bold).\n\n"
            f"Runs that end on the flat optimum (mean h within σ = {FLATNESS_STD} above {FLAT_THRESHOLD}): "
            f"Vadam to VadaGrad {sum(map(flat, vo))} of {len(vo)}, gradient descent {sum(map(flat, gd))} of "
            f"{len(gd)}.\n\n" + markdown_table(header, rows)
        )
        (run.out / "table.md").write_text(text)
        _figure(runs, config["seeds"], run)
        print(text)
        print(f"wrote {run.out / 'table.md'}, {run.out / 'minima.png'} and {run.out / 'results.json'}")


def _figure(runs: dict[str, Any], seeds: int, run: Run) -> None:
    fig, (ax,) = figure(1, cols=1, size=(7.6, 6.4))
    points = np.concatenate([np.array(r["path"])[:, 1:] for r in runs.values()])
    half = max(1.1, float(np.abs(points).max()) + 0.05)
    grid = np.linspace(-half, half, 600)
    gx, gy = np.meshgrid(grid, grid)
    image = ax.contourf(gx, gy, h(gx, gy), levels=np.linspace(0, 1, 21), cmap="Greys_r")
    fig.colorbar(image, ax=ax, label="h(x, y)  (f = −h is minimised)")
    for i, start in enumerate(STARTS):
        for k in range(seeds):
            vo = np.array(runs[f"vo/start{i}/seed{k}"]["path"])
            bold = k == 0
            ax.plot(
                vo[:, 1],
                vo[:, 2],
                "-",
                color=COLORS[i],
                lw=1.6 if bold else 0.8,
                alpha=1.0 if bold else 0.55,
                label="Vadam to VadaGrad (VO)" if i == 0 and bold else None,
            )
            ax.plot(vo[-1, 1], vo[-1, 2], "*", color=COLORS[i], ms=13 if bold else 9, mec="white")
        gd = np.array(runs[f"gd/start{i}"]["path"])
        ax.plot(
            gd[:, 1], gd[:, 2], ":", color="black", lw=2.0, label="gradient descent (GD)" if i == 0 else None
        )
        ax.plot(*start, "o", color=COLORS[i], ms=7, mec="white")
        ax.plot(gd[-1, 1], gd[-1, 2], "x", color="black", ms=8, mew=2)
    ax.plot([], [], "o", color="0.4", label="start")
    ax.plot([], [], "*", color="0.4", ms=12, label="end (VO)")
    ax.plot([], [], "x", color="black", label="end (GD)")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_aspect("equal")
    ax.set_title(
        "Fig. 7: the means' paths from 4 starts (colour: start; dotted: gradient descent)", fontsize=9
    )
    save_figure(fig, run.out / "minima.png", legend_from=ax, dpi=110)


EXPERIMENT = Minima()
