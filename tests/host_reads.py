"""Counting the ATen ops that read a tensor's value back to the host: a device sync on an accelerator.

CI has no GPU; a step that dispatches none of these ops on the CPU dispatches none on CUDA either (the
engine takes the same path on both, except where it names the device). ``Tensor.tolist()`` and ``.cpu()``
read without dispatching such an op on the CPU and are not seen here.
"""

from __future__ import annotations

import collections

from torch.utils._python_dispatch import TorchDispatchMode

#: ``_linalg_check_errors`` is the check inside ``torch.linalg.cholesky`` (not ``cholesky_ex``) and kin
SYNC_OPS = frozenset(
    {"aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.nonzero", "aten._linalg_check_errors"}
)


class OpCounter(TorchDispatchMode):
    """Counts every ATen op dispatched inside the block, by overload packet name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def syncs(self) -> dict[str, int]:
        return {k: v for k, v in self.ops.items() if k in SYNC_OPS}

    @property
    def sync_count(self) -> int:
        return sum(self.syncs.values())
