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
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp, vmap


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
    x: Tensor,
    samples: int = 32,
    *,
    linearized: bool = False,
    vectorize: bool = False,
    chunk: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Outputs of ``model(x)`` under ``samples`` posterior draws: [samples, ...], or [1, ...] for 0.

    ``vectorize=True``: all samples in batched passes (see the module docstring), ``chunk`` samples at a
    time (default: all); ``generator`` seeds those draws."""
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
            return model(x).unsqueeze(0)
        if linearized:
            return _linearized(model, opt, x, samples)
        if vectorize:
            return _vectorized(model, opt, x, samples, chunk or samples, generator)
        if not hasattr(opt, "sampled_params"):
            raise TypeError(
                f"{type(opt).__name__} has no sampled_params(); pass an ngvi optimizer or baseline"
            )
        outs = []
        for _ in range(samples):
            with opt.sampled_params(train=False):
                outs.append(model(x))
        return torch.stack(outs)


def _param_keys(model: nn.Module, opt: Any) -> list[str]:
    """The model's names of the optimizer's trainable parameters, in the optimizer's (= the posterior's)
    order; frozen ones are left out of the posterior and keep their values in ``functional_call``."""
    opt_params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
    names = {id(p): n for n, p in model.named_parameters()}
    missing = [i for i, p in enumerate(opt_params) if id(p) not in names]
    if missing:
        raise ValueError(f"optimizer parameters {missing} are not parameters of the model")
    return [names[id(p)] for p in opt_params]


def _vectorized(
    model: nn.Module, opt: Any, x: Tensor, samples: int, chunk: int, generator: torch.Generator | None
) -> Tensor:
    if getattr(opt, "dropout_masks", False):  # MC dropout: S masks = the input repeated S times
        outs = []
        with opt.sampled_params(train=False):
            for start in range(0, samples, chunk):
                n = min(chunk, samples - start)
                out = model(x.repeat(n, *[1] * (x.dim() - 1)))
                outs.append(out.reshape(n, x.shape[0], *out.shape[1:]))
        return torch.cat(outs)
    try:
        posterior = opt.posterior()
    except NotImplementedError:
        posterior = None
    if posterior is None:
        if not hasattr(opt, "sampled_params"):
            raise TypeError(f"{type(opt).__name__} has neither posterior() nor sampled_params()")
        with opt.sampled_params(train=False):  # a point estimate: every sample is the same network
            out = model(x)
        return out.unsqueeze(0).expand(samples, *out.shape)
    keys = _param_keys(model, opt)
    batched = vmap(lambda theta: functional_call(model, theta, (x,)))
    outs = []
    for start in range(0, samples, chunk):
        draws = posterior.sample(min(chunk, samples - start), generator=generator)
        outs.append(batched(dict(zip(keys, draws, strict=True))))
    return torch.cat(outs)


def _linearized(model: nn.Module, opt: Any, x: Tensor, samples: int) -> Tensor:
    if not hasattr(opt, "posterior"):
        raise TypeError("linearized=True needs an optimizer with posterior()")
    posterior = opt.posterior()
    keys = _param_keys(model, opt)
    mean = dict(zip(keys, posterior.mean, strict=True))

    def f(*theta: Tensor) -> Tensor:
        return functional_call(model, dict(zip(keys, theta, strict=True)), (x,))

    draws = posterior.sample(samples)
    outs = []
    for s in range(samples):
        delta = tuple(d[s] - mean[k] for d, k in zip(draws, keys, strict=True))
        out, jv = jvp(f, tuple(mean[k] for k in keys), delta)
        outs.append(out + jv)
    return torch.stack(outs)
