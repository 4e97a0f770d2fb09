r"""VON: the variational online-Newton method (Khan et al. 2018, eqs. 7–8 and App. D).

.. math::
    \theta &\sim \mathcal N(\mu,\ \sigma^2),\quad \sigma^2 = 1/[N(s + \tilde\lambda)] \\
    s &\leftarrow (1-\beta)\,s + \beta\,\hat h
        + \tfrac12\beta^2\,(\hat h - s)^2/(s + \tilde\lambda) \\
    \mu &\leftarrow \mu - \alpha\,(\hat g + \tilde\lambda\mu)/(s + \tilde\lambda)

Two diagonal Hessian estimators ĥ at the sample θ:

* ``hessian="price"``: the reparameterisation (Price/Stein) estimator of App. D.1, ĥ = ĝ⊙(θ−μ)/σ² = ĝ⊙ε/σ;
* ``hessian="hutchinson"``: ĥ = z⊙(∇²f z) with Rademacher z. The closure must then call
  ``loss.backward(create_graph=True)`` so that a Hessian-vector product can be taken. Each parameter group
  takes its own product z_g⊙(H_gg z_g), also an unbiased estimate of its diagonal.

**Positivity.** Both estimators can be negative, so plain ``(1−β)s + βĥ`` can drive the precision below
zero. We add the Riemannian-gradient correction term ½β²(ĥ−s)²/(s+λ̃) (Lin, Schmidt & Khan 2020, as used by
IVON). Writing P = s + λ̃ and d = ĥ − s, the new precision P + βd + β²d²/(2P) is a quadratic in d with
negative discriminant, so s + λ̃ stays positive for every ĥ — no back-tracking and no coupling across weights
(App. D.1's back-tracking would shrink β for *all* weights whenever one estimate is very negative). The
correction is O(β²), so the fixed point is that of eq. 8.
"""

from __future__ import annotations

from typing import Any

import torch

from .._tensorlist import TensorList
from . import _validation as check
from . import functional as F
from .base import VariationalOptimizer, initial_curvature

HESSIANS = ("price", "hutchinson")


class VON(VariationalOptimizer):
    """Variational online-Newton with a Price or Hutchinson diagonal Hessian. Precision = N(s + λ̃)."""

    elementwise = True

    def __init__(
        self,
        params,
        data_size: int,
        lr: float = 1e-3,
        beta: float = 1e-3,
        prior_prec: float = 1.0,
        init_prec: float | None = None,
        mc_samples: int = 1,
        hessian: str = "price",
        **engine_kwargs: Any,
    ):
        self.hessian = check.choice("hessian", hessian, HESSIANS)
        defaults = dict(data_size=data_size, lr=lr, beta=beta, prior_prec=prior_prec, init_prec=init_prec)
        super().__init__(params, defaults, mc_samples=mc_samples, **engine_kwargs)

    @property
    def needs_noise(self) -> bool:  # the Price estimator reads ε; Hutchinson draws its own z
        return self.hessian == "price"

    @property
    def curvature_reads_sample(self) -> bool:  # Hutchinson's Hessian-vector product runs through θ's graph
        return self.hessian == "hutchinson"

    @property
    def backward_create_graph(self) -> bool:
        return self.hessian == "hutchinson"

    def _extra_getstate(self):
        return {"hessian": self.hessian}

    def _check_group(self, group):
        check.prior_group(group)
        check.unit_interval("beta", group["beta"], closed_high=True)

    def _init_state(self, group, p, state):
        state["hess"] = initial_curvature(group, p)

    def _precision(self, group, states):
        core, lists, hyper = self._precision_core(group, states)
        return TensorList(core(*lists, **hyper))

    def _precision_core(self, group, states):
        """The precision as (core, state lists, hyperparameters), so the engine can run it fused with the
        draw's square root and reciprocal: ``functional.run_core(functional.diagonal_sigma, *lists,
        precision=core, compile=self.compile, **hyper)``."""
        return (
            F.shifted_precision,
            ([st["hess"] for st in states],),
            dict(shift=group["prior_prec"] / group["data_size"], scale=float(group["data_size"])),
        )

    def _curvature(self, group, grads, noise, states):
        if self.hessian == "price":
            return (grads * noise).mul_(self._sampled_sqrt_precision(group, states))  # ĝ⊙ε/σ
        return hutchinson_diagonal(group, self._rademacher)

    def _update(self, group, means, grads, curvs, states):
        F.run_core(
            F.von_update_,
            means,
            grads,
            curvs,
            [st["hess"] for st in states],
            lr=group["lr"],
            beta=group["beta"],
            prior_tilde=group["prior_prec"] / group["data_size"],
            compile=self.compile,
        )

    def _rademacher(self, p: torch.Tensor) -> torch.Tensor:
        """z ∈ {−1, +1} shaped like p, from the optimizer's generator (after the sample's ε)."""
        return torch.empty_like(p).bernoulli_(0.5, generator=self._generator(p.device)).mul_(2).sub_(1)


def hutchinson_diagonal(group: dict, draw_z) -> TensorList:
    """z ⊙ (H z) with Rademacher z = draw_z(p), for the parameters whose ``.grad`` carries a graph."""
    params = [p for p in group["params"] if p.requires_grad and p.grad is not None]
    graphs = [p.grad for p in params]
    if any(g.grad_fn is None for g in graphs):
        raise RuntimeError(
            "hessian='hutchinson' needs a Hessian-vector product: call loss.backward(create_graph=True) "
            "in the closure (or inside sampled_params(train=True))"
        )
    zs = [draw_z(p) for p in params]
    with torch.enable_grad():
        # retain: other parameter groups take their products through the same graph
        hz = torch.autograd.grad(graphs, params, grad_outputs=zs, allow_unused=True, retain_graph=True)
    for p in params:  # the graph is freed once no group's .grad refers to it
        p.grad = p.grad.detach()
    return TensorList(z * (h if h is not None else torch.zeros_like(z)) for z, h in zip(zs, hz, strict=True))
