"""The image classifiers of ``ngvi classify``: an MLP and LeNet-5 for MNIST, NNG's half-width VGG16 and a
ResNet-20 for CIFAR-10.

Every trainable parameter sits in an ``nn.Linear``, ``nn.Conv2d`` or ``nn.BatchNorm2d`` layer with its stock
forward, so VOGN and noisy K-FAC can hook all of them (batch-norm parameters are point estimates there:
see :mod:`ngvi.curvature.layers`). ``dropout`` puts ``nn.Dropout`` before every Linear layer (MC dropout).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

#: NNG §5.2, footnote 6: VGG16 with half the filters; "M" is 2×2 max-pooling
VGG16_HALF = (32, 32, "M", 64, 64, "M", 128, 128, 128, "M", 256, 256, 256, "M", 256, 256, 256, "M")


def _head(widths: Sequence[int], classes: int, dropout: float | None) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(widths, [*widths[1:], classes], strict=True)):
        if dropout:
            layers.append(nn.Dropout(dropout))
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(widths) - 1:
            layers.append(nn.ReLU())
    return layers


def mlp(hidden: Sequence[int] = (400, 400), classes: int = 10, in_features: int = 784,
        dropout: float | None = None) -> nn.Sequential:  # fmt: skip
    """Flatten → (Linear → ReLU) per hidden layer → Linear (Khan et al. 2018's MNIST MLP: 784-400-400-10)."""
    return nn.Sequential(nn.Flatten(), *_head([in_features, *hidden], classes, dropout))


def lenet5(classes: int = 10, in_channels: int = 1, *, batch_norm: bool = False,
           dropout: float | None = None) -> nn.Sequential:  # fmt: skip
    """LeNet-5 (LeCun et al. 1998) with ReLU and max-pooling for 28×28 inputs: conv 5×5 (6, padded to keep
    28×28) → pool → conv 5×5 (16) → pool → 400 → 120 → 84 → ``classes``. ``batch_norm``: BatchNorm2d after
    each convolution (whose bias it makes redundant, so the convolutions have none)."""

    def conv(cin: int, cout: int, padding: int) -> list[nn.Module]:
        layers: list[nn.Module] = [nn.Conv2d(cin, cout, 5, padding=padding, bias=not batch_norm)]
        return [*layers, nn.BatchNorm2d(cout)] if batch_norm else layers

    return nn.Sequential(
        *conv(in_channels, 6, 2), nn.ReLU(), nn.MaxPool2d(2),
        *conv(6, 16, 0), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), *_head([16 * 5 * 5, 120, 84], classes, dropout),
    )  # fmt: skip


def vgg16_half(classes: int = 10, in_channels: int = 3, *, batch_norm: bool = False,
               dropout: float | None = None) -> nn.Sequential:  # fmt: skip
    """NNG's modified VGG16 for 32×32 images (§5.2: 32-32-M-64-64-M-128-128-128-M-256-256-256-M-256-256-256-M
    -FC10): 3×3 convolutions with padding 1, each followed by ReLU (BatchNorm2d first with ``batch_norm``,
    as NNG Table 2's [B]), then one Linear layer from the 256 features to ``classes``."""
    layers: list[nn.Module] = []
    cin = in_channels
    for item in VGG16_HALF:
        if item == "M":
            layers.append(nn.MaxPool2d(2))
            continue
        layers.append(nn.Conv2d(cin, int(item), 3, padding=1, bias=not batch_norm))
        if batch_norm:
            layers.append(nn.BatchNorm2d(int(item)))
        layers.append(nn.ReLU())
        cin = int(item)
    return nn.Sequential(*layers, nn.Flatten(), *_head([cin], classes, dropout))


class BasicBlock(nn.Module):
    """He et al. (2016) §4.2: conv 3×3 → BN → ReLU → conv 3×3 → BN, plus the shortcut, → ReLU. A block that
    halves the resolution and doubles the width uses option A: the input subsampled and zero-padded in
    channels (no parameters)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.stride, self.pad = stride, cout - cin

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x[:, :, :: self.stride, :: self.stride] if self.stride > 1 else x
        if self.pad:
            shortcut = F.pad(shortcut, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return F.relu(out + shortcut)


def resnet20(classes: int = 10, in_channels: int = 3, *, dropout: float | None = None) -> nn.Sequential:
    """ResNet-20 for CIFAR (He et al. 2016, §4.2, n = 3): conv 3×3 (16) → BN → ReLU, three stages of three
    basic blocks (16, 32, 64 filters; the 2nd and 3rd stages start with stride 2), global average pooling,
    Linear to ``classes``. 0.27 M parameters."""
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, 16, 3, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
    ]
    cin = 16
    for width, stride in ((16, 1), (32, 2), (64, 2)):
        for block in range(3):
            layers.append(BasicBlock(cin, width, stride if block == 0 else 1))
            cin = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), *_head([cin], classes, dropout))
