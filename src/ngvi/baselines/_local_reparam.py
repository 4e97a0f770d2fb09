r"""BBVI's local reparameterisation (Kingma et al. 2015) as a sample-scope plugin, and BBVI's ∂f/∂log σ.

While a training sample is open, each ``nn.Linear`` layer gets leaves for its log σ and a forward hook that
turns the layer's output at the mean, x μᵀ + b_μ, into

.. math::
    x\mu^\top + b_\mu + \sqrt{x^2(\sigma^2)^\top + \sigma_b^2}\odot\varepsilon,\qquad
    \varepsilon \sim \mathcal N(0, I) \text{ per example and unit},

the exact distribution of the layer's output under q, with independent weights per example. Autograd then
gives ∂f/∂log σ through the hook; the engine leaves these layers' weights at μ (``BBVI.unsampled``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .._tensorlist import TensorList
from ..curvature.estimators import CurvatureEstimator, CurvatureInput

__all__ = ["LocalReparameterisation", "LogStdGradient"]


class LocalReparameterisation:
    """The plugin: hooks on ``layers`` (name, nn.Linear) inside each training sample of its optimizer."""

    def __init__(self, layers: list[tuple[str, nn.Linear]]) -> None:
        self.layers = layers
        self.params = {p for _, m in layers for p in (m.weight, m.bias) if p is not None}
        self.owner: Any = None
        self.active = False
        self.leaves: dict[Tensor, Tensor] = {}  # parameter -> log σ leaf of the current sample

    def bind(self, owner: Any) -> None:
        """The optimizer whose state (log σ) and generator the hooks read."""
        self.owner = owner

    @contextlib.contextmanager
    def scope(self, *, train: bool) -> Iterator[None]:
        if not (train and self.params):
            yield
            return
        self.active = True
        handles = []
        try:
            handles = self._attach()
            yield
        finally:
            for handle in handles:
                handle.remove()
            self.active = False
            self.leaves.clear()

    def _attach(self) -> list[Any]:
        handles = []
        for _, module in self.layers:
            leaves = []
            for p in (module.weight, module.bias):
                leaf = None
                if p is not None and p.requires_grad and p in self.owner.state:  # frozen ones stay fixed
                    leaf = self.leaves[p] = self.owner.state[p]["log_std"].detach().requires_grad_(True)
                leaves.append(leaf)
            if leaves[0] is not None or leaves[1] is not None:
                hook = functools.partial(self._output, leaves[0], leaves[1])
                handles.append(module.register_forward_hook(hook, with_kwargs=True))
        return handles

    def _output(
        self,
        log_std_w: Tensor | None,
        log_std_b: Tensor | None,
        module: nn.Linear,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Tensor,
    ) -> Tensor:
        """x μᵀ + b_μ (the layer's own output at the mean) + √(x²σ_W²ᵀ + σ_b²) ⊙ ε."""
        x = args[0] if args else kwargs["input"]
        # (σ² in the layer's dtype: a float32 state of a bfloat16 layer, fp32_state, is cast for the product)
        var = F.linear(x.square(), (2.0 * log_std_w).exp().to(x.dtype)) if log_std_w is not None else 0.0
        if log_std_b is not None:
            var = var + (2.0 * log_std_b).exp().to(output.dtype)
        var = torch.as_tensor(var, dtype=output.dtype, device=output.device)
        generator = self.owner.noise_source.generator(output.device)
        noise = torch.randn(output.shape, generator=generator, dtype=output.dtype, device=output.device)
        return output + var.clamp_min(torch.finfo(var.dtype).tiny).sqrt() * noise

    def bypass_message(self, p: Tensor) -> str:
        name, which = next(
            (name, "weight" if p is m.weight else "bias")
            for name, m in self.layers
            if p is m.weight or p is m.bias
        )
        return (
            f"BBVI: the {which} of Linear layer '{name}' received a gradient without the layer's forward() "
            "being called (e.g. nn.MultiheadAttention reads out_proj.weight directly), so the local "
            "reparameterisation cannot sample it; create BBVI(..., local_reparam=False)"
        )


class LogStdGradient(CurvatureEstimator):
    """BBVI's second statistic is not a curvature but ∂f/∂log σ of the sample: ĝ⊙ε⊙σ for sampled weights,
    autograd's value through the hook for the layers of the local trick. It travels in the engine's ĥ slot,
    so it is averaged over samples and checked for finiteness with ĝ."""

    name = "log_std_grad"
    needs_noise = True

    def __init__(self, local_trick: LocalReparameterisation) -> None:
        self.local_trick = local_trick

    def estimate(self, sample: CurvatureInput) -> TensorList:
        std = TensorList(torch._foreach_exp([st["log_std"] for st in sample.states]))
        trick = self.local_trick
        out = []
        for i, p in enumerate(sample.params):
            leaf = trick.leaves.get(p) if trick.active else None
            if leaf is None:
                assert sample.noise is not None  # BBVI draws its weights: a sample always has noise
                out.append(sample.grads[i] * sample.noise[i] * std[i])
            elif leaf.grad is None:
                raise RuntimeError(trick.bypass_message(p))
            else:
                out.append(leaf.grad)
        return TensorList(out)
