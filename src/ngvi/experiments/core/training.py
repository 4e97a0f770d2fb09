"""One training loop for every experiment and method.

The closure is the library's contract: zero the gradients, compute the loss, and hand the backward pass to
``trainer.backward(loss, output)``, which runs it as the trainer needs (a graph for Hutchinson, sampled
targets for the true Fisher, plain ``loss.backward()`` otherwise). Experiments never branch on the method.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

LossFn = Callable[[Tensor, Tensor], Tensor]


def closure(model: nn.Module, trainer: Any, loss_fn: LossFn, x: Tensor, y: Tensor) -> Callable[[], Tensor]:
    """The closure of one minibatch (any torch optimizer works too: it falls back to ``loss.backward()``)."""
    backward = getattr(trainer, "backward", None)

    def run() -> Tensor:
        trainer.zero_grad()
        output = model(x)
        loss = loss_fn(output, y)
        if backward is None:
            loss.backward()
        else:
            backward(loss, output)
        return loss

    return run


def train(
    model: nn.Module,
    trainer: Any,
    x: Tensor,
    y: Tensor,
    loss_fn: LossFn,
    *,
    epochs: int,
    batch_size: int | None = None,
    generator: torch.Generator | None = None,
    copies: int = 1,
    after_epoch: Callable[[int], None] | None = None,
    progress: Any = None,
    augment: Callable[[Tensor, torch.Generator | None], Tensor] | None = None,
) -> list[float]:
    """Train for ``epochs`` passes over (x, y); returns the mean loss of every step.

    ``batch_size=None`` takes full-batch steps (one per epoch); otherwise each epoch visits a fresh
    permutation (drawn from ``generator``) in minibatches. ``copies`` repeats each minibatch that many times
    in one forward pass (MC samples drawn as rows: under the local reparameterisation every row gets its own
    noise). ``after_epoch(epoch)`` runs after every epoch (evaluation curves); ``progress`` (a tqdm bar) is
    advanced once per step. ``augment(xb, generator)`` transforms each
    minibatch's inputs before the step (data augmentation; drawn from ``generator``)."""
    n = x.shape[0]
    losses = []
    for epoch in range(epochs):
        model.train()
        batches = (
            [slice(None)] if batch_size is None else torch.randperm(n, generator=generator).split(batch_size)
        )
        for idx in batches:
            xb, yb = x[idx], y[idx]
            if augment is not None:
                xb = augment(xb, generator)
            if copies > 1:
                xb, yb = xb.repeat(copies, *[1] * (xb.dim() - 1)), yb.repeat(copies, *[1] * (yb.dim() - 1))
            loss = trainer.step(closure(model, trainer, loss_fn, xb, yb))
            losses.append(float(loss.detach()) if isinstance(loss, Tensor) else float(loss))
            if progress is not None:
                progress.update()
        if after_epoch is not None:
            after_epoch(epoch)
    return losses
