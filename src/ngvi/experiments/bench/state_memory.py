"""The memory of the optimizer state per weight, for float32 and bfloat16 parameters (``ngvi bench``).

For bfloat16/float16 parameters ngvi keeps the state and a master copy of μ in float32 by default
(``fp32_state=True``, :mod:`ngvi.optim.engine.mixed_precision`), because bfloat16 rounds the curvature
updates away.
This measures what that costs: each registry method is built on the bench MLP, takes one step (so its state
exists) and we count the bytes of every tensor it keeps between steps (its state, the master copy, kept noise
buffers, VOGN's scratch buffers), divided by the number of weights. Three settings: float32 parameters;
bfloat16 parameters with ``fp32_state=True`` (the default) and with ``fp32_state=False``. The parameters
themselves (4 or 2 bytes per weight) and their gradients are not included. The counts are exact (sizes of
live tensors), so one step per setting suffices::

    python -m ngvi.experiments.bench.state_memory [--quick]     # also a section of `ngvi bench`
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ...optim.diagnostics import PosteriorWarning
from ..core import training
from ..core.methods import METHODS as REGISTRY
from ..core.report import markdown_table
from .measure import problems

#: the registry's trainers with a Gaussian posterior, and the options they are built with here
RULES: dict[str, dict[str, Any]] = {
    "vadam": {},
    "vprop": {},
    "von": {},
    "vogn": {},
    "ivon": {},
    "noisy_adam": {},
    "noisy_kfac": {},
    "badam": {},
    "vadagrad": {"prior_prec": 0.0},
    "bbvi": {},
}
SETTINGS = {
    "float32": (torch.float32, True),
    "bfloat16, fp32_state=True": (torch.bfloat16, True),
    "bfloat16, fp32_state=False": (torch.bfloat16, False),
}


def kept_bytes(opt: Any) -> int:
    """Bytes of the tensors an optimizer keeps between steps: its state, kept noise buffers and scratch."""
    seen: set[int] = set()
    total = 0

    def count(t: Any) -> None:
        nonlocal total
        if isinstance(t, Tensor) and id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()

    for state in opt.state.values():
        for value in state.values():
            count(value)
    for t in getattr(opt.noise_source, "_buffers", {}).values():
        count(t)
    for t in getattr(opt, "_scratch", {}).values():
        count(t)
    return total


def measure(quick: bool = False) -> dict[str, Any]:
    """Bytes per weight of each rule's kept tensors in each setting (one step of the bench MLP)."""
    problem = problems(quick)["mlp"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(problem.batch, *problem.input_shape, generator=gen)
    y = torch.randint(0, 10, (problem.batch,), generator=gen)
    rows: dict[str, dict[str, float]] = {}
    for name, options in RULES.items():
        method = REGISTRY[name]
        if not method.available():
            continue
        rows[name] = {}
        for setting, (dtype, fp32_state) in SETTINGS.items():
            torch.manual_seed(0)
            model: nn.Module = problem.build().to(dtype)
            opt = method.build(model, 60_000, seed=0, fp32_state=fp32_state, **options)
            closure = training.closure(
                model, opt, lambda out, t: F.cross_entropy(out.float(), t), x.to(dtype), y
            )
            with warnings.catch_warnings():  # fp32_state=False: the PosteriorWarning this table quantifies
                warnings.simplefilter("ignore", PosteriorWarning)
                opt.step(closure)
            weights = sum(p.numel() for p in model.parameters())
            rows[name][setting] = kept_bytes(opt) / weights
    return {"problem": problem.name, "bytes_per_weight": rows}


def table(result: dict[str, Any]) -> str:
    header = ["method", *(f"{s} [B/weight]" for s in SETTINGS), "fp32_state's extra [B/weight]"]
    rows = []
    for name, cells in result["bytes_per_weight"].items():
        on, off = cells["bfloat16, fp32_state=True"], cells["bfloat16, fp32_state=False"]
        rows.append([REGISTRY[name].label, *(f"{cells[s]:.1f}" for s in SETTINGS), f"{on - off:+.1f}"])
    return (
        f"\n## Optimizer state per weight ({result['problem']}; parameters and gradients not included)\n\n"
        "Kept between steps: the state, the float32 master copy of μ (bfloat16 with fp32_state=True), kept "
        "noise buffers (Vprop's antithetic ε, the Price estimator's ε) and VOGN's scratch buffers. A "
        "bfloat16 parameter takes 2 bytes and its gradient 2 more.\n\n" + markdown_table(header, rows)
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the tiny bench MLP")
    parser.add_argument("--out", help="write the table to this Markdown file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    text = table(measure(args.quick))
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"# ngvi bench: state memory (`python -m ngvi.experiments.bench.state_memory`)\n{text}\n")


if __name__ == "__main__":
    main()
