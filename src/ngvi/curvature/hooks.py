r"""Module hooks that record what per-example curvature needs, from an ordinary forward and backward pass.

:class:`CurvatureHooks` finds the supported layers of any module tree (``nn.Linear`` and ``nn.Conv2d``,
however nested, with functional activations in between) and, while :meth:`~CurvatureHooks.recording`,

* a forward hook on each layer keeps a reference to the layer's input (autograd keeps it anyway for the
  weight gradient) and registers a tensor hook on the layer's output;
* that tensor hook receives :math:`\partial L/\partial s`, the gradient at the layer's output, during the
  backward pass. A tensor hook fires with the gradient of the value the layer produced even when a later
  in-place op (``ReLU(inplace=True)``) changes the tensor.

A layer called several times in one forward pass gets one record per call; the statistics pool them (see
:mod:`ngvi.curvature.statistics`). Calls made under ``torch.no_grad()`` or whose output gets no gradient
are ignored. A second backward pass in one recording (gradient accumulation over micro-batches) is refused
when the statistics are read: pooled as calls of one layer, example i of each micro-batch would be taken for
one example.

**The loss's reduction.** ``loss_reduction="mean"`` (the ngvi convention: the closure returns
:math:`\frac1M\sum_i f_i`) leaves :math:`\frac1M\nabla_s f_i` at a layer output, so the recorded gradient is
scaled by M; ``"sum"`` (:math:`\sum_i f_i`) needs no scaling. M is the size of dim 0 of each layer's input,
which must be the example dim, the same for every hooked layer.

**Two capture modes.** ``"grads"``: the statistics use the gradients of the backward pass the user runs
(the empirical Fisher). ``"sampled"``: that backward pass is ignored; :meth:`~CurvatureHooks.backward_sampled`
backpropagates a given output gradient (from targets sampled from the model's predictive) to the recorded
layer outputs only (no weight gradients are computed), and the statistics use that.

Hooks exist only inside :meth:`~CurvatureHooks.recording`: between optimizer steps the model carries no
hooks at all, so it can be pickled, deep-copied, evaluated or compiled as usual.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from . import statistics
from .layers import KINDS, LayerKind, kind_of

LOSS_REDUCTIONS = ("mean", "sum")
CAPTURE_MODES = ("grads", "sampled")


@dataclass(eq=False)
class HookedLayer:
    """A supported layer and its trainable parameters (weight first; a frozen one is None).

    ``name``: the module's name in the model; ``module``: the layer; ``kind``: its kind (linear, conv2d,
    layernorm, groupnorm: :mod:`ngvi.curvature.layers`); ``weight``, ``bias``: its trainable parameters.
    """

    name: str
    module: nn.Module
    kind: LayerKind
    weight: Tensor | None
    bias: Tensor | None

    @property
    def params(self) -> list[Tensor]:
        return [p for p in (self.weight, self.bias) if p is not None]

    @property
    def point_estimate(self) -> bool:
        """Its parameters are point estimates (batch norm): no posterior noise."""
        return self.kind.point_estimate


@dataclass(eq=False)
class _Record(statistics.Call):
    x_version: int = 0
    pass_index: int = 0  # the backward passes that had reached the hooks when this call ran
    x_node: Any = None  # autograd nodes of the input and the output (NNGBlkTri checks that the layers chain)
    out_node: Any = None
    output: Tensor | None = None  # kept only in "sampled" mode, as an input of the sampled backward pass
    out_version: int = 0


class _ForwardHook:
    """The forward hook of one layer. A copy (deepcopy or pickle of the model inside a recording block) is
    an inert hook: the copied model must not record into these hooks."""

    def __init__(self, owner: CurvatureHooks, index: int):
        self.owner, self.index = owner, index

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        self.owner._on_forward(self.index, module, args, kwargs, output)

    def __reduce__(self):
        return (_inert_hook_factory, ())


def _inert_hook(*args: Any) -> None:
    return None


def _inert_hook_factory():
    return _inert_hook


def find_layers(model: nn.Module) -> list[HookedLayer]:
    """The supported layers with trainable parameters; ValueError naming every other parameterised module.

    Args:
        model: the network.

    Returns:
        A :class:`HookedLayer` for each supported layer with a trainable parameter, in ``named_modules``
        order.

    Raises:
        TypeError: ``model`` is not an nn.Module.
        ValueError: a trainable parameter sits in an unsupported module (all such modules named).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected the model (an nn.Module), got {type(model).__name__}")
    layers, unsupported, owners, shared = [], [], {}, []
    for name, module in model.named_modules():
        direct = [(n, p) for n, p in module.named_parameters(recurse=False) if p.requires_grad]
        if not direct:
            continue
        label = name or "<root>"
        kind = kind_of(module)
        if kind is None or any(n not in ("weight", "bias") for n, _ in direct):
            names = ", ".join(n for n, _ in direct)
            unsupported.append(f"'{label}' (nn.{type(module).__name__}: {names})")
            continue
        for n, p in direct:
            if id(p) in owners:
                shared.append(f"{owners[id(p)]} and {label}.{n}")
            owners[id(p)] = f"{label}.{n}"
        params = dict(direct)
        layers.append(HookedLayer(label, module, kind, params.get("weight"), params.get("bias")))
    if unsupported:
        supported = ", ".join(f"nn.{t.__name__}" for t in KINDS)
        hint = ""
        if any("BatchNorm" in u for u in unsupported):
            hint = (
                " BatchNorm mixes the examples of a batch, so per-example gradients are not defined "
                "through it: use GroupNorm or LayerNorm, or freeze it."
            )
        raise ValueError(
            f"per-example curvature is implemented for {supported} layers (with their standard forward), "
            f"but these modules also have trainable parameters: {'; '.join(unsupported)}. Freeze them "
            "(requires_grad_(False)) or use a diagonal optimizer that needs no hooks (e.g. ngvi.Vadam)."
            + hint
        )
    if shared:
        raise ValueError(
            f"parameters shared between layers are not supported (tied weights): {'; '.join(shared)}"
        )
    if not layers:
        raise ValueError("the model has no trainable nn.Linear or nn.Conv2d parameters")
    return layers


class CurvatureHooks:
    """Records layer inputs and output gradients of a model; computes VOGN and K-FAC statistics from them.

    Args:
        model: any module tree whose trainable parameters all sit in supported layers (nn.Linear, nn.Conv2d,
            nn.LayerNorm, nn.GroupNorm).
        loss_reduction: "mean" if the backpropagated loss is (1/M)Σᵢ fᵢ (default), "sum" if it is Σᵢ fᵢ.
        chunk_bytes: bound on the temporary memory of per-example gradients and unfolded patches of one
            layer (Conv2d, sequences, layers used twice); examples are processed in chunks that fit.

    Usage::

        hooks = CurvatureHooks(model)
        with hooks.recording("grads"):
            loss_fn(model(x), y).backward()
            h = hooks.mean_sq_grads()      # {param: (1/M) Σᵢ (∇fᵢ)²}
    """

    def __init__(self, model: nn.Module, *, loss_reduction: str = "mean", chunk_bytes: int = 64 * 2**20):
        if loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(f"loss_reduction must be one of {LOSS_REDUCTIONS}, got {loss_reduction!r}")
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
        self.model = model
        self.layers = find_layers(model)
        self.batchnorms = [
            (n, m) for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
        ]
        #: parameters of point-estimate layers (batch norm: see ngvi.curvature.layers)
        self.point_params = {p for layer in self.layers if layer.point_estimate for p in layer.params}
        self.batchnorm_warned = False
        self.loss_reduction = loss_reduction
        self.chunk_bytes = chunk_bytes
        self._init_transient()

    def _init_transient(self) -> None:
        self._handles: list[Any] = []
        self._records: dict[int, list[_Record]] = {}
        self._capture: str | None = None
        self._accepting = False  # tensor hooks store gradients only while this is set
        self._stray_backward = False  # a backward pass ran in "sampled" mode before backward_sampled()
        self._passes = 0  # backward passes seen: counted at the first forward call after a gradient arrived
        self._grad_seen = False
        self._repeated = False  # a call's output got a gradient twice (a second backward through one graph)
        self._grad_passes: set[int] = set()  # the passes whose calls got a gradient (check_one_pass)

    @property
    def capture(self) -> str | None:
        """The capture mode of the active ``recording()`` block, None outside one."""
        return self._capture

    # ----------------------------------------------------------------------------------------------------
    # Recording
    # ----------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def recording(self, capture: str = "grads") -> Iterator[CurvatureHooks]:
        """Hook the layers for the block; records are dropped and hooks removed on exit."""
        if capture not in CAPTURE_MODES:
            raise ValueError(f"capture must be one of {CAPTURE_MODES}, got {capture!r}")
        if self._capture is not None:
            raise RuntimeError("CurvatureHooks.recording() blocks cannot be nested")
        training_bn = [n for n, m in self.batchnorms if m.training]
        if training_bn and not self.batchnorm_warned:  # once per model: it holds for every step
            self.batchnorm_warned = True
            warnings.warn(
                f"BatchNorm layers in training mode ({', '.join(training_bn)}) mix the examples of a "
                "batch: the per-example curvature of the layers before them is that of the batch-coupled "
                "loss, an approximation (exact: GroupNorm/LayerNorm, or eval mode)",
                stacklevel=4,
            )
        self._records, self._grad_passes = {}, set()
        self._capture = capture
        self._accepting = capture == "grads"
        self._stray_backward = False
        try:
            for i, layer in enumerate(self.layers):
                hook = _ForwardHook(self, i)
                self._handles.append(layer.module.register_forward_hook(hook, with_kwargs=True))
            yield self
        finally:
            self.remove()
            self._release_records()
            self._init_transient()

    def _release_records(self) -> None:
        """Cut the records' links to the autograd graph. The graph's nodes hold the tensor hooks, which hold
        the records: a record that kept its nodes would tie the graph, the layer inputs and the output
        gradients into a reference cycle that only Python's cyclic collector frees (a CNN's step then
        leaves ~60 MB behind, gigabytes before a collection runs)."""
        for records in self._records.values():
            for record in records:
                record.x_node = record.out_node = record.output = None

    def remove(self) -> None:
        """Remove the hooks from the model (they are also removed when a ``recording()`` block ends)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _on_forward(self, index: int, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if not (torch.is_grad_enabled() and isinstance(output, Tensor) and output.requires_grad):
            return
        x = args[0] if args else kwargs["input"]
        if self._grad_seen:
            self._passes, self._grad_seen = self._passes + 1, False
        record = _Record(
            x.detach(), x_version=x._version, pass_index=self._passes, out_version=output._version
        )
        record.x_node, record.out_node = x.grad_fn, output.grad_fn
        if self._capture == "sampled":
            record.output = output
        output.register_hook(partial(self._on_grad, record))
        self._records.setdefault(index, []).append(record)

    def _on_grad(self, record: _Record, grad: Tensor) -> None:
        if self._accepting:
            self._grad_seen = True
            self._repeated |= record.grad is not None
            self._grad_passes.add(record.pass_index)
            record.grad = grad if record.grad is None else record.grad + grad
        elif self._capture == "sampled":
            self._stray_backward = True

    def backward_sampled(self, output: Tensor, grad_output: Tensor) -> None:
        """Backpropagate ``grad_output`` (∂Σᵢf̃ᵢ/∂output for sampled targets) to the recorded layer outputs.

        The graph is retained, so the real loss can be backpropagated afterwards; weight gradients are not
        computed (except for a layer whose output was later modified in place: there the sampled pass runs
        down to the layer's weight, because the in-place op hides the original output from autograd).
        """
        if self._capture != "sampled":
            raise RuntimeError("backward_sampled() needs an active recording('sampled') block")
        records = [(i, r) for i, recs in self._records.items() for r in recs]
        if any(r.grad is not None for _, r in records):
            self._repeated = True
            self.check_one_pass()
        if self._stray_backward:
            raise RuntimeError(
                "a backward pass already ran through the model in this sample; with curvature='fisher' the "
                "closure must not call backward(): return (loss, output) and the optimizer runs the backward "
                "passes (the sampled-target one for the curvature, then loss.backward() for the gradient)"
            )
        if not records:
            raise RuntimeError(
                "no hooked layer ran with gradients enabled in this sample: compute the output inside the "
                "closure (or the sampled_params(train=True) block), not under torch.no_grad()"
            )
        if not output.requires_grad:
            raise RuntimeError("the output returned with the loss does not require grad")
        inputs, fallback = [], set()
        for i, r in records:
            if r.output._version == r.out_version:
                inputs.append(r.output)
            elif i not in fallback:
                fallback.add(i)
                inputs.append(self.layers[i].params[0])
        self._accepting = True
        try:
            torch.autograd.grad(output, inputs, grad_output, retain_graph=True, allow_unused=True)
        finally:
            self._accepting = False
            for _, r in records:
                r.output = None

    # ----------------------------------------------------------------------------------------------------
    # Statistics
    # ----------------------------------------------------------------------------------------------------
    def check_one_pass(self) -> None:
        """RuntimeError if more than one backward pass reached the hooks in this recording (kept as the
        gradients arrive: every layer's statistics ask, and a scan of the records was O(layers²))."""
        if self._repeated or len(self._grad_passes) > 1:
            raise RuntimeError(
                "two backward passes reached the hooked layers in one posterior sample (gradient "
                "accumulation over micro-batches?); per-example curvature would pool example i of each "
                "micro-batch as one example. Either concatenate the micro-batches into one forward and "
                "backward pass, or run one sampled_params(train=True) block per micro-batch and call "
                "step() after them (the blocks are averaged as MC samples)"
            )

    def _calls(self, index: int) -> list[_Record]:
        self.check_one_pass()
        calls = [r for r in self._records.get(index, []) if r.grad is not None]
        for r in calls:
            if r.x._version != r.x_version:
                raise RuntimeError(
                    f"the input of layer {self.layers[index].name!r} was modified in place after the layer "
                    "used it; per-example curvature needs the original input"
                )
        return calls

    def batch_size(self) -> int:
        """M, the size of dim 0 of every hooked layer input that got a gradient."""
        sizes = {self.layers[i].name: {r.x.shape[0] for r in self._calls(i)} for i in range(len(self.layers))}
        distinct = set().union(*sizes.values())
        if len(distinct) != 1:
            if not distinct:
                raise RuntimeError(
                    "no output gradient reached a hooked layer in this sample: call loss.backward() in the "
                    "closure (curvature='ef') or return (loss, output) (curvature='fisher')"
                )
            seen = ", ".join(f"{n}: {sorted(s)}" for n, s in sizes.items() if s)
            raise RuntimeError(
                "per-example curvature needs the examples along dim 0 of every layer input, with one batch "
                f"size; the hooked layers saw {seen}"
            )
        return distinct.pop()

    def _scale(self, batch: int) -> float:
        """Per-example gradient = scale × recorded gradient."""
        if self._capture == "sampled" or self.loss_reduction == "sum":
            return 1.0
        return float(batch)

    def mean_sq_grads(self) -> dict[Tensor, Tensor]:
        """{parameter: (1/M) Σᵢ (∇fᵢ)²} for the parameters of every layer that got a gradient."""
        scale = self._scale(self.batch_size())
        out: dict[Tensor, Tensor] = {}
        for i, layer in enumerate(self.layers):
            calls = self._calls(i)
            if not calls:
                continue
            w, b = statistics.mean_sq_grads(
                layer.kind,
                layer.module,
                calls,
                scale=scale,
                weight=layer.weight is not None,
                bias=layer.bias is not None,
                chunk_bytes=self.chunk_bytes,
            )
            if w is not None:
                out[layer.weight] = w
            if b is not None:
                out[layer.bias] = b
        return out

    def kfac_factors(self) -> dict[int, tuple[Tensor, Tensor]]:
        """{layer index: (A, S)} for every layer that got a gradient (see :mod:`.statistics`)."""
        scale = self._scale(self.batch_size())
        out = {}
        for i, layer in enumerate(self.layers):
            calls = self._calls(i)
            if calls:
                out[i] = statistics.kfac_factors(
                    layer.kind,
                    layer.module,
                    calls,
                    scale=scale,
                    weight=layer.weight is not None,
                    bias=layer.bias is not None,
                    chunk_bytes=self.chunk_bytes,
                )
        return out

    # ----------------------------------------------------------------------------------------------------
    # Copying
    # ----------------------------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        if self._capture is not None:
            raise RuntimeError("cannot copy or pickle CurvatureHooks while recording")
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_transient()
