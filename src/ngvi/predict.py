r"""Posterior predictive by Monte Carlo or by linearisation.

``predict(model, opt, x, samples=S)`` returns the model outputs under S posterior samples, stacked as
[S, ...]. ``opt`` is anything with a ``sampled_params()`` context manager: every ngvi optimizer, and the
baselines. ``samples=0`` evaluates the mean weights (returned with a leading dimension of 1).

With ``linearized=True`` the network is linearised around the mean (the GLM / linearised-Laplace
predictive used by BADAM, Foong et al. 2019): f(x; θ) ≈ f(x; μ) + J(x)(θ − μ), evaluated with one
forward-mode Jacobian-vector product per sample.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp


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
) -> Tensor:
    """Outputs of ``model(x)`` under ``samples`` posterior draws: [samples, ...], or [1, ...] for 0."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise ValueError(f"samples must be an int >= 0, got {samples!r}")
    with _eval_mode(model):
        if samples == 0:
            return model(x).unsqueeze(0)
        if linearized:
            return _linearized(model, opt, x, samples)
        if not hasattr(opt, "sampled_params"):
            raise TypeError(
                f"{type(opt).__name__} has no sampled_params(); pass an ngvi optimizer or baseline"
            )
        outs = []
        for _ in range(samples):
            with opt.sampled_params(train=False):
                outs.append(model(x))
        return torch.stack(outs)


def _linearized(model: nn.Module, opt: Any, x: Tensor, samples: int) -> Tensor:
    if not hasattr(opt, "posterior"):
        raise TypeError("linearized=True needs an optimizer with posterior()")
    posterior = opt.posterior()
    opt_params = [p for g in opt.param_groups for p in g["params"]]
    names = {id(p): n for n, p in model.named_parameters()}
    missing = [i for i, p in enumerate(opt_params) if id(p) not in names]
    if missing:
        raise ValueError(f"optimizer parameters {missing} are not parameters of the model")
    keys = [names[id(p)] for p in opt_params]
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
