r"""The FLOP floor of a K-FAC step, counted from the model's layers, and the machine's matmul rate.

For every nn.Linear / nn.Conv2d layer (G groups, o outputs and d inputs per group, d' = d + 1 with a bias,
T output positions per example: 1 for a Linear layer on [batch, features], the output pixels of a
convolution) and a batch of B examples, one K-FAC step needs at least (in multiply-adds; FLOPs are twice
these):

=================== ====================================== =================================================
term                multiply-adds                          what
=================== ====================================== =================================================
forward             G·B·T·o·d                              s = W a
backward            G·B·T·o·d (+ the same for the input    ∇W = Σ δ aᵀ, and δ for the layer below (not for
                    gradient, except the first layer)      the first layer)
factor products     G·B·T·(d'² + o²) / T_stats             A = E[āāᵀ] (KFC: summed over positions), S = E[δδᵀ]
preconditioning     G·o·d'·(o + d')                        S⁻¹ V A⁻¹, every step
=================== ====================================== =================================================

That sum is the floor the bench divides noisy K-FAC's and K-FAC's steps by. Beside it, and not in the floor,
the terms that a step may need on top: the weight sample B_S E B_Aᵀ (G·o·d'·(o + d')), the local
reparameterisation's ā B_A, its backward and E B_Sᵀ (G·B·(2d'² + o²)), and the factor inversions,
≈ 2(d'³ + o³)/3 per damping amortised over T_inv (a Cholesky factorisation d³/3 and an inverse from it
2d³/3, for each of the two dampings). Element-wise work (Adam's moments, the EMA, the noise draw) is left
out: it is memory-bound and small at these sizes.

Seconds follow from the rate of a float32 matrix product measured in the same process
(:func:`matmul_rate`): floor seconds = 2 × multiply-adds / rate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class LayerShape:
    name: str
    groups: int
    rows: int  # o per group
    cols: int  # d' per group (with the bias column)
    inputs: int  # d per group (without it)
    positions: int  # T per example
    first: bool


@dataclass
class KFACFlops:
    """Multiply-adds of one K-FAC step, per term (see the module docstring)."""

    batch: int
    layers: list[LayerShape] = field(default_factory=list)
    stats_every: int = 1
    inv_every: int = 20

    def forward(self) -> float:
        return sum(s.groups * self.batch * s.positions * s.rows * s.inputs for s in self.layers)

    def backward(self) -> float:
        return sum(
            s.groups * self.batch * s.positions * s.rows * s.inputs * (1 if s.first else 2)
            for s in self.layers
        )

    def factors(self) -> float:
        return (
            sum(s.groups * self.batch * s.positions * (s.cols**2 + s.rows**2) for s in self.layers)
            / self.stats_every
        )

    def preconditioning(self) -> float:
        return sum(s.groups * s.rows * s.cols * (s.rows + s.cols) for s in self.layers)

    def weight_sample(self) -> float:
        return self.preconditioning()

    def local_sample(self) -> float:
        return sum(
            s.groups * self.batch * (2 * s.cols**2 + s.rows**2) for s in self.layers if s.positions == 1
        )

    def inversions(self) -> float:
        return sum(s.groups * 2 * 2 * (s.cols**3 + s.rows**3) / 3 for s in self.layers) / self.inv_every

    def floor(self) -> float:
        """forward + backward + factor products + preconditioning."""
        return self.forward() + self.backward() + self.factors() + self.preconditioning()

    def terms(self) -> dict[str, float]:
        return {
            "forward": self.forward(),
            "backward": self.backward(),
            "factor products": self.factors(),
            "preconditioning": self.preconditioning(),
            "floor": self.floor(),
            "weight sample (not in the floor)": self.weight_sample(),
            "local sample (not in the floor)": self.local_sample(),
            "inversions, amortised (not in the floor)": self.inversions(),
        }


def kfac_flops(model: nn.Module, x: torch.Tensor, stats_every: int = 1, inv_every: int = 20) -> KFACFlops:
    """The layer shapes of ``model`` on the batch ``x`` (one forward pass with hooks), as a KFACFlops."""
    out = KFACFlops(batch=x.shape[0], stats_every=stats_every, inv_every=inv_every)
    handles = []

    def record(name: str, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        bias = module.bias is not None
        if isinstance(module, nn.Conv2d):
            g = module.groups
            inputs = module.weight[0].numel()
            positions = output.shape[-2] * output.shape[-1]
            rows = module.out_channels // g
        else:
            g, inputs, rows = 1, module.in_features, module.out_features
            positions = output.numel() // (output.shape[0] * rows)
        shape = LayerShape(name, g, rows, inputs + bias, inputs, positions, first=not out.layers)
        out.layers.append(shape)

    for name, module in model.named_modules():
        if isinstance(module, nn.Linear | nn.Conv2d):
            handles.append(module.register_forward_hook(lambda m, a, o, name=name: record(name, m, a, o)))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return out


def matmul_rate(size: int = 1024, repeats: int = 5, device: torch.device | None = None) -> float:
    """FLOP/s of a float32 [size, size] @ [size, size] product on this thread count (the best of
    ``repeats``): the rate the floor's seconds are computed with."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        a @ b
        if device is not None and device.type != "cpu":
            torch.accelerator.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best
