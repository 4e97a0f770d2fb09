"""The experiments' models: the papers' MLP (regression, classification) and a small CNN."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

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
