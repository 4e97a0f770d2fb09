"""Timing and peak memory of the bench's methods on its problems, interleaved within one run."""

from __future__ import annotations

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

import ngvi

from ..core import models
from .counting import count_step
from .lm import FULL, SMALL, TINY, LanguageModel, LMConfig
from .methods import Method, Step


class FlatLogits(LanguageModel):
    """The language model with its logits as (batch·context, vocab) rows, for the bench's one closure."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids).flatten(0, 1)


@dataclass(frozen=True)
class Problem:
    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    batch: int
    #: the batch (x, y) from a seeded generator, where it is not Gaussian inputs and 10 classes
    make_data: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]] | None = None

    def data(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        if self.make_data is not None:
            x, y = self.make_data(gen)
            return x.to(device), y.to(device)
        x = torch.randn(self.batch, *self.input_shape, generator=gen)
        y = torch.randint(0, 10, (self.batch,), generator=gen)
        return x.to(device), y.to(device)

    def model(self, device: torch.device) -> nn.Module:
        torch.manual_seed(0)
        return self.build().to(device)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.build().parameters())


def mlp(width: int = 1000) -> nn.Module:
    return models.mlp(784, [width, width], 10, flatten=True)


def chain(layers: int = 64, width: int = 64) -> nn.Module:
    """Many small tensors: on the CPU the proxy of a launch-bound GPU (the per-tensor work dominates)."""
    return nn.Sequential(*(m for _ in range(layers) for m in (nn.Linear(width, width), nn.Tanh())))


def language_model(config: LMConfig) -> Problem:
    """The GPT-style model of the GPU bench (:mod:`.lm`), its logits flattened to (batch·context, vocab)."""

    def data(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, config.vocab, (config.batch, config.context + 1), generator=gen)
        return ids[:, :-1], ids[:, 1:].flatten()

    name = f"LM {config.blocks}×{config.width}, vocabulary {config.vocab}, context {config.context}"
    return Problem(f"{name}, batch {config.batch}", lambda: FlatLogits(config), (), config.batch, data)


#: the problems a run times unless ``--models`` says otherwise (``lm`` is asked for by name)
DEFAULT_MODELS = ("mlp", "cnn", "chain")


def problems(quick: bool, full_lm: bool = False) -> dict[str, Problem]:
    """The bench's problems; the language model at full size only with ``full_lm`` (an accelerator)."""
    if quick:
        return {
            "mlp": Problem("MLP 784-32-32-10", lambda: mlp(32), (784,), 16),
            "cnn": Problem("CNN 4-8 on 1×12×12", lambda: models.cnn(4, 12), (1, 12, 12), 8),
            "chain": Problem("64 Linear 8-8 layers, batch 4", lambda: chain(64, 8), (8,), 4),
            "lm": language_model(TINY),
        }
    return {
        "mlp": Problem("MLP 784-1000-1000-10, batch 256", mlp, (784,), 256),
        "cnn": Problem("CNN 32-64-128 on 1×28×28, batch 256", models.cnn, (1, 28, 28), 256),
        "chain": Problem("64 Linear 64-64 layers (128 tensors), batch 8", chain, (64,), 8),
        "lm": language_model(FULL if full_lm else SMALL),
    }


def sweep_problem(width: int, batch: int) -> Problem:
    return Problem(f"MLP 784-{width}-{width}-10", lambda: mlp(width), (784,), batch)


def _sync(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def time_steps(
    steppers: dict[str, Step],
    device: torch.device,
    warmup: int,
    rounds: int,
    steps: dict[str, int],
    bar: Any = None,
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


def round_means(times: list[float], per_round: int) -> list[float]:
    """The mean step of each round (``per_round`` consecutive steps: whole cycles for amortised methods)."""
    return [statistics.fmean(times[i : i + per_round]) for i in range(0, len(times), per_round)]


def summarise(times: list[float], per_round: int) -> dict[str, float]:
    """Seconds per step: the median over rounds of each round's mean step, with the rounds' spread (the
    fastest and slowest round), so one disturbed round moves neither the number nor the others."""
    means = round_means(times, per_round)
    return {"seconds": statistics.median(means), "fastest": min(means), "slowest": max(means)}


def run_problem(
    problem: Problem,
    chosen: dict[str, Method],
    device: torch.device,
    warmup: int,
    rounds: int,
    steps: int,
    memory: bool,
    bar: Any,
    count: bool = False,
) -> dict[str, Any]:
    """Every chosen method timed in interleaved rounds; with ``count``, then the ops, host syncs (and on
    CUDA kernel launches) of each step counted in untimed steps of their own (:func:`counts`)."""
    x, y = problem.data(device)
    steppers, per_round = {}, {}
    for name, method in chosen.items():
        steppers[name] = method.build(problem.model(device), x, y)
        per_round[name] = -(-steps // method.cycle) * method.cycle  # whole cycles
    times = time_steps(steppers, device, warmup, rounds, per_round, bar)
    counted = {name: counts(steppers[name], device, chosen[name].cycle) for name in chosen} if count else {}
    del steppers
    out: dict[str, Any] = {"problem": problem.name, "params": problem.num_params(), "methods": {}}
    for name, method in chosen.items():
        entry = {"label": method.label, **summarise(times[name], per_round[name]), "n": len(times[name])}
        entry["median"] = statistics.median(times[name])
        entry["mean"] = statistics.fmean(times[name])
        entry |= counted.get(name, {})
        if memory:
            build = lambda method=method: method.build(problem.model(device), x, y)  # noqa: E731
            entry["peak_bytes"] = peak_memory(build, device)
        out["methods"][name] = entry
    over_forward_backward(out["methods"])
    return out


#: untimed steps counted per method (an even number: antithetic noise alternates ε and −ε); the K-FAC
#: family counts one whole inversion cycle instead
COUNT_STEPS = 4


def counts(step: Step, device: torch.device, cycle: int = 1) -> dict[str, Any]:
    """Per step, after the timed rounds (steady state): ATen ops, host syncs and, on CUDA, kernel launches
    (:func:`.counting.count_step`), over :data:`COUNT_STEPS` steps or one whole cycle. A method that cannot
    be counted says why instead of ending the run."""
    try:
        return count_step(step, device, cycle if cycle > 1 else COUNT_STEPS)
    except Exception as err:
        return {"count_error": f"{type(err).__name__}: {err}"[:200]}


def over_forward_backward(entries: dict[str, dict[str, Any]]) -> None:
    """Adds each method's step time, ATen ops and kernel launches beyond forward + backward alone (the
    ``fwd_bwd`` reference, timed in the same rounds and counted the same way), where it was run."""
    ref = entries.get("fwd_bwd")
    if ref is None:
        return
    for entry in entries.values():
        entry["seconds_over_fwd_bwd"] = entry["seconds"] - ref["seconds"]
        for key in ("aten_ops", "kernel_launches"):
            if key in entry and key in ref:
                entry[f"{key}_over_fwd_bwd"] = entry[key] - ref[key]


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
