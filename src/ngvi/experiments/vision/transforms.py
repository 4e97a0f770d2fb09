"""Image transforms in plain torch (no torchvision): rotation for the shift curve, and augmentations.

:func:`rotate` turns a batch of images by an angle about their centre with bilinear interpolation
(``F.affine_grid`` + ``F.grid_sample``); pixels that come from outside the image are 0, the background of
MNIST in [0, 1] — so rotate before normalising. The augmentation hooks take a batch and a generator and
return a batch of the same shape; ``ngvi classify --augment`` applies one to every training minibatch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

Augmentation = Callable[[Tensor, torch.Generator], Tensor]


def rotate(images: Tensor, degrees: float) -> Tensor:
    """``images`` [N, C, H, W] (or [N, H, W]) turned counter-clockwise by ``degrees`` about the centre."""
    squeeze = images.dim() == 3
    x = images.unsqueeze(1) if squeeze else images
    if x.dim() != 4:
        raise ValueError(f"images must be [N, C, H, W] or [N, H, W], got {tuple(images.shape)}")
    x = x if x.is_floating_point() else x.float()
    if degrees % 360 == 0:
        return images.clone() if images.is_floating_point() else x.squeeze(1) if squeeze else x
    a = math.radians(degrees)
    # affine_grid maps output to input coordinates: the inverse rotation; y points down in image coordinates
    theta = torch.tensor([[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]], dtype=x.dtype)
    grid = F.affine_grid(theta.expand(x.shape[0], 2, 3), list(x.shape), align_corners=False)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out.squeeze(1) if squeeze else out


def random_shift(max_pixels: int = 2, fill: float = 0.0) -> Augmentation:
    """Translate each image by up to ``max_pixels`` in each direction (padding with ``fill``)."""

    def apply(x: Tensor, generator: torch.Generator) -> Tensor:
        n, h, w = x.shape[0], x.shape[-2], x.shape[-1]
        padded = F.pad(x, (max_pixels,) * 4, value=fill)
        dy, dx = torch.randint(0, 2 * max_pixels + 1, (2, n), generator=generator).tolist()
        return torch.stack([padded[i, ..., dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(n)])

    return apply


def flip_crop(padding: int = 4) -> Augmentation:
    """CIFAR's standard augmentation (NNG Table 2's [D]): a random horizontal flip and a random 32×32 crop of
    the image zero-padded by ``padding`` pixels."""
    shift = random_shift(padding)

    def apply(x: Tensor, generator: torch.Generator) -> Tensor:
        flip = torch.rand(x.shape[0], generator=generator) < 0.5
        x = torch.where(flip.view(-1, *[1] * (x.dim() - 1)), x.flip(-1), x)
        return shift(x, generator)

    return apply


AUGMENTATIONS: dict[str, Callable[[], Augmentation]] = {"shift": random_shift, "flip-crop": flip_crop}
