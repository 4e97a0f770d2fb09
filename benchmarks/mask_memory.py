"""The device check's memory (issue 42, item 3): peak live tensor bytes of three steps on the bench's MLP
(784-1000-1000-10, batch 256, 1,796,010 float32 weights), on the CPU, with ``finite_check="host"`` and with
``"device"``, whose mask keeps a copy of μ and of every state tensor while the update runs
(``ngvi.optim.engine.device_check.masked``). Measured with the bench's own ``peak_memory`` (the profiler's
memory events).

    PYTHONPATH=src python benchmarks/mask_memory.py        # about half a minute; prints the table
"""

from __future__ import annotations

import torch

from ngvi.experiments.bench import measure, methods

RULES = ("ivon", "vadam", "von", "noisy_adam")


def main() -> None:
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    problem = measure.problems(quick=False)["mlp"]
    x, y = problem.data(cpu)
    weights = problem.num_params()
    print(f"{problem.name}, {weights:,} weights; peak live tensor bytes over three steps\n")
    print("| rule | host [MiB] | device [MiB] | the mask's extra | floats per weight |")
    print("|---|---|---|---|---|")
    for rule in RULES:
        peak = {}
        for check in ("host", "device"):
            build = methods.ngvi_method(rule, engine={"finite_check": check})
            peak[check] = measure.peak_memory(lambda build=build: build(problem.model(cpu), x, y), cpu)
        extra = peak["device"] - peak["host"]
        print(
            f"| {rule} | {peak['host'] / 2**20:.1f} | {peak['device'] / 2**20:.1f} | "
            f"+{extra / peak['host']:.0%} | {extra / weights / 4:.2f} |"
        )


if __name__ == "__main__":
    main()
