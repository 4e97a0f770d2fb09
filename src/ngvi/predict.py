r"""Posterior predictive by Monte Carlo or by linearisation.

``predict(model, opt, x, samples=S)`` returns the model outputs under S posterior samples, stacked as
[S, ...]. ``opt`` is anything with a ``sampled_params()`` context manager: every ngvi optimizer, and the
baselines. ``samples=0`` evaluates the mean weights (returned with a leading dimension of 1).

With ``linearized=True`` the network is linearised around the mean (the GLM / linearised-Laplace
predictive used by BADAM, Foong et al. 2019): f(x; θ) ≈ f(x; μ) + J(x)(θ − μ), evaluated with one
forward-mode Jacobian-vector product per sample.

With ``vectorize=True`` the S samples are not S Python-level passes: for trainers with a ``posterior()``
the draws come stacked from ``posterior().sample(S)`` and one ``torch.func.vmap`` of ``functional_call``
evaluates them all (in chunks of ``chunk`` samples, to bound memory); for MC dropout, whose samples are
dropout masks, the input is repeated S times in one forward pass (each row gets its own mask). The
draws then come from torch's global generator (or ``generator=``), not from the optimizer's own noise, so
the samples differ from the loop's but have the same distribution. Whether it is faster depends on the
device and the batch: on one CPU thread the loop is faster for test batches of hundreds of points (the
Python cost of a pass is small beside the work, and a vmapped convolution becomes a grouped one); the
vectorised form wins there only for MC dropout on a handful of points (``docs/results/vision/sampling.md``).
A deep ensemble (``samples_by_loading``) has no draws to stack: its samples are its members, loaded in turn,
so ``vectorize=True`` runs the loop for it.

Hugging Face models: ``x`` may be a Mapping (a tokenised batch), called as ``model(**x)``; an output that is
not a tensor (a ``ModelOutput``) gives its ``.logits``, or what ``output=`` selects (a key or attribute
name, or a callable of the output). ``opt`` may be wrapped (``trainer.optimizer``): :func:`ngvi.unwrap`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp, vmap

from .protocol import unwrap

#: what ``output=`` takes: None (the tensor itself, or ``.logits``), a key or attribute name, or a callable
OutputSelector = str | Callable[[Any], Tensor] | None

__all__ = ["OutputSelector", "batch_size_of", "forward", "predict", "select_output", "take"]


def select_output(out: Any, output: OutputSelector = None) -> Tensor:
    """The tensor of a model's output that the predictive uses (see the module docstring).

    Args:
        out: what the model returned: a tensor, a Mapping, or an object such as a ``ModelOutput``.
        output: None (``out`` itself if a tensor, else its ``logits``), a key or attribute name, or a
            callable.

    Returns:
        The selected tensor.

    Raises:
        ValueError: ``output`` names a key or attribute ``out`` does not have.
        TypeError: ``output`` is of another type, or what it selects is not a tensor.
    """
    picked: Any
    if callable(output):
        picked = output(out)
    elif isinstance(output, str):
        picked = out[output] if isinstance(out, Mapping) and output in out else getattr(out, output, None)
        if picked is None:
            raise ValueError(f"the model's output ({type(out).__name__}) has no {output!r}")
    elif output is not None:
        raise TypeError(f"output must be None, a key or attribute name, or a callable, got {output!r}")
    elif isinstance(out, Tensor):
        return out
    else:
        picked = out.get("logits") if isinstance(out, Mapping) else getattr(out, "logits", None)
        if picked is None:
            raise TypeError(
                f"the model returned a {type(out).__name__}, not a tensor, and it has no logits: pass "
                "output= (a key or attribute name of it, or a callable that picks the tensor)"
            )
    if not isinstance(picked, Tensor):
        raise TypeError(f"output= selected a {type(picked).__name__}, not a tensor")
    return picked


def forward(model: nn.Module, x: Any, output: OutputSelector = None) -> Tensor:
    """``model(x)``, or ``model(**x)`` for a Mapping batch, reduced to one tensor by ``output``."""
    return select_output(model(**x) if isinstance(x, Mapping) else model(x), output)


def batch_size_of(x: Any) -> int:
    """The number of points of a tensor batch or of a Mapping of [N, ...] tensors (a tokenised batch).

    Args:
        x: a tensor [N, ...] or a Mapping whose tensor values share their first dimension N.

    Returns:
        N.

    Raises:
        ValueError: a Mapping without tensors, or whose tensors disagree on N.
    """
    if isinstance(x, Mapping):
        sizes = {v.shape[0] for v in x.values() if isinstance(v, Tensor) and v.dim() > 0}
        if len(sizes) != 1:
            raise ValueError(f"a Mapping batch needs tensors of one leading size [N, ...], got sizes {sizes}")
        return sizes.pop()
    return x.shape[0]


def take(x: Any, rows: slice) -> Any:
    """Rows of a tensor batch, or of every [N, ...] tensor of a Mapping batch.

    Args:
        x: a tensor [N, ...] or a Mapping batch (values that are not tensors are kept as they are).
        rows: the slice of the first dimension to keep.

    Returns:
        The batch cut to ``rows``, of the same kind as ``x``.
    """
    if isinstance(x, Mapping):
        return {k: v[rows] if isinstance(v, Tensor) and v.dim() > 0 else v for k, v in x.items()}
    return x[rows]


class _eval_mode:
    """Put the model in eval mode for the block and restore each module's own mode afterwards."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.modes = [m.training for m in model.modules()]

    def __enter__(self):
        self.model.eval()

    def __exit__(self, *exc):
        for m, mode in zip(self.model.modules(), self.modes, strict=True):
            m.training = mode


@torch.no_grad()
def predict(
    model: nn.Module,
    opt: Any,
    x: Tensor | Mapping[str, Any],
    samples: int = 32,
    *,
    linearized: bool = False,
    vectorize: bool = False,
    chunk: int | None = None,
    generator: torch.Generator | None = None,
    output: OutputSelector = None,
) -> Tensor:
    """Outputs of ``model(x)`` under ``samples`` posterior draws.

    Args:
        model: the network the optimizer trains (its weights hold μ between steps).
        opt: an ngvi optimizer or baseline with ``sampled_params()`` (or a framework's wrapper of one, see
            :func:`ngvi.unwrap`); a :class:`~ngvi.PosteriorSampler` for a loaded posterior.
        x: the inputs: a tensor, or a Mapping batch, which is called as ``model(**x)``.
        samples: the number of posterior draws S; 0 runs the mean weights once.
        linearized: the GLM / linearised predictive f(μ) + J(θ − μ) (BADAM's), one Jacobian-vector product
            per draw, instead of the network at θ.
        vectorize: all samples in batched ``torch.func.vmap`` passes instead of S Python-level ones (see the
            module docstring).
        chunk: with ``vectorize``, the draws per pass (default: all).
        generator: seeds the draws of ``vectorize=True``.
        output: picks the tensor of a non-tensor output: a key or attribute name, or a callable (default:
            the tensor itself, or ``.logits``).

    Returns:
        The outputs stacked over draws: [samples, ...] ([1, ...] for ``samples=0``).

    Raises:
        ValueError: ``samples`` is not an int ≥ 0, ``chunk`` not a positive int, or ``vectorize`` and
            ``linearized`` are both set.
        TypeError: ``opt`` is not an ngvi optimizer and wraps none; ``linearized=True`` with an optimizer
            without ``posterior()``; an output that is not a tensor and has no logits (pass ``output=``).
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise ValueError(f"samples must be an int >= 0, got {samples!r}")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"chunk must be a positive int or None, got {chunk!r}")
    if vectorize and linearized:
        raise ValueError(
            "vectorize=True draws weights for a forward pass; it does not apply to linearized=True"
        )
    with _eval_mode(model):
        if samples == 0:
            return forward(model, x, output).unsqueeze(0)
        opt = unwrap(opt)
        if linearized:
            return _linearized(model, opt, x, samples, output)
        if vectorize and not getattr(opt, "samples_by_loading", False):  # an ensemble's: the loop below
            return _vectorized(model, opt, x, samples, chunk or samples, generator, output)
        outs = []
        for _ in range(samples):
            with opt.sampled_params(train=False):
                outs.append(forward(model, x, output))
        return torch.stack(outs)


def _param_keys(model: nn.Module, opt: Any) -> list[str]:
    """The model's names of the optimizer's trainable parameters, in the optimizer's (= the posterior's)
    order; frozen ones are left out of the posterior and keep their values in ``functional_call`` (except
    for a trainer whose posterior covers them: a :class:`~ngvi.PosteriorSampler` on a frozen model)."""
    covers_frozen = getattr(opt, "covers_frozen", False)
    opt_params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad or covers_frozen]
    names = {id(p): n for n, p in model.named_parameters()}
    missing = [i for i, p in enumerate(opt_params) if id(p) not in names]
    if missing:
        raise ValueError(f"optimizer parameters {missing} are not parameters of the model")
    return [names[id(p)] for p in opt_params]


def _call(model: nn.Module, params: dict[str, Tensor], x: Any, output: OutputSelector) -> Tensor:
    args, kwargs = ((), dict(x)) if isinstance(x, Mapping) else ((x,), None)
    return select_output(functional_call(model, params, args, kwargs), output)


def _repeat(x: Any, n: int) -> Any:
    if isinstance(x, Mapping):
        return {k: _repeat(v, n) if isinstance(v, Tensor) and v.dim() > 0 else v for k, v in x.items()}
    return x.repeat(n, *[1] * (x.dim() - 1))


def _vectorized(
    model: nn.Module,
    opt: Any,
    x: Any,
    samples: int,
    chunk: int,
    generator: torch.Generator | None,
    output: OutputSelector,
) -> Tensor:
    if getattr(opt, "dropout_masks", False):  # MC dropout: S masks = the input repeated S times
        outs = []
        with opt.sampled_params(train=False):
            for start in range(0, samples, chunk):
                n = min(chunk, samples - start)
                out = forward(model, _repeat(x, n), output)
                outs.append(out.reshape(n, batch_size_of(x), *out.shape[1:]))
        return torch.cat(outs)
    try:
        posterior = opt.posterior()
    except NotImplementedError:
        posterior = None
    if posterior is None:
        if not hasattr(opt, "sampled_params"):
            raise TypeError(f"{type(opt).__name__} has neither posterior() nor sampled_params()")
        with opt.sampled_params(train=False):  # a point estimate: every sample is the same network
            out = forward(model, x, output)
        return out.unsqueeze(0).expand(samples, *out.shape)
    keys = _param_keys(model, opt)
    batched = vmap(lambda theta: _call(model, theta, x, output))
    outs = []
    for start in range(0, samples, chunk):
        draws = posterior.sample(min(chunk, samples - start), generator=generator)
        outs.append(batched(dict(zip(keys, draws, strict=True))))
    return torch.cat(outs)


def _linearized(model: nn.Module, opt: Any, x: Any, samples: int, output: OutputSelector) -> Tensor:
    if not hasattr(opt, "posterior"):
        raise TypeError("linearized=True needs an optimizer with posterior()")
    posterior = opt.posterior()
    keys = _param_keys(model, opt)
    mean = dict(zip(keys, posterior.mean, strict=True))

    def f(*theta: Tensor) -> Tensor:
        return _call(model, dict(zip(keys, theta, strict=True)), x, output)

    draws = posterior.sample(samples)
    outs = []
    for s in range(samples):
        delta = tuple(d[s] - mean[k] for d, k in zip(draws, keys, strict=True))
        out, jv = jvp(f, tuple(mean[k] for k in keys), delta)  # type: ignore[misc]  # has_aux=False: 2
        outs.append(out + jv)
    return torch.stack(outs)
