"""``ngvi bench``: step time and peak memory of every optimizer against torch.optim.Adam, in one run.

Models: the MLP 784-1000-1000-10 (batch 256), a small CNN (conv 32 → pool → conv 64 → pool → 128 → 10 on
1×28×28, batch 256), and a sweep of MLPs 784-h-h-10 (0.1M–11M parameters) for the scaling plot. Data are
random; every method trains its own copy of the same initial weights on the same batch.

**Time.** After a warm-up, the methods take turns: each round times ``--steps`` consecutive steps of each
method, so that slow drifts of a shared machine hit all of them alike. A step is what a training loop does:
zero_grad, forward, loss, backward and the update (``opt.step(closure)`` for ngvi). We report the median step
and the ratio to Adam's median from the same run. Noisy K-FAC is reported by its mean over whole
``inv_every`` cycles (its amortised cost: cheap steps plus one with the factor inversions).

**Memory.** The peak of live tensor bytes from building the model and optimizer through three steps, as the
allocator reports it to ``torch.profiler`` (``profile_memory=True``): parameters, gradients, optimizer state,
activations and every temporary. Python objects and allocator caches are not counted. On an accelerator,
``torch.accelerator`` peak-memory counters are used instead.

**References** (optional, found if importable): ``ivon-opt`` (the IVON authors' optimizer) and BackPACK's
``SumGradSquared`` extension (per-example squared gradients, the VOGN curvature) followed by an Adam step.
VOGN, noisy K-FAC and BBVI appear when this build has them (``ngvi.VOGN``, ``ngvi.NoisyKFAC``,
``ngvi.baselines.BBVI``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from tqdm import tqdm

import ngvi

from ._io import load_json, markdown_table, results_dir, save_json, show_progress

DATA_SIZE = 60_000
Step = Callable[[], Any]


# ----------------------------------------------------------------------------------------------------
# Models and data
# ----------------------------------------------------------------------------------------------------
def mlp(width: int = 1000, inputs: int = 784, classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(inputs, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, classes),
    )  # fmt: skip


def cnn(channels: int = 32, side: int = 28, classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * channels * (side // 4) ** 2, 128), nn.ReLU(), nn.Linear(128, classes),
    )  # fmt: skip


@dataclass(frozen=True)
class Problem:
    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    batch: int

    def data(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(self.batch, *self.input_shape, generator=gen)
        y = torch.randint(0, 10, (self.batch,), generator=gen)
        return x.to(device), y.to(device)

    def model(self, device: torch.device) -> nn.Module:
        torch.manual_seed(0)
        return self.build().to(device)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.build().parameters())


def problems(quick: bool) -> dict[str, Problem]:
    if quick:
        return {
            "mlp": Problem("MLP 784-32-32-10", lambda: mlp(32), (784,), 16),
            "cnn": Problem("CNN 4-8 on 1×12×12", lambda: cnn(4, 12), (1, 12, 12), 8),
        }
    return {
        "mlp": Problem("MLP 784-1000-1000-10, batch 256", mlp, (784,), 256),
        "cnn": Problem("CNN 32-64-128 on 1×28×28, batch 256", cnn, (1, 28, 28), 256),
    }


def sweep_problem(width: int, batch: int) -> Problem:
    return Problem(f"MLP 784-{width}-{width}-10", lambda: mlp(width), (784,), batch)


# ----------------------------------------------------------------------------------------------------
# Methods: each builds a step function for a fresh model
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Method:
    label: str
    build: Callable[[nn.Module, torch.Tensor, torch.Tensor], Step]
    requires: str = ""  # what must be importable ("ngvi.VOGN", "ivon", ...)
    amortised: bool = False  # report the mean over whole cycles, not the median step
    cycle: int = 1


def _closure(model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor) -> Callable[[], torch.Tensor]:
    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    return closure


def _ngvi(factory: Callable[[nn.Module], Any]) -> Callable[[nn.Module, torch.Tensor, torch.Tensor], Step]:
    def build(model, x, y):
        opt = factory(model)
        closure = _closure(model, opt, x, y)
        return lambda: opt.step(closure)

    return build


def _adam(model, x, y):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    closure = _closure(model, opt, x, y)

    def step():
        closure()
        opt.step()

    return step


def _ivon_opt(model, x, y):
    import ivon  # the reference implementation (pip ivon-opt)

    opt = ivon.IVON(model.parameters(), lr=0.1, ess=DATA_SIZE, hess_init=1.0)

    def step():
        with opt.sampled_params(train=True):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def _backpack_sgs_adam(model, x, y):
    """BackPACK's per-example squared-gradient sums (VOGN's curvature), then an Adam step."""
    from backpack import backpack, extend
    from backpack.extensions import SumGradSquared

    model = extend(model)
    loss_fn = extend(nn.CrossEntropyLoss())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        with backpack(SumGradSquared()):
            loss.backward()
        opt.step()

    return step


def _bbvi(model):
    from ngvi.baselines import BBVI

    return BBVI(model, DATA_SIZE, lr=1e-3, seed=0)


def methods(noise_variants: bool = False) -> dict[str, Method]:
    n = DATA_SIZE
    init = {"init_prec": 100.0, "seed": 0}
    out = {
        "adam": Method("torch.optim.Adam (foreach)", _adam),
        "vadam": Method("ngvi.Vadam", _ngvi(lambda m: ngvi.Vadam(m.parameters(), n, **init))),
        "vprop": Method("ngvi.Vprop", _ngvi(lambda m: ngvi.Vprop(m.parameters(), n, **init))),
        "von": Method("ngvi.VON (Price)", _ngvi(lambda m: ngvi.VON(m.parameters(), n, **init))),
        "ivon": Method("ngvi.IVON", _ngvi(lambda m: ngvi.IVON(m.parameters(), n, seed=0))),
        "noisy_adam": Method("ngvi.NoisyAdam", _ngvi(lambda m: ngvi.NoisyAdam(m.parameters(), n, seed=0))),
        "badam": Method("ngvi.BAdam", _ngvi(lambda m: ngvi.BAdam(m.parameters(), n, seed=0))),
        "vogn": Method("ngvi.VOGN", _ngvi(lambda m: ngvi.VOGN(m, n, seed=0)), requires="ngvi.VOGN"),
        "noisy_kfac": Method(
            "ngvi.NoisyKFAC (amortised over inv_every=20)",
            _ngvi(lambda m: ngvi.NoisyKFAC(m, n, inv_every=20, seed=0)),
            requires="ngvi.NoisyKFAC",
            amortised=True,
            cycle=20,
        ),
        "bbvi": Method("ngvi.baselines.BBVI", _ngvi(_bbvi), requires="ngvi.baselines.BBVI"),
        "ivon-opt": Method("ivon-opt IVON (reference)", _ivon_opt, requires="ivon"),
        "backpack": Method(
            "BackPACK SumGradSquared + Adam (reference)", _backpack_sgs_adam, requires="backpack"
        ),
    }
    if noise_variants:
        for name, cls in (("vadam", ngvi.Vadam), ("ivon", ngvi.IVON)):
            kw = {"init_prec": 100.0} if name == "vadam" else {}
            out[f"{name}-antithetic"] = Method(
                f"ngvi.{cls.__name__}, noise='antithetic'",
                _ngvi(lambda m, cls=cls, kw=kw: cls(m.parameters(), n, seed=0, noise="antithetic", **kw)),
            )
    return out


def availability(method: Method) -> str | None:
    """None if the method can run here, else why not."""
    if not method.requires:
        return None
    if method.requires.startswith("ngvi."):
        module, _, name = method.requires.rpartition(".")
        try:
            ok = hasattr(importlib.import_module(module), name)
        except ImportError:
            ok = False
        return None if ok else "not available in this build"
    try:
        importlib.import_module(method.requires)
    except Exception as err:  # an installed package that fails with this torch says so here
        return f"`{method.requires}` not importable ({type(err).__name__}: {err})"[:160]
    return None


# ----------------------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def time_steps(
    steppers: dict[str, Step],
    device: torch.device,
    warmup: int,
    rounds: int,
    steps: dict[str, int],
    bar: tqdm | None = None,
) -> dict[str, list[float]]:
    """Seconds per step, interleaved: each round runs ``steps[name]`` consecutive steps of each method."""
    for step in steppers.values():
        for _ in range(warmup):
            step()
        _sync(device)
    times: dict[str, list[float]] = {name: [] for name in steppers}
    for _ in range(rounds):
        for name, step in steppers.items():
            for _ in range(steps[name]):
                start = time.perf_counter()
                step()
                _sync(device)
                times[name].append(time.perf_counter() - start)
            if bar is not None:
                bar.update()
    return times


def peak_memory(build: Callable[[], Step], device: torch.device, steps: int = 3) -> int:
    """Peak live tensor bytes while building the model and optimizer and taking ``steps`` steps."""
    if device.type != "cpu":
        mem = torch.accelerator.memory
        mem.empty_cache()
        before = mem.memory_allocated(device)
        mem.reset_peak_memory_stats(device)
        step = build()
        for _ in range(steps):
            step()
        _sync(device)
        return int(mem.max_memory_allocated(device) - before)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step = build()
        for _ in range(steps):
            step()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text())["traceEvents"]
    mem = [e["args"] for e in events if e.get("name") == "[memory]"]
    if not mem:
        return 0
    # The reporter's running total carries bytes allocated in earlier sessions and freed outside them:
    # measure from the total just before this session's first allocation.
    base = mem[0]["Total Allocated"] - mem[0]["Bytes"]
    return int(max(e["Total Allocated"] for e in mem) - base)


def summarise(method: Method, times: list[float]) -> float:
    """Seconds per step: the median, or for amortised methods the mean over whole cycles."""
    if method.amortised:
        whole = len(times) - len(times) % method.cycle
        return statistics.fmean(times[:whole] if whole else times)
    return statistics.median(times)


def run_problem(
    problem: Problem,
    chosen: dict[str, Method],
    device: torch.device,
    warmup: int,
    rounds: int,
    steps: int,
    memory: bool,
    bar: tqdm | None,
) -> dict[str, Any]:
    x, y = problem.data(device)
    steppers, per_round = {}, {}
    for name, method in chosen.items():
        steppers[name] = method.build(problem.model(device), x, y)
        per_round[name] = max(steps, method.cycle) if method.amortised else steps
    times = time_steps(steppers, device, warmup, rounds, per_round, bar)
    del steppers
    out: dict[str, Any] = {"problem": problem.name, "params": problem.num_params(), "methods": {}}
    for name, method in chosen.items():
        entry = {"label": method.label, "seconds": summarise(method, times[name]), "n": len(times[name])}
        entry["median"] = statistics.median(times[name])
        entry["mean"] = statistics.fmean(times[name])
        if memory:
            build = lambda method=method: method.build(problem.model(device), x, y)  # noqa: E731
            entry["peak_bytes"] = peak_memory(build, device)
        out["methods"][name] = entry
    return out


# ----------------------------------------------------------------------------------------------------
# The run and its outputs
# ----------------------------------------------------------------------------------------------------
SWEEP_METHODS = ("adam", "vadam", "ivon", "ivon-opt", "vogn", "backpack")


def environment(device: torch.device) -> dict[str, Any]:
    info = {
        "torch": torch.__version__,
        "ngvi": ngvi.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "device": str(device),
    }
    if hasattr(os, "getloadavg"):
        info["load_average"] = [round(v, 2) for v in os.getloadavg()]
    for package in ("ivon", "backpack"):
        try:
            from importlib.metadata import version

            info[package] = version({"ivon": "ivon-opt", "backpack": "backpack-for-pytorch"}[package])
        except Exception:
            info[package] = None
    return info


def run(
    out: Path,
    *,
    device: str | None = None,
    quick: bool = False,
    only: list[str] | None = None,
    models: list[str] | None = None,
    sweep: list[int] | None = None,
    warmup: int = 5,
    rounds: int = 6,
    steps: int = 10,
    memory: bool = True,
    noise_variants: bool = False,
) -> dict[str, Any]:
    dev = torch.device(device) if device else _default_device()
    all_methods = methods(noise_variants)
    unknown = sorted(set(only or []) - set(all_methods))
    if unknown:
        raise ValueError(f"unknown bench method(s) {unknown}; choose from {sorted(all_methods)}")
    names = only or list(all_methods)
    missing = {n: why for n in names if (why := availability(all_methods[n]))}
    chosen = {n: all_methods[n] for n in names if n not in missing}
    if "adam" not in chosen:
        chosen = {"adam": all_methods["adam"], **chosen}  # the reference of every ratio
    probs = problems(quick)
    unknown = sorted(set(models or []) - set(probs))
    if unknown:
        raise ValueError(f"unknown bench model(s) {unknown}; choose from {sorted(probs)}")
    probs = {k: v for k, v in probs.items() if models is None or k in models}
    widths = sweep if sweep is not None else ([16, 48] if quick else [100, 300, 1000, 3000])
    sweep_batch = 16 if quick else 256

    out = results_dir(out)
    config = {
        "quick": quick,
        "methods": list(chosen),
        "models": list(probs),
        "sweep": widths,
        "warmup": warmup,
        "rounds": rounds,
        "steps": steps,
        "device": str(dev),
    }
    results = load_json(out / "results.json")
    if results.get("config") != config:
        results = {"config": config, "problems": {}, "sweep": {}}
    results["environment"] = environment(dev)
    results["missing"] = missing
    sweep_methods = {n: m for n, m in chosen.items() if n in SWEEP_METHODS}
    total = rounds * (len(probs) * len(chosen) + len(widths) * len(sweep_methods))
    with tqdm(total=total, desc="ngvi bench", unit="round", disable=not show_progress()) as bar:
        for key, problem in probs.items():
            if key not in results["problems"]:
                results["problems"][key] = run_problem(
                    problem, chosen, dev, warmup, rounds, steps, memory, bar
                )
                save_json(out / "results.json", results)
        for width in widths:
            if str(width) not in results["sweep"]:
                results["sweep"][str(width)] = run_problem(
                    sweep_problem(width, sweep_batch), sweep_methods, dev, max(2, warmup // 2), rounds,
                    max(2, steps // 2), False, bar,
                )  # fmt: skip
                save_json(out / "results.json", results)
    (out / "table.md").write_text(table(results))
    plot_scaling(results, out / "scaling.png")
    return results


def _default_device() -> torch.device:
    acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return acc if acc is not None else torch.device("cpu")


# ----------------------------------------------------------------------------------------------------
# Table and targets
# ----------------------------------------------------------------------------------------------------
def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a is not None and b else "–"


def table(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        "# ngvi bench: step time and peak memory against torch.optim.Adam (same run)\n",
        f"torch {env['torch']}, {env['device']}, threads: {env['threads']}, {env['processor']}; "
        f"load average at the end {env.get('load_average')}; ivon-opt {env.get('ivon')}, "
        f"backpack-for-pytorch {env.get('backpack')}.\n",
        "Time: median step (NoisyKFAC: mean over whole inversion cycles), ratios within one run. "
        "Memory: peak live tensor bytes over model + optimizer construction and three steps.\n",
    ]
    for res in results["problems"].values():
        ms = res["methods"]
        ref = {k: ms[k]["seconds"] if k in ms else None for k in ("adam", "ivon-opt", "backpack")}
        mem_adam = ms["adam"].get("peak_bytes")
        rows = []
        for r in ms.values():
            peak = r.get("peak_bytes")
            times = [_ratio(r["seconds"], ref[k]) for k in ("adam", "ivon-opt", "backpack")]
            memory = [f"{peak / 2**20:.1f}" if peak is not None else "–", _ratio(peak, mem_adam)]
            rows.append([r["label"], f"{1e3 * r['seconds']:.1f}", *times, *memory])
        lines.append(f"\n## {res['problem']} ({res['params'] / 1e6:.2f}M parameters)\n")
        header = ["method", "step [ms]", "× Adam", "× ivon-opt", "× BackPACK SGS+Adam", "peak [MiB]"]
        lines.append(markdown_table([*header, "memory × Adam"], rows))
        lines.append(_targets(ms, res["params"]))
    if results.get("sweep"):
        lines.append("\n## Size sweep (MLP 784-h-h-10): step time × Adam\n")
        present = {n for r in results["sweep"].values() for n in r["methods"]}
        names = [n for n in SWEEP_METHODS if n in present]
        rows = []
        for res in results["sweep"].values():
            adam = res["methods"]["adam"]["seconds"]
            rows.append(
                [f"{res['params'] / 1e6:.2f}M", f"{1e3 * adam:.1f}"]
                + [_ratio(res["methods"][n]["seconds"], adam) if n in res["methods"] else "–" for n in names]
            )
        lines.append(markdown_table(["parameters", "Adam [ms]", *names], rows))
    if results.get("missing"):
        lines.append("\nNot run: " + "; ".join(f"{k}: {v}" for k, v in results["missing"].items()) + ".\n")
    return "\n".join(lines)


def _targets(ms: dict[str, dict[str, Any]], params: int) -> str:
    """The issue's targets that this problem's numbers can decide."""

    def t(name: str) -> float | None:
        return ms[name]["seconds"] if name in ms else None

    def m(name: str) -> float | None:
        return ms[name].get("peak_bytes") if name in ms else None

    checks: list[tuple[str, float, float, bool]] = []  # (target, measured, bound, at most?)
    for name in ("vadam", "ivon", "vprop"):
        if t(name) and t("adam"):
            checks.append((f"{name} time ≤ 1.5× Adam", t(name) / t("adam"), 1.5, True))
        if t(name) and t("ivon-opt"):
            checks.append((f"{name} time ≤ 0.5× ivon-opt", t(name) / t("ivon-opt"), 0.5, True))
    if t("vogn") and t("backpack"):
        checks.append(("vogn time ≤ 1.0× BackPACK SGS+Adam", t("vogn") / t("backpack"), 1.0, True))
    if t("noisy_kfac") and t("adam"):
        checks.append(("noisy_kfac time (amortised) ≤ 2× Adam", t("noisy_kfac") / t("adam"), 2.0, True))
    one_copy = 4 * params  # float32 parameters
    if m("vadam") and m("adam"):
        extra = (m("vadam") - m("adam")) / one_copy
        checks.append(("vadam peak − Adam's ≤ 1 copy of the parameters [copies]", extra, 1.0, True))
    if m("bbvi") and m("vadam"):
        checks.append(("bbvi peak ≥ 1.5× vadam's", m("bbvi") / m("vadam"), 1.5, False))
    if not checks:
        return ""
    rows = [
        [what, f"{v:.2f}", "met" if (v <= bound if at_most else v >= bound) else "**missed**"]
        for what, v, bound, at_most in checks
    ]
    return "\nTargets of the issue:\n\n" + markdown_table(["target", "measured", ""], rows)


def plot_scaling(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = sorted(results.get("sweep", {}).values(), key=lambda r: r["params"])
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    names = [n for n in SWEEP_METHODS if any(n in r["methods"] for r in sweep)]
    for name in names:
        pts = [(r["params"], 1e3 * r["methods"][name]["seconds"]) for r in sweep if name in r["methods"]]
        label = sweep[0]["methods"][name]["label"] if name in sweep[0]["methods"] else name
        ax.plot([p for p, _ in pts], [s for _, s in pts], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("time per step [ms]")
    env = results["environment"]
    where = f"{env['device']}, threads: {env['threads']}"
    ax.set_title(f"Step time vs size, MLP 784-h-h-10 ({where})", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/bench", help="results folder (default: runs/bench)")
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: the accelerator if any)")
    parser.add_argument("--quick", action="store_true", help="tiny models and few steps: a smoke run")
    names = ", ".join(methods(True))
    parser.add_argument("--methods", default=None, help=f"comma-separated subset of: {names}")
    parser.add_argument("--models", default=None, help="comma-separated subset of: mlp, cnn")
    parser.add_argument(
        "--sweep",
        default=None,
        help="MLP widths for the scaling plot (default 100,300,1000,3000; '' for none)",
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per method first (default 5)")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds (default 6)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per method per round (default 10)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    parser.add_argument("--noise-variants", action="store_true", help="also time noise='antithetic'")


def main(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    quick = args.quick
    results = run(
        Path(args.out),
        device=args.device,
        quick=quick,
        only=args.methods.split(",") if args.methods else None,
        models=args.models.split(",") if args.models else None,
        sweep=[int(w) for w in args.sweep.split(",") if w] if args.sweep is not None else None,
        warmup=2 if quick else args.warmup,
        rounds=2 if quick else args.rounds,
        steps=2 if quick else args.steps,
        memory=not args.no_memory,
        noise_variants=args.noise_variants,
    )
    print((Path(args.out) / "table.md").read_text())
    n = len(results["problems"])
    print(f"wrote {Path(args.out) / 'scaling.png'}, table.md and results.json ({n} models)")


class _Command:  # interim: until bench is an Experiment of the harness
    name = "bench"
    help = {
        "demo": "train every optimizer on a 1-D toy regression and plot the predictive bands (~2 min)",
        "bench": "step time and peak memory of every optimizer against torch.optim.Adam (~15 min)",
    }["bench"]
    add_arguments = staticmethod(add_arguments)
    main = staticmethod(main)


COMMAND = _Command()
