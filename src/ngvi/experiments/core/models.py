"""The experiments' models: the papers' MLP (regression, classification), a small CNN, and a 1-D network
with a fixed random ReLU layer (linear in its trained weights: ``ngvi demo``'s, whose posterior is exact)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ngvi.baselines import mc_dropout_mlp


def mlp(
    in_features: int,
    hidden: int | Sequence[int],
    out_features: int = 1,
    *,
    activation: type[nn.Module] = nn.ReLU,
    dropout: float | None = None,
    flatten: bool = False,
) -> nn.Sequential:
    """``Linear → activation`` per hidden layer, then ``Linear``; with ``dropout`` Gal's MC-dropout net
    (:func:`ngvi.baselines.mc_dropout_mlp`: dropout before every Linear). ``flatten``: images in."""
    if dropout:
        net = mc_dropout_mlp(in_features, out_features, hidden, p=dropout, activation=activation)
        return nn.Sequential(nn.Flatten(), *net) if flatten else net
    widths = [hidden] if isinstance(hidden, int) else list(hidden)
    layers: list[nn.Module] = [nn.Flatten()] if flatten else []
    for width in widths:
        layers += [nn.Linear(in_features, width), activation()]
        in_features = width
    return nn.Sequential(*layers, nn.Linear(in_features, out_features))


def cnn(channels: int = 32, side: int = 28, classes: int = 10, in_channels: int = 1) -> nn.Sequential:
    """LeNet-like: two 3×3 convolutions with 2×2 max-pooling (``channels``, then twice as many), a hidden
    layer of 128 and a linear read-out, for ``side``×``side`` images."""
    return nn.Sequential(
        nn.Conv2d(in_channels, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * channels * (side // 4) ** 2, 128), nn.ReLU(), nn.Linear(128, classes),
    )  # fmt: skip


class ReLUFeatures(nn.Module):
    """x ↦ relu(sⱼ (x − cⱼ)) for j = 1..``width``: ReLU units whose kinks cⱼ are drawn uniformly from
    ``kinks`` and whose slopes sⱼ are ±``slope`` (each sign with probability ½), seeded. They are buffers,
    not parameters, so an optimizer never sees them and a network built on them is linear in its weights."""

    def __init__(self, width: int, kinks: tuple[float, float], slope: float, seed: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        low, high = kinks
        self.register_buffer("kink", low + (high - low) * torch.rand(width, generator=gen))
        signs = torch.where(torch.rand(width, generator=gen) < 0.5, -1.0, 1.0)
        self.register_buffer("slope", slope * signs)

    def forward(self, x: Tensor) -> Tensor:
        """[n, 1] inputs to [n, width] features."""
        return torch.relu(self.slope.to(x.dtype) * (x - self.kink.to(x.dtype)))


def random_relu_net(width: int, kinks: tuple[float, float], slope: float, seed: int) -> nn.Sequential:
    """A 1-``width``-1 ReLU network whose hidden layer is fixed (:class:`ReLUFeatures`) and whose output layer
    (``width`` weights and a bias) is its only parameters."""
    return nn.Sequential(ReLUFeatures(width, kinks, slope, seed), nn.Linear(width, 1))
