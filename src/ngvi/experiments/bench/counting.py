"""What a step dispatches: ATen ops, reads of a tensor's value back to the host, and CUDA kernel launches.

The bench counts in steps of their own, after the timed rounds: a :class:`OpCounter` (a
``TorchDispatchMode``) costs Python time per op, and ``torch.profiler`` its own overhead. The tests count
host reads with the same :class:`OpCounter` (``tests/host_reads.py``), and ``benchmarks/gpu_lm.py`` counts
with the same helpers, so the three agree on what a sync is.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: the ATen ops that read a tensor's value back to the host: on an accelerator, each one waits for the
#: device's queue to drain. ``_linalg_check_errors`` is the check inside ``torch.linalg.cholesky`` (not
#: ``cholesky_ex``) and kin. ``Tensor.tolist()`` and ``.cpu()`` read without such an op on the CPU.
SYNC_OPS = frozenset(
    {"aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.nonzero", "aten._linalg_check_errors"}
)
#: the CUDA runtime and driver calls that launch a kernel, as torch.profiler names them
LAUNCHES = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"})


def _device_type(args: tuple[Any, ...]) -> str:
    """The device type of the first tensor among an op's arguments ("cpu" if none)."""
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.device.type
    return "cpu"


class OpCounter(TorchDispatchMode):
    """Counts every ATen op dispatched inside the block, by overload packet name, and the host reads
    (:data:`SYNC_OPS`) by the device type of the tensor read."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.reads: collections.Counter[str] = collections.Counter()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile refuses to run under a user mode unless it may hide its graph from it: the compiled
        # rules then run compiled, and their fused kernels (not ATen ops) go uncounted, as they should
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        self.ops[name] += 1
        if name in SYNC_OPS:
            self.reads[_device_type(args)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def syncs(self) -> dict[str, int]:
        return {k: v for k, v in self.ops.items() if k in SYNC_OPS}

    @property
    def sync_count(self) -> int:
        return sum(self.syncs.values())


def kernel_launches(prof: torch.profiler.profile) -> int:
    """The kernel launches a finished ``torch.profiler`` session recorded (its CUDA runtime calls)."""
    return sum(e.count for e in prof.key_averages() if e.key in LAUNCHES)


def count_step(step: Callable[[], Any], device: torch.device, steps: int) -> dict[str, float]:
    """Per step, over ``steps`` consecutive untimed steps: ``aten_ops`` dispatched and ``host_syncs`` (reads
    of a value on ``device`` back to the host; on the CPU every read, the proxy of a sync); on CUDA also
    ``kernel_launches`` from torch.profiler, in ``steps`` steps of their own (the counter's Python time
    would not change the launches, but keeps the two measurements apart)."""
    counter = OpCounter()
    with counter:
        for _ in range(steps):
            step()
    out = {"aten_ops": counter.total / steps, "host_syncs": counter.reads[device.type] / steps}
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize(device)
        out["kernel_launches"] = kernel_launches(prof) / steps
    return out
