"""ngvi's optimizers under PyTorch Lightning with an LR scheduler (issue 15; ``lightning``: the dev extra).

A LightningModule returns ``{"optimizer": ngvi.X(...), "lr_scheduler": cosine}`` from configure_optimizers
and Lightning's automatic optimisation calls ``optimizer.step(closure)``, its closure zeroing the gradients,
running training_step and the backward pass: the ngvi engine calls that closure once per MC sample. The run
must be the same, bit for bit, as the plain loop ``opt.step(closure); scheduler.step()`` over the same
batches: the same weights, the same posterior, the scheduler's learning rate at every step.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import ngvi

lightning = pytest.importorskip("lightning")
#: raised inside lightning 2.6 on torch 2.13 (its pytree helper), not by ngvi
pytestmark = pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated")

N, STEPS, BATCH = 128, 12, 32

OPTIMIZERS = {
    "vadam": lambda m: ngvi.Vadam(m.parameters(), N, lr=1e-2, mc_samples=2, seed=0),
    "ivon": lambda m: ngvi.IVON(m.parameters(), N, seed=0),
    "vogn": lambda m: ngvi.VOGN(m, N, seed=0),
    "noisy_kfac": lambda m: ngvi.NoisyKFAC(m, N, seed=0),
}


def data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, 4, generator=gen)
    return x, x.sum(1, keepdim=True).sin()


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))


def cosine(opt) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)


def loss_of(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * (net(x) - y).square().mean()


class Module(lightning.LightningModule):
    def __init__(self, make) -> None:
        super().__init__()
        self.net, self.make, self.lrs = model(), make, []

    def on_train_batch_start(self, batch, batch_idx):
        self.lrs.append(self.optimizers().param_groups[0]["lr"])

    def training_step(self, batch, batch_idx):  # called once per MC sample, inside the engine's step
        return loss_of(self.net, *batch)

    def configure_optimizers(self):
        opt = self.make(self.net)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": cosine(opt), "interval": "step"}}


def plain_loop(make):
    net, (x, y) = model(), data()
    opt = make(net)
    sched, lrs = cosine(opt), []
    for k in range(STEPS):
        xb, yb = x[k * BATCH % N :][:BATCH], y[k * BATCH % N :][:BATCH]

        def closure(xb=xb, yb=yb):
            opt.zero_grad()
            loss = loss_of(net, xb, yb)
            loss.backward()
            return loss

        lrs.append(opt.param_groups[0]["lr"])
        opt.step(closure)
        sched.step()
    return net, opt, lrs


def quiet_trainer(**options) -> lightning.Trainer:
    return lightning.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **options,
    )


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_lightning_with_a_cosine_schedule_is_the_plain_loop(name):
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data()), batch_size=BATCH)
    module = Module(OPTIMIZERS[name])
    trainer = quiet_trainer()
    trainer.fit(module, loader)
    opt = trainer.optimizers[0]
    net, twin, lrs = plain_loop(OPTIMIZERS[name])
    assert opt.num_steps == twin.num_steps == STEPS
    assert module.lrs == lrs and lrs[-1] < lrs[0]  # the schedule drove both
    for p, q in zip(module.net.parameters(), net.parameters(), strict=True):
        assert torch.equal(p, q)
    for a, b in zip(opt.posterior().variance, twin.posterior().variance, strict=True):
        assert torch.equal(a, b)
    assert opt.diagnostics().precision_moved == 1.0


class NaNAtTheEnd(Module):
    """The last step's loss is NaN: under ``finite_check="device"`` that step is masked and flagged."""

    def training_step(self, batch, batch_idx):
        loss = loss_of(self.net, *batch)
        return loss * float("nan") if self.trainer.global_step == STEPS - 1 else loss


@pytest.mark.parametrize("callback", [True, False])
def test_the_last_steps_deferred_error_is_read_at_the_end_of_fit(callback):
    """Without ``CheckFinite`` the masked last step's error is lost: fit ends as if all went well."""
    from ngvi.integrations.lightning import CheckFinite

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data()), batch_size=BATCH)
    module = NaNAtTheEnd(lambda m: ngvi.IVON(m.parameters(), N, seed=0, finite_check="device"))
    trainer = quiet_trainer(callbacks=[CheckFinite()] if callback else [])
    if callback:
        with pytest.raises(ngvi.NonFiniteGradientError, match=f"step {STEPS} had a non-finite value"):
            trainer.fit(module, loader)
    else:
        trainer.fit(module, loader)
        assert len(trainer.optimizers[0]._pending_checks) == 1  # unread
