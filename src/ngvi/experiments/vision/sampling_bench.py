"""Test-time sampling: S posterior samples as S Python-level passes (``ngvi.predict``'s loop) against one
batched pass (``vectorize=True``: ``torch.func.vmap`` of ``functional_call`` over stacked draws; for MC
dropout the input repeated S times). A benchmark, not a test: ratios of medians in one process.

    python -m ngvi.experiments.vision.sampling_bench --out docs/results/vision

writes ``sampling.md`` (and ``sampling.json``). The models are the ``ngvi classify`` ones (LeNet-5 and the
784-400-400-10 MLP) at their initial weights (the cost does not depend on the values).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

import ngvi
from ngvi.baselines import MCDropout

from ..core.report import markdown_table
from . import models

TRAINERS = {
    "Vadam (diagonal)": lambda m: ngvi.Vadam(m.parameters(), 60000, init_prec=1e4, seed=0),
    "noisy K-FAC (Kronecker)": lambda m: ngvi.NoisyKFAC(m, 60000, prior_prec=100.0, seed=0),
    "MC dropout (masks)": lambda m: MCDropout(m, 60000),
}


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(samples: int = 32, batches=(1, 10, 100, 1000), repeats: int = 5) -> list[dict]:
    rows = []
    for model_name, make in (("LeNet-5", models.lenet5), ("MLP 784-400-400-10", models.mlp)):
        for trainer_name, build in TRAINERS.items():
            torch.manual_seed(0)
            model = make(dropout=0.2) if "dropout" in trainer_name else make()
            opt = build(model)
            for batch in batches:
                x = torch.rand(batch, 1, 28, 28)
                loop = _median_seconds(lambda: ngvi.predict(model, opt, x, samples), repeats)  # noqa: B023
                vmap = _median_seconds(lambda: ngvi.predict(model, opt, x, samples, vectorize=True), repeats)  # noqa: B023
                rows.append({"model": model_name, "trainer": trainer_name, "batch": batch, "samples": samples,
                             "loop_s": loop, "vectorized_s": vmap, "ratio": vmap / loop})  # fmt: skip
                print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/sampling")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows = measure(args.samples, repeats=args.repeats)
    wall = time.perf_counter() - start
    (out / "sampling.json").write_text(json.dumps(rows, indent=1))
    table = markdown_table(
        ["model", "trainer", "test points", "loop [ms]", "vectorised [ms]", "vectorised / loop"],
        [[r["model"], r["trainer"], r["batch"], f"{1e3 * r['loop_s']:.1f}", f"{1e3 * r['vectorized_s']:.1f}",
          f"{r['ratio']:.2f}"] for r in rows],
    )  # fmt: skip
    head = (
        f"# Test-time sampling: {args.samples} posterior samples, loop against one batched pass\n\n"
        f"`python -m ngvi.experiments.vision.sampling_bench --out {args.out}` ({wall:.0f} s wall), "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {platform.processor() or 'CPU'}. "
        f"Median of {args.repeats} repeats after a warm-up; a ratio below 1 means the vectorised form is "
        "faster. Both include drawing the samples (the loop: the optimizer's draw into the weights per "
        "sample; vectorised: `posterior().sample(S)` once).\n\n"
    )
    (out / "sampling.md").write_text(head + table)
    print(head + table)


if __name__ == "__main__":
    main()
