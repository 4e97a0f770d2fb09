"""PyTorch Lightning: ngvi's optimizers run under Lightning's own loop (it calls ``step(closure)``); this
callback adds what the loop cannot know. Needs ``lightning`` (the dev extra); ``import ngvi`` does not.

    trainer = lightning.Trainer(..., callbacks=[ngvi.integrations.lightning.CheckFinite()])
"""

from __future__ import annotations

from typing import Any

import lightning

__all__ = ["CheckFinite"]


class CheckFinite(lightning.Callback):
    """At the end of ``fit``, read the device check's last flags (``finite_check="device"``, the default on
    an accelerator): a non-finite last step was masked on the device, and its error would otherwise come
    at a next step that never runs. Raises ``NonFiniteGradientError`` as ``opt.check_finite()`` does (or
    counts the step with ``skip_nonfinite=True``)."""

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        for opt in trainer.optimizers:
            opt = getattr(opt, "_optimizer", opt)  # a LightningOptimizer wraps the optimizer
            if hasattr(opt, "check_finite"):
                opt.check_finite()
