"""Counting the ATen ops that read a tensor's value back to the host: a device sync on an accelerator.

CI has no GPU; a step that dispatches none of these ops on the CPU dispatches none on CUDA either (the
engine takes the same path on both, except where it names the device). ``Tensor.tolist()`` and ``.cpu()``
read without dispatching such an op on the CPU and are not seen here. One definition, the bench's
(:mod:`ngvi.experiments.bench.counting`), so that the tests and ``ngvi bench`` count the same ops.
"""

from __future__ import annotations

from ngvi.experiments.bench.counting import SYNC_OPS, OpCounter

__all__ = ["SYNC_OPS", "OpCounter"]
