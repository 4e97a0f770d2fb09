r"""VIME's dynamics model and its information gain, with a BBB or an NNG-MVG posterior.

A network s′ ≈ f(s, a; θ) with a Gaussian likelihood N(s′; f, σ_y² I) on standardised inputs and targets
(the replay pool's statistics, as Houthooft et al. 2016 do) is fitted to the replay pool after every TRPO
iteration. The intrinsic reward of a transition is the information gain KL(q′ ‖ q) of NNG eq. (14), q′ the
posterior after one update on that transition alone (Houthooft et al. 2016, eq. 3 and §2.5):

* **BBB** (:class:`BBBDynamics`, mean-field q trained by :class:`ngvi.BBVI`): the authors' second-order
  approximation (Houthooft et al. 2016, eqs. 15–17, recalled): one Newton step on ℓ(φ) = KL(q_φ ‖ q) +
  E_{q_φ}[−log p(s′ | s, a; θ)], whose KL part has at φ = φ_old the diagonal Hessian H, gives
  KL(q′ ‖ q) ≈ ½ λ² ∇ᵀ H⁻¹ ∇, ∇ the gradient of the expected NLL of the transition. In BBVI's
  parameters φ = (μ, ρ = log σ), H = diag(1/σ², 2) (the authors' softplus parameterisation gives other
  entries; the approximation is the same). ∇ is estimated with ``mc_samples`` draws of θ.
* **NNG-MVG** (:class:`KFACDynamics`, :class:`ngvi.NoisyKFAC`): the exact KL between the matrix-variate
  Gaussians before and after one noisy K-FAC step on the transition (the factor update, eq. 12, the damped
  inverses, eq. 13, and the natural-gradient step on the mean), taken at the posterior mean. The optimizer
  inverts at every step and has no momentum, so its q is always the one its factors define and one step
  depends on the transition only; the step for a batch of transitions is computed for all of them at once,
  each against the same q (:meth:`KFACDynamics.information_gain`; tests/experiments/test_vime.py checks it
  against the optimizer's own step).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

import ngvi
from ngvi.baselines import BBVI

LIKELIHOOD_SD = 0.1  # σ_y on standardised next states
PRIOR_VAR = 0.25  # the authors' prior_sd = 0.5


def dynamics_net(n_in: int, n_out: int, hidden: int, seed: int) -> nn.Sequential:
    """One hidden ReLU layer (the authors' ``unn_n_hidden=[32]``)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))


def nll(out: Tensor, target: Tensor) -> Tensor:
    """Per-example −log N(target; out, σ_y² I) up to a constant."""
    return 0.5 * (out - target).square().sum(-1) / LIKELIHOOD_SD**2


class ReplayPool:
    """The last ``capacity`` transitions (s, a, s′) and their standardisation."""

    def __init__(self, obs_dim: int, act_dim: int, capacity: int = 100_000):
        self.data = np.zeros((capacity, 2 * obs_dim + act_dim), dtype=np.float32)
        self.obs_dim, self.capacity, self.size, self.top = obs_dim, capacity, 0, 0

    def add(self, obs: np.ndarray, act: np.ndarray, next_obs: np.ndarray) -> None:
        rows = np.concatenate([obs, act, next_obs], axis=1)
        for row in rows:
            self.data[self.top] = row
            self.top = (self.top + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std of (s, a) over the pool; s′ is standardised with the statistics of s."""
        inputs = self.data[: self.size, : -self.obs_dim]
        return inputs.mean(0), inputs.std(0) + 1e-8

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return self.data[rng.integers(0, self.size, n)]


class Dynamics:
    """Shared by both arms: the pool, the standardisation, fitting; ``information_gain`` per arm."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, seed: int):
        self.obs_dim = obs_dim
        self.model = dynamics_net(obs_dim + act_dim, obs_dim, hidden, seed)
        self.pool = ReplayPool(obs_dim, act_dim)
        self.rng = np.random.default_rng(seed)
        self.mean = np.zeros(obs_dim + act_dim, dtype=np.float32)
        self.std = np.ones(obs_dim + act_dim, dtype=np.float32)
        self.optimizer: ngvi.VariationalOptimizer

    def standardise(self, rows: np.ndarray) -> tuple[Tensor, Tensor]:
        d = self.obs_dim
        x = (rows[:, :-d] - self.mean) / self.std
        y = (rows[:, -d:] - self.mean[:d]) / self.std[:d]
        return torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)

    def fit(self, updates: int, batch: int) -> float:
        """``updates`` steps on minibatches of the pool; returns the mean NLL of the last 10% of them."""
        self.mean, self.std = self.pool.stats()
        for group in self.optimizer.param_groups:
            group["data_size"] = self.pool.size
        losses = []
        for _ in range(updates):
            x, y = self.standardise(self.pool.sample(batch, self.rng))

            def closure(x=x, y=y):
                self.optimizer.zero_grad()
                loss = nll(self.model(x), y).mean()
                loss.backward()
                return loss

            losses.append(float(self.optimizer.step(closure)))
        return float(np.mean(losses[-max(1, updates // 10) :]))

    def information_gain(self, rows: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class BBBDynamics(Dynamics):
    """Mean-field q by BBVI; the information gain by Houthooft et al.'s second-order step."""

    def __init__(self, obs_dim, act_dim, hidden, seed, *, lr=3e-3, mc_samples=10, step_size=0.01):
        super().__init__(obs_dim, act_dim, hidden, seed)
        self.optimizer = BBVI(self.model, 1, lr=lr, prior_prec=1 / PRIOR_VAR, seed=seed)
        self.mc_samples, self.step_size = mc_samples, step_size
        self.generator = torch.Generator().manual_seed(seed + 7)

    @torch.no_grad()
    def information_gain(self, rows: np.ndarray) -> np.ndarray:
        x, y = self.standardise(rows)
        q = self.optimizer.posterior()
        names = [n for n, _ in self.model.named_parameters()]
        mu = dict(zip(names, q.mean, strict=True))
        std = dict(zip(names, q.std, strict=True))

        def loss(theta, xi, yi):
            return nll(functional_call(self.model, theta, (xi[None],)), yi[None])[0]

        per_example = vmap(grad(loss), in_dims=(None, 0, 0))
        g_mu = {n: torch.zeros(len(x), *m.shape) for n, m in mu.items()}
        g_rho = {n: torch.zeros(len(x), *m.shape) for n, m in mu.items()}
        for _ in range(self.mc_samples):  # ∇_μ E[f] = E[ĝ], ∇_ρ E[f] = E[ĝ ε σ] (θ = μ + σ ε)
            eps = {n: torch.randn(m.shape, generator=self.generator) for n, m in mu.items()}
            g = per_example({n: mu[n] + std[n] * eps[n] for n in names}, x, y)
            for n in names:
                g_mu[n] += g[n] / self.mc_samples
                g_rho[n] += g[n] * eps[n] * std[n] / self.mc_samples
        kls = [
            second_order_kl(std[n], g_mu[n].flatten(1), g_rho[n].flatten(1), self.step_size) for n in names
        ]
        return sum(kls).double().numpy()


def second_order_kl(std: Tensor, g_mu: Tensor, g_rho: Tensor, step_size: float) -> Tensor:
    """½ λ² ∇ᵀ H⁻¹ ∇ with H = diag(1/σ², 2), the Hessian of KL(N(μ′, e^{2ρ′}) ‖ N(μ, σ²)) in (μ′, ρ′) at
    (μ, log σ): KL(q′ ‖ q) to second order after q′ = q moved by −λ H⁻¹ ∇ (Houthooft et al. 2016, eq. 17,
    recalled). ``g_mu``, ``g_rho``: [B, n] gradients per transition; ``std``: σ of the n weights."""
    quad = (std.reshape(1, -1).square() * g_mu.square() + 0.5 * g_rho.square()).sum(1)
    return 0.5 * step_size**2 * quad


class KFACDynamics(Dynamics):
    """Matrix-variate q by noisy K-FAC; the information gain is the exact KL after its own step."""

    def __init__(self, obs_dim, act_dim, hidden, seed, *, lr=0.05, beta=0.01, sampling="auto"):
        super().__init__(obs_dim, act_dim, hidden, seed)
        self.optimizer = ngvi.NoisyKFAC(
            self.model, 1, lr=lr, beta=beta, momentum=0.0, prior_var=PRIOR_VAR, inv_every=1, seed=seed,
            sampling=sampling, kl_clip=None,  # the uncapped step: information_gain's KL is after exactly it
        )  # fmt: skip
        self.layers = [m for m in self.model if isinstance(m, nn.Linear)]

    @torch.no_grad()
    def information_gain(self, rows: np.ndarray) -> np.ndarray:
        x, y = self.standardise(rows)
        inputs, grads = _inputs_and_preactivation_grads(self.model, self.layers, x, y)
        opt = self.optimizer
        group = opt.param_groups[0]
        lr, beta, gamma_in = group["lr"], group["beta"], opt.intrinsic_damping(group)
        scale = group["kl_weight"] / group["data_size"]
        total = torch.zeros(len(x), dtype=torch.float64)
        for layer, a_bar, delta in zip(self.layers, inputs, grads, strict=True):
            st = opt.state[layer.weight]
            mean = torch.cat([layer.weight, layer.bias[:, None]], 1)  # bias as the last column
            a_new = (1 - beta) * st["factor_A"] + beta * a_bar[:, :, None] * a_bar[
                :, None
            ]  # (12), batch of 1
            s_new = (1 - beta) * st["factor_S"] + beta * delta[:, :, None] * delta[:, None]
            inv = opt._inverses(group, a_new, s_new)  # (13): the transitions take the place of groups
            g = delta[:, :, None] * a_bar[:, None]  # ∂f/∂W per transition
            step = inv["S_inv"] @ (g + gamma_in * mean) @ inv["A_inv"]
            total += mvg_kl(
                mean - lr * step, _cov(inv["S_root"]), scale * _cov(inv["A_root"]),
                mean, _cov(st["S_root"]), scale * _cov(st["A_root"]),
            )  # fmt: skip
        return total.numpy()


def _cov(root: Tensor) -> Tensor:
    root = root.double()
    return root @ root.mT


def _inputs_and_preactivation_grads(model, layers, x, y) -> tuple[list[Tensor], list[Tensor]]:
    """Per example, each Linear layer's input with a 1 appended, and ∂f/∂(pre-activation), at μ."""
    inputs, outputs = [], []

    def keep(module, args, output):
        inputs.append(args[0].detach())
        outputs.append(output)

    hooks = [layer.register_forward_hook(keep) for layer in layers]
    try:
        with torch.enable_grad():
            loss = nll(model(x), y).sum()  # examples are independent: the sum's gradient is per example
            grads = torch.autograd.grad(loss, outputs)
    finally:
        for h in hooks:
            h.remove()
    ones = torch.ones(len(x), 1)
    return [torch.cat([i, ones], 1) for i in inputs], [g.detach() for g in grads]


def mvg_kl(m1: Tensor, u1: Tensor, v1: Tensor, m2: Tensor, u2: Tensor, v2: Tensor) -> Tensor:
    r"""KL(MN(m1, u1, v1) ‖ MN(m2, u2, v2)) for vec(W) ~ N(vec(M), U ⊗ V) (rows ↔ U, columns ↔ V), batched
    over leading dimensions:

    .. math:: ½[\operatorname{tr}(U_2^{-1}U_1)\operatorname{tr}(V_2^{-1}V_1)
        + \operatorname{tr}(U_2^{-1} D V_2^{-1} D^\top) − rc + c\log\frac{|U_2|}{|U_1|}
        + r\log\frac{|V_2|}{|V_1|}],\quad D = M_1 − M_2.
    """
    m1, u1, v1, m2, u2, v2 = (t.double() for t in (m1, u1, v1, m2, u2, v2))
    r, c = m1.shape[-2:]
    lu2, lv2 = torch.linalg.cholesky(u2), torch.linalg.cholesky(v2)
    tr_u = torch.cholesky_solve(u1, lu2).diagonal(dim1=-2, dim2=-1).sum(-1)
    tr_v = torch.cholesky_solve(v1, lv2).diagonal(dim1=-2, dim2=-1).sum(-1)
    d = m1 - m2
    maha = (torch.cholesky_solve(d, lu2) * torch.cholesky_solve(d.mT, lv2).mT).sum((-2, -1))
    logdet = lambda a: 2 * torch.linalg.cholesky(a).diagonal(dim1=-2, dim2=-1).log().sum(-1)  # noqa: E731
    log_u = logdet(u2) - logdet(u1)
    log_v = logdet(v2) - logdet(v1)
    return 0.5 * (tr_u * tr_v + maha - r * c + c * log_u + r * log_v)


def normalised(kl: np.ndarray, history: list[float], length: int = 10) -> np.ndarray:
    """KL divided by the mean of the medians of the last ``length`` batches, this one included (the
    authors' ``use_kl_ratio_q``; Houthooft et al. 2016, §2.5: "divide by the median of previous KLs")."""
    history.append(float(np.median(kl)))
    del history[:-length]
    scale = float(np.mean(history))
    return kl / scale if scale > 0 and math.isfinite(scale) else np.zeros_like(kl)
