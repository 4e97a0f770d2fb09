"""The running statistics a training forward pass writes into normalisation layers, kept for a roll-back.

A step that ``skip_nonfinite=True`` skips leaves μ and the optimizer state as they were, but its forward
passes have already moved batch norm's running mean and variance: one NaN example makes them NaN for good,
and every later prediction with them. While a training sample is open, :class:`BufferGuard` copies the
buffers of each normalisation layer the first time that layer runs in training mode; a discarded sample or
a skipped step copies them back. It is a process-wide forward pre-hook, installed only for the duration of a
training sample of an optimizer that skips (the default raises instead, and pays nothing).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _NormBase

Snapshot = dict[nn.Module, dict[str, Tensor]]


class BufferGuard:
    """Per pending sample, the normalisation buffers as they were before that sample's forward passes."""

    def __init__(self) -> None:
        self._samples: list[Snapshot] = []
        self._handle = None

    def begin_sample(self) -> None:
        self._samples.append({})
        self._handle = nn.modules.module.register_module_forward_pre_hook(self._before_forward)

    def end_sample(self, discard: bool) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if discard and self._samples:
            _restore(self._samples.pop())

    def discard_all(self) -> None:
        """Every pending sample's buffers back, the latest first (so the earliest copy wins)."""
        while self._samples:
            _restore(self._samples.pop())

    def commit(self) -> None:
        self._samples.clear()

    @torch.no_grad()
    def commit_unless(self, bad: Tensor) -> None:
        """The device path's commit: where ``bad`` (a 0-dim bool on the device) is True, every pending
        sample's buffers back as :meth:`discard_all` would; no value is read by the host."""
        while self._samples:
            for module, buffers in self._samples.pop().items():
                for name, saved in buffers.items():
                    now = getattr(module, name)
                    now.copy_(torch.where(bad.to(now.device), saved, now))

    def _before_forward(self, module: nn.Module, args: tuple) -> None:
        if isinstance(module, _NormBase) and module.training and module.track_running_stats:
            snapshot = self._samples[-1]
            if module not in snapshot:
                snapshot[module] = {
                    name: buf.detach().clone() for name, buf in module.named_buffers(recurse=False)
                }


@torch.no_grad()
def _restore(snapshot: Snapshot) -> None:
    for module, buffers in snapshot.items():
        for name, saved in buffers.items():
            getattr(module, name).copy_(saved)
