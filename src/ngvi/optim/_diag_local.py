r"""The local reparameterisation for a diagonal posterior: sample each example's Linear pre-activations.

For an nn.Linear layer under a mean-field posterior, W_{jk} ~ N(M_{jk}, σ²_{jk}), b_j ~ N(m_j, σ²_{b,j}),
example i's pre-activations are independent Gaussians (Kingma et al. 2015):

.. math::
    s_{ij} = (M a_i + m)_j + \sqrt{\textstyle\sum_k a_{ik}^2\sigma^2_{jk} + \sigma^2_{b,j}}\;\varepsilon_{ij},

so a training sample can draw them, one ε per example and unit, instead of one weight matrix for the whole
minibatch (:func:`sample_preactivations`): the same expected gradient with a lower variance, and MC samples
can then be drawn as copies of the minibatch in one forward pass (every row gets its own noise) — for
estimators that average over examples (the gradient, VOGN's per-example squares), not for a square of the
minibatch gradient (Vadam's and noisy Adam's ĝ²: the square of a mean over copies is not the mean of
squares over samples). σ² is the rule's own 1/precision. This is what BBVI does with its log σ
(:mod:`ngvi.baselines._local_reparam`), for the natural-gradient rules with a diagonal posterior (VOGN,
noisy Adam, Vadam, …), whose curvature is then taken at the per-example draws. Prediction still draws
whole weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = ["sample_preactivations"]


class DiagonalPreactivations:
    """The sample-scope plugin: forward hooks on the chosen nn.Linear layers of a diagonal optimizer."""

    def __init__(self, owner: Any, layers: list[tuple[str, nn.Linear]]) -> None:
        self.owner = owner
        self.layers = layers
        self.params = {p for _, m in layers for p in (m.weight, m.bias) if p is not None and p.requires_grad}
        self._called: set[str] = set()

    @contextlib.contextmanager
    def scope(self, *, train: bool) -> Iterator[None]:
        if not (train and self.layers):
            yield
            return
        handles = []
        try:
            for name, module in self.layers:
                handles.append(module.register_forward_hook(_Hook(self, name), with_kwargs=True))
            yield
        finally:
            for handle in handles:
                handle.remove()
            self._called.clear()

    def _variance(self, p: Tensor | None) -> Tensor | None:
        if p is None or p not in self.params:
            return None
        group = next(g for g in self.owner.param_groups if any(q is p for q in g["params"]))
        return self.owner._precision(group, [self.owner.state_of(group, p)])[0].reciprocal()

    def output(self, name: str, module: nn.Linear, args: tuple, kwargs: dict, output: Tensor) -> Tensor:
        """The layer's output at the mean plus √(x²σ²_Wᵀ + σ²_b) ⊙ ε."""
        x = args[0] if args else kwargs["input"]
        owner = type(self.owner).__name__
        if x.dim() != 2:
            raise RuntimeError(
                f"{owner} with per-example pre-activation sampling needs Linear inputs of shape [batch, "
                f"features]; layer '{name}' got {tuple(x.shape)} (its positions share one weight draw)"
            )
        if name in self._called:
            raise RuntimeError(
                f"{owner} with per-example pre-activation sampling: layer '{name}' was called twice in one "
                "forward pass, and both calls must see one weight draw; do not enable it for this model"
            )
        self._called.add(name)
        var_w, var_b = self._variance(module.weight), self._variance(module.bias)
        var = F.linear(x.square(), var_w.to(x.dtype)) if var_w is not None else torch.zeros_like(output)
        if var_b is not None:
            var = var + var_b.to(var.dtype)
        generator = self.owner.noise_source.generator(output.device)
        eps = torch.randn(output.shape, generator=generator, dtype=output.dtype, device=output.device)
        return output + var.clamp_min(torch.finfo(var.dtype).tiny).sqrt() * eps


class _Hook:
    """A layer's forward hook; copies of the model made inside a sample get an inert one."""

    def __init__(self, plugin: DiagonalPreactivations, name: str) -> None:
        self.plugin, self.name = plugin, name

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict, output: Tensor) -> Tensor:
        return self.plugin.output(self.name, module, args, kwargs, output)

    def __reduce__(self):
        return (_inert_factory, ())


def _inert(*args: Any) -> None:
    return None


def _inert_factory():
    return _inert


def sample_preactivations(opt: Any, model: nn.Module) -> Any:
    """Make ``opt`` (an ngvi optimizer with an element-wise diagonal posterior) sample the pre-activations of
    ``model``'s nn.Linear layers per example in its training samples, instead of their weights. Returns
    ``opt``. The layers must be called once per forward pass on [batch, features] inputs."""
    from .engine.optimizer import VariationalOptimizer

    if (
        not isinstance(opt, VariationalOptimizer)
        or type(opt).posterior is not VariationalOptimizer.posterior  # a diagonal posterior
        or type(opt).unsampled is not VariationalOptimizer.unsampled  # no local trick of its own (BBVI)
    ):
        raise ValueError(
            f"sample_preactivations needs an ngvi optimizer with a diagonal posterior (Vadam, NoisyAdam, "
            f"VOGN, ...), got {type(opt).__name__}; NoisyKFAC has sampling='local' instead"
        )
    if opt.needs_noise:
        raise ValueError(
            f"{type(opt).__name__}'s curvature estimator ({opt.curvature}) reads the weight noise ε, which "
            "per-example pre-activation sampling does not draw"
        )
    owned = {p for g in opt.param_groups for p in g["params"]}
    layers = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and m.weight in owned and m.weight.requires_grad
    ]
    plugin = DiagonalPreactivations(opt, layers)
    opt.plugins = (*opt.plugins, plugin)
    opt._diagonal_perturb = False  # the engine's generic draw, which leaves these layers' weights at μ
    opt._local_params = frozenset(plugin.params)
    return opt
