r"""Non-finite steps decided on the device: the finiteness contract without a host sync.

The engine has two paths for a step whose ĝ, ĥ or loss holds a NaN or Inf, picked in one place
(:func:`use_device_check`, from ``finite_check=``):

``"auto"`` (the default)
    ``"device"`` where the parameters are on an accelerator, ``"host"`` on the CPU (where a read costs
    nothing and the golden trajectories are pinned) and for the K-FAC family, whose mask (a select of every
    factor and inverse it replaces) cost more than the read on an H200 (docs/results/bench/gpu).

``"host"``
    One value is read back at the step: a bad step is refused before the update runs (``skip_nonfinite``:
    skipped and counted; otherwise ``NonFiniteGradientError``), with the noise and the step count rolled
    back. On the CPU a read costs nothing, and this is the path the golden trajectories pin.

``"device"``
    Reading a value back drains an accelerator's queue, so the host could never run ahead of the GPU. The
    flags are computed on the device (one max-norm per tensor, :func:`nonfinite_flags`), and the update runs
    *masked*: μ and every state tensor it writes are snapshot and selected back with ``where(bad, before,
    after)`` (:func:`masked`), so a bad step changes no μ and no state, bitwise, without the host knowing.
    The flags travel to the host asynchronously (a pinned buffer and an event on CUDA) and are read when they
    have arrived (:class:`PendingChecks`): at the next ``step()`` if ready, and at the latest at
    ``state_dict()``, ``diagnostics()``, ``posterior()`` or ``opt.check_finite()``, which wait for them.
    What a detected bad step then does:

    * ``skip_nonfinite=True``: nothing more; ``skipped_steps`` counts it.
    * otherwise: ``NonFiniteGradientError`` names the step, the parameters and that the update was masked.
      Steps queued after it (on CUDA the host may be a few steps ahead) were applied as usual.

    Unlike the host path, a masked step still counts in the step counters (the clock of the bias
    corrections and of ``num_steps``, and the K-FAC family's count of factor updates) and its noise is not
    drawn again: the host learns of it too late to roll either back. A rule that replaces a state entry
    with a new tensor (the K-FAC family's factors and inverses) gets ``where(bad, old, new)`` in its place.

Measured on an H200 (docs/results/bench/gpu/, the 91M-weight LM): with the flat buffers (:mod:`.flat`) the
mask is a few kernels per flat state tensor, and the device path was the faster one for the rules that
draw (IVON 1.08× AdamW against 1.14× with the read, Vadam 1.13× against 1.27×; BAdam and noisy Adam 0.09×
slower). The select has run in place since (20 bytes moved per element, not 36; not timed on a GPU yet).
Before the buffers the eager mask over 150 tensors cost more than the read (IVON 1.62× against 1.45×),
and the host path was the default everywhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ... import distributed as dist_util

__all__ = ["CHECKS", "PendingChecks", "masked", "nonfinite_flags", "use_device_check"]

#: the values of ``finite_check=``
CHECKS = ("auto", "host", "device")


def use_device_check(opt: Any) -> bool:
    """Whether ``opt`` decides non-finite steps on the device: ``finite_check="device"`` (which only rules
    whose update can be masked accept), or ``"auto"`` (the default) for such a rule whose parameters are on
    an accelerator, unless its mask costs more than the read it saves (``_device_check_by_default``)."""
    if opt.finite_check == "auto":
        first = opt.param_groups[0]["params"][0]
        return opt._maskable_update and opt._device_check_by_default and first.device.type != "cpu"
    return opt.finite_check == "device"


def nonfinite_flags(tensors: list[Tensor]) -> Tensor:
    """One bool per tensor, True where it holds a NaN or Inf, on the first tensor's device, with no sync.

    The max-norm propagates NaN and Inf, cannot overflow for finite values and squares nothing (so no
    subnormals, which x86 computes ~20× slower). Tensors on other devices are reduced on their own."""
    device = tensors[0].device
    norms = []
    for dev in dict.fromkeys(t.device for t in tensors):  # per device, in first-seen order
        part = [t if t.numel() else t.new_zeros(1) for t in tensors if t.device == dev]  # max of ∅: none
        wide = torch.float64 if any(t.dtype == torch.float64 for t in part) else torch.float32
        norms.append((dev, torch._foreach_norm(part, float("inf"), dtype=wide)))
    if len(norms) == 1:
        return ~torch.stack(norms[0][1]).isfinite()
    by_device = {dev: iter(n) for dev, n in norms}
    ordered = [next(by_device[t.device]).to(device, torch.float64, non_blocking=True) for t in tensors]
    return ~torch.stack(ordered).isfinite()


def agreed(bad: Tensor) -> Tensor:
    """``bad`` OR-ed over the ranks of torch.distributed, on the device (a collective, not a host read)."""
    if not dist_util.is_distributed():
        return bad
    flag = bad.to(torch.int32)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return flag.bool()


#: up to this many tensors of a dtype (the flat buffers), each is selected back in place: 20 bytes per
#: element moved, not the 36 of a gather into one buffer, a select and a scatter back (one kernel each)
FEW = 8


@contextlib.contextmanager
@torch.no_grad()
def masked(written: list[Tensor], bad: Tensor, states: list[dict[str, Any]] = ()) -> Iterator[None]:
    """Run the block's in-place writes to ``written`` only where ``bad`` (a 0-dim bool) is False.

    Per (device, dtype), the tensors are snapshot into one flat buffer before the block and afterwards
    set to ``where(bad, snapshot, now)``: in place for a few tensors (:data:`FEW`), else gathered, selected
    and scattered back (a constant number of kernels per dtype); bitwise the block's own result when
    ``bad`` is False (``where`` selects, it computes nothing). A tensor entry of
    ``states`` that the block replaces becomes ``where(bad, old, new)`` (a new entry: ``where(bad, 0, new)``),
    the old tensor being untouched by a rule that replaces it."""
    parts: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for t in dict.fromkeys(written):  # a tensor listed twice (μ and the parameter) is kept once
        parts.setdefault((t.device, t.dtype), []).append(t)
    before = {key: torch.cat([t.reshape(-1) for t in ts]) for key, ts in parts.items()}
    entries = [(st, {k: v for k, v in st.items() if isinstance(v, Tensor)}) for st in states]
    try:
        yield
    except BaseException:  # an update that raised part-way: everything as before it
        for key, ts in parts.items():
            _copy_back(ts, before[key])
        for st, old in entries:
            for k in [k for k, v in st.items() if isinstance(v, Tensor) and k not in old]:
                del st[k]
            st.update(old)
        raise
    for (device, dtype), ts in parts.items():
        flag = bad.to(device, non_blocking=True)
        if len(ts) <= FEW:  # the flat buffers: select in place (a where reading and writing the same element)
            for t, old in zip(ts, before[device, dtype].split([t.numel() for t in ts]), strict=True):
                torch.where(flag, old.view(t.shape), t, out=t)
            continue
        after = torch.cat([t.reshape(-1) for t in ts])
        _copy_back(ts, torch.where(flag, before[device, dtype], after))
    for st, old in entries:
        for k, new in st.items():
            if isinstance(new, Tensor) and old.get(k) is not new:
                kept = old[k] if k in old else torch.zeros_like(new)
                st[k] = torch.where(bad.to(new.device, non_blocking=True), kept, new)


def _copy_back(tensors: list[Tensor], flat: Tensor) -> None:
    views = flat.split([t.numel() for t in tensors])
    torch._foreach_copy_(tensors, [v.view(t.shape) for v, t in zip(views, tensors, strict=True)])


@dataclass
class _Check:
    """The flags of one step, on their way to the host."""

    step: int  # num_steps before the step
    flags: Tensor  # bool per checked tensor: on the host once ``ready``
    ready: Any  # a CUDA event, or None when ``flags`` is readable now (CPU)
    describe: Callable[[list[int]], list[str]]  # the places of the flagged tensors (formatted on failure)


class PendingChecks:
    """The device path's flags not yet read by the host, oldest first."""

    def __init__(self) -> None:
        self._checks: list[_Check] = []

    def __len__(self) -> int:
        return len(self._checks)

    def clear(self) -> None:
        self._checks.clear()

    def record(self, step: int, flags: Tensor, describe: Callable[[list[int]], list[str]]) -> None:
        """Send ``flags`` to the host without waiting (CUDA: into pinned memory, then an event)."""
        if flags.device.type == "cpu":
            self._checks.append(_Check(step, flags, None, describe))
            return
        if flags.device.type == "cuda":
            host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
            host.copy_(flags, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._checks.append(_Check(step, host, event, describe))
            return
        self._checks.append(_Check(step, flags, _Later(flags), describe))  # other accelerators: read at drain

    def arrived(self, wait: bool) -> list[tuple[int, list[str]]]:
        """(step, places of the bad tensors) for each check that has arrived (all of them with ``wait``, then
        blocking), oldest first; the arrived checks are forgotten. Reads host memory only."""
        out = []
        while self._checks:
            check = self._checks[0]
            if check.ready is not None and not check.ready.query():  # not there yet
                if not wait:
                    break
                check.ready.synchronize()
                if isinstance(check.ready, _Later):
                    check.flags = check.ready.flags
            self._checks.pop(0)
            bad = check.flags.numpy()  # a host read, not an aten op (no sync is counted or taken)
            if bad.any():
                out.append((check.step, check.describe([int(i) for i in bad.nonzero()[0]])))
        return out


class _Later:
    """An accelerator without events here: its flags are read (with a sync) when the host must know."""

    def __init__(self, flags: Tensor) -> None:
        self.flags = flags

    def query(self) -> bool:
        return False

    def synchronize(self) -> None:
        self.flags = self.flags.cpu()
