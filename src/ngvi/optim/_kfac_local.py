r"""Noisy K-FAC's local reparameterisation: sample a Linear layer's pre-activations, not its weights.

Under the matrix-variate posterior W ~ MN(M, U, V) of a layer (rows ↔ U = [S^γin]⁻¹, columns ↔
V = (λ/N)[A^γin]⁻¹, the bias as the last column of W and a constant 1 appended to the input, ā = (a, 1)),
the pre-activation of one example, s = W ā, is Gaussian with

.. math::
    \mathbb E[s] = M\bar a, \qquad \operatorname{Cov}(s) = (\bar a^\top V \bar a)\, U .

So instead of drawing W (two dense products B_S E B_Aᵀ, o²d' + od'² multiply-adds) and sharing it across
the minibatch, each example i can get its own draw of its pre-activations (the local reparameterisation of
Kingma et al. 2015, for the matrix-variate family as in Louizos & Welling 2016, §3.1):

.. math::
    s_i = M\bar a_i + \sqrt{q_i}\; B_S\,\varepsilon_i,\qquad
    q_i = \tfrac{\lambda}{N}\,\lVert B_A^\top \bar a_i\rVert^2,\qquad \varepsilon_i\sim\mathcal N(0, I_o),

with B_S B_Sᵀ = [S^γin]⁻¹ and B_A B_Aᵀ = [A^γin]⁻¹ the roots the weight sample uses
(:mod:`ngvi.curvature.kfac`). In row form, s = āMᵀ + √q ⊙ (E B_Sᵀ): about m·(2d'² + o²) multiply-adds for m
examples (the forward product, its backward, and the noise), against o·d'·(o + d') for a weight sample.
Every example gets independent noise, so the minibatch gradient has a lower variance (the covariance between
examples that one shared weight sample adds is gone) and the same mean, the gradient of E_q[f]. Autograd
differentiates through √q, so lower layers also get the gradient of the noise's scale.

``sampling=`` of :class:`~ngvi.NoisyKFAC` chooses, for its ``nn.Linear`` layers with a trained weight:

* ``"weights"``: the paper's form (Alg. 2): the engine draws every weight matrix, shared by the minibatch.
* ``"local"``: every such layer is sampled per example as above (inputs must be [batch, features], and a
  layer may run once per forward pass).
* ``"auto"``: per layer and call, whichever of the two costs fewer multiply-adds for the rows at hand; a
  layer that takes the weight draw gets it here, as θ − M = B_S E B_Aᵀ·√(λ/N) added through
  x(θ − M)ᵀ, and keeps it for further calls in the same forward pass (sequences and shared layers work).

Prediction (``sampled_params()`` without ``train``) draws whole weights for every layer, so one forward pass
is one function from the posterior.

Under torch.distributed with ``rank_noise="shared"`` (one generator state on every rank), rank r takes rows
[rB, (r+1)B) of one draw for the R·B examples of all ranks, and "auto" chooses with R·B rows: R ranks ×
batch B then take exactly the steps of one process with batch R·B, as for the weight draw
(:mod:`ngvi.distributed`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .. import distributed as dist_util

__all__ = ["SAMPLINGS", "LocalPreactivations"]

SAMPLINGS = ("auto", "local", "weights")


class LocalPreactivations:
    """The sample-scope plugin: forward hooks on the Linear layers of a :class:`~ngvi.NoisyKFAC`.

    Args:
        layers: (name, module, carrier) for each layer it samples: ``carrier`` is the parameter whose
            optimizer state holds the layer's roots (the weight).
        mode: "local" or "auto" (see the module docstring).
    """

    def __init__(self, layers: list[tuple[str, nn.Linear, Tensor]], mode: str) -> None:
        self.layers = layers
        self.mode = mode
        self.params = {p for _, m, _ in layers for p in (m.weight, m.bias) if p is not None}
        self.owner: Any = None
        self._local: set[str] = set()  # layers sampled per example in the current forward pass
        self._deltas: dict[str, tuple[Tensor, Tensor | None]] = {}  # weight draws θ − M of this sample

    def bind(self, owner: Any) -> None:
        """The optimizer whose state (roots) and noise generator the hooks read."""
        self.owner = owner

    @contextlib.contextmanager
    def scope(self, *, train: bool) -> Iterator[None]:
        if not (train and self.layers):
            yield
            return
        handles = []
        try:
            for name, module, carrier in self.layers:
                hook = _Hook(self, name, carrier)
                handles.append(module.register_forward_hook(hook, with_kwargs=True))
            yield
        finally:
            for handle in handles:
                handle.remove()
            self._local.clear()
            self._deltas.clear()

    def output(
        self, name: str, carrier: Tensor, module: nn.Linear, args: tuple, kwargs: dict, output: Tensor
    ) -> Tensor:
        """The layer's sampled output: its output at the mean plus the local noise or x(θ − M)ᵀ."""
        x = args[0] if args else kwargs["input"]
        state = self.owner.state[carrier]
        if name in self._deltas:  # a further call of a layer that took a weight draw: the same draw
            return output + F.linear(x, *self._deltas[name])
        if name in self._local:
            raise RuntimeError(
                f"NoisyKFAC(sampling={self.mode!r}): layer '{name}' was called twice in one forward pass, "
                "but its first call was sampled per example; both calls must see one weight draw. Create "
                "NoisyKFAC(..., sampling='weights'). If this is gradient accumulation (a second micro-batch "
                "in one sample), concatenate the micro-batches into one forward pass instead"
            )
        rows, outs, cols = x.shape[0] * self._world(), module.out_features, state["A_root"].shape[-1]
        local = x.dim() == 2 and rows * (2.0 * cols * cols + outs * outs) < outs * cols * (outs + cols)
        if self.mode == "local":
            if x.dim() != 2:
                raise RuntimeError(
                    "NoisyKFAC(sampling='local') samples the pre-activations of each example and needs "
                    f"Linear inputs of shape [batch, features]; layer '{name}' got {tuple(x.shape)}. Its "
                    "positions share one weight draw: use sampling='auto' or sampling='weights'"
                )
            local = True
        if local:
            self._local.add(name)
            return output + self._local_noise(module, x, output, state)
        delta = self._weight_draw(module, output, state)
        self._deltas[name] = delta
        return output + F.linear(x, *delta)

    def _world(self) -> int:
        """R when the ranks share their noise (each takes its slice of one draw for all R·B rows), else 1."""
        if self.owner.rank_noise == "shared" and dist_util.is_distributed():
            return torch.distributed.get_world_size()
        return 1

    def _scale(self) -> float:
        group = self.owner.param_groups[0]
        return group["kl_weight"] / group["data_size"]

    def _local_noise(self, module: nn.Linear, x: Tensor, output: Tensor, state: dict[str, Any]) -> Tensor:
        """√q ⊙ (E B_Sᵀ) with q = (λ/N)‖ā B_A‖², one ε per example and unit."""
        a_root, s_root = state["A_root"][0].to(x.dtype), state["S_root"][0].to(output.dtype)
        cols = module.in_features
        xa = x @ a_root[:cols]  # ā B_A for ā = (x, 1): the bias row is added below
        if a_root.shape[0] > cols:
            xa = xa + a_root[cols]
        q = xa.square().sum(-1, keepdim=True).mul(self._scale())
        world = self._world()
        eps = self._randn((world * output.shape[0], *output.shape[1:]), output)
        if world > 1:  # this rank's rows of the draw for all ranks' examples
            start = dist_util.rank() * output.shape[0]
            eps = eps[start : start + output.shape[0]]
        return q.clamp_min(torch.finfo(q.dtype).tiny).sqrt() * (eps @ s_root.mT)

    def _weight_draw(
        self, module: nn.Linear, output: Tensor, state: dict[str, Any]
    ) -> tuple[Tensor, Tensor | None]:
        """θ − M = √(λ/N) B_S E B_Aᵀ, as (weight part, bias part or None)."""
        a_root, s_root = state["A_root"][0].to(output.dtype), state["S_root"][0].to(output.dtype)
        eps = self._randn((s_root.shape[0], a_root.shape[0]), output)
        delta = (s_root @ eps @ a_root.mT).mul_(self._scale() ** 0.5)
        cols = module.in_features
        return delta[:, :cols], (delta[:, cols] if delta.shape[1] > cols else None)

    def _randn(self, shape: tuple[int, ...] | torch.Size, like: Tensor) -> Tensor:
        generator = self.owner.noise_source.generator(like.device)
        return torch.randn(shape, generator=generator, dtype=like.dtype, device=like.device)


class _Hook:
    """The forward hook of one layer. A copy of the model made inside a sample (deepcopy, pickle) gets an
    inert hook instead: the copy must not sample through this optimizer."""

    def __init__(self, plugin: LocalPreactivations, name: str, carrier: Tensor) -> None:
        self.plugin, self.name, self.carrier = plugin, name, carrier

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict, output: Tensor) -> Tensor:
        return self.plugin.output(self.name, self.carrier, module, args, kwargs, output)

    def __reduce__(self):
        return (_inert_factory, ())


def _inert(*args: Any) -> None:
    return None


def _inert_factory():
    return _inert
