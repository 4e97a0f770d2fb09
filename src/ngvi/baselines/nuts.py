r"""A Hamiltonian Monte Carlo reference for small torch models: pyro-ppl's No-U-Turn sampler.

The target is the exact posterior of the weights θ (all parameters of ``model``, flattened) under ngvi's
conventions, prior N(0, I/λ) with λ = ``prior_prec``, and a Gaussian likelihood with noise precision τ::

    −log p(θ | X, y) = (τ/2) Σᵢ (yᵢ − f(xᵢ; θ))² + (λ/2) ‖θ‖² + const        (the potential energy U(θ))

(or ``−log_likelihood(f(X; θ), y) + (λ/2)‖θ‖²`` for another likelihood). pyro's NUTS (Hoffman & Gelman 2014)
simulates the Hamiltonian dynamics of U with a diagonal mass matrix and a step size adapted during warm-up
(dual averaging to ``target_accept``); no part of the sampler is ours. Several chains run one after another,
each from its own draw from the prior (over-dispersed starts, so that R-hat can detect chains that have not
mixed), each with its own seeded generator; the global torch RNG is left as it was.

Split R-hat comes from ``pyro.infer.mcmc.util.diagnostics``; the effective sample size from
:func:`effective_sample_size` (Geyer's initial monotone sequence over all chains, which stays in
(0, chains·samples] for short chains, where pyro's estimate can turn negative). For a neural network
the weights themselves are not identified (permuting hidden units or flipping signs leaves f unchanged), so
chains that each found a different permutation have a large weight R-hat while agreeing perfectly on every
prediction: check the diagnostics of the quantity you use, e.g. :meth:`NUTSPosterior.output_diagnostics` on
the predictions.

pyro-ppl is imported inside :func:`nuts_posterior`, so ``import ngvi`` does not need it; it comes with the
``experiments`` extra (``pip install "ngvi[experiments]"``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from .. import _validation as check

__all__ = ["NUTSPosterior", "effective_sample_size", "nuts_posterior", "split_r_hat"]

PYRO_MISSING = 'NUTS needs pyro-ppl, part of the experiments extra: pip install "ngvi[experiments]"'


def _import_pyro() -> Any:
    try:
        import pyro
        import pyro.infer.mcmc.util
    except ModuleNotFoundError as err:
        if (err.name or "").partition(".")[0] in ("pyro", "opt_einsum", "pyroapi"):
            raise ModuleNotFoundError(PYRO_MISSING, name="pyro") from None
        raise
    return pyro


@dataclass
class NUTSPosterior:
    """Draws from the posterior of ``model``'s parameters and how well the chains mixed.

    ``draws`` has shape [chains, samples, D] (D = number of parameters, in ``model.parameters()`` order).
    ``r_hat`` and ``ess`` are per weight (see the module note on identifiability); ``divergences`` (count of
    divergent transitions after warm-up), ``step_size`` (the adapted one) and ``seconds`` are per chain;
    ``settings``: the sampler's settings, for the record."""

    model: nn.Module
    draws: Tensor
    r_hat: Tensor
    ess: Tensor
    divergences: list[int]
    step_size: list[float]
    seconds: list[float]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def chains(self) -> int:
        return self.draws.shape[0]

    @property
    def flat(self) -> Tensor:
        """All draws, chains concatenated: [chains·samples, D]."""
        return self.draws.reshape(-1, self.draws.shape[-1])

    @property
    def mean(self) -> Tensor:
        return self.flat.mean(0)

    @property
    def covariance(self) -> Tensor:
        return torch.cov(self.flat.T).reshape(self.flat.shape[1], self.flat.shape[1])

    @torch.no_grad()
    def predict(self, x: Tensor, thin: int = 1) -> Tensor:
        """f(x; θ) for every ``thin``-th draw of each chain, chains concatenated: [draws, ...] (as
        :func:`ngvi.predict` returns)."""
        names, shapes = _layout(self.model)
        outputs = [
            functional_call(self.model, _unflatten(theta.to(x.dtype), names, shapes), (x,))
            for theta in self.draws[:, ::thin].reshape(-1, self.draws.shape[-1])
        ]
        return torch.stack(outputs)

    @torch.no_grad()
    def output_diagnostics(self, x: Tensor, thin: int = 1) -> dict[str, Tensor]:
        """Split R-hat and ESS of each prediction f(x; θ) over the chains: {"r_hat": [...], "ess": [...]}."""
        pyro = _import_pyro()
        out = self.predict(x, thin)
        out = out.reshape(self.chains, -1, *out.shape[1:])
        r_hat = pyro.infer.mcmc.util.diagnostics({"f": out})["f"]["r_hat"]
        return {"r_hat": r_hat, "ess": effective_sample_size(out)}

    def summary(self) -> dict[str, Any]:
        """A JSON-able record: settings, the worst weight R-hat and ESS, divergences, step sizes, timings."""
        return {
            **self.settings,
            "max_r_hat": float(self.r_hat.max()),
            "min_ess": float(self.ess.min()),
            "median_ess": float(self.ess.median()),
            "divergences": self.divergences,
            "step_size": self.step_size,
            "seconds": self.seconds,
        }


def effective_sample_size(draws: Tensor) -> Tensor:
    r"""The effective sample size of each quantity in ``draws`` ([chains, samples, ...]), over all chains.

    Geyer's initial monotone sequence estimator on the multi-chain autocorrelations
    ρₜ = 1 − (W − ⟨γₜ⟩) / var⁺ (W: the mean within-chain variance, ⟨γₜ⟩: the chains' mean autocovariance at
    lag t, var⁺ = (n−1)/n · W + the variance of the chain means): the sums of pairs Pₖ = ρ₂ₖ + ρ₂ₖ₊₁ are
    kept while positive and made non-increasing, τ = −1 + 2 Σₖ Pₖ, and ESS = chains·samples / τ. τ is taken
    at least 1, so the ESS lies in (0, chains·samples] even for a few draws or antithetic chains (where the
    raw estimate would exceed the number of draws or turn negative). A quantity constant over all draws has
    ESS chains·samples (its mean is known exactly). Needs at least 2 draws per chain.
    """
    if draws.dim() < 2:
        raise ValueError(f"draws must have shape [chains, samples, ...], got {tuple(draws.shape)}")
    chains, n = draws.shape[:2]
    if n < 2 or chains < 1:
        raise ValueError(f"the effective sample size needs at least 2 draws per chain, got {n}")
    x = draws.detach().to(torch.float64).reshape(chains, n, -1)
    centred = x - x.mean(1, keepdim=True)
    spectrum = torch.fft.rfft(centred, n=2 * n, dim=1)  # zero-padded: linear, not circular, correlation
    acov = torch.fft.irfft(spectrum.abs() ** 2, n=2 * n, dim=1)[:, :n] / n  # [chains, lag, quantity]
    within = acov[:, 0].mean(0) * n / (n - 1)
    var_plus = acov[:, 0].mean(0) + (x.mean(1).var(0) if chains > 1 else 0.0)
    constant = var_plus <= 0
    rho = 1 - (within - acov.mean(0)) / torch.where(constant, 1.0, var_plus)
    rho[0] = 1.0
    pairs = rho[: n - n % 2].reshape(n // 2, 2, -1).sum(1)  # P_k = ρ_2k + ρ_2k+1
    initial = torch.cumprod((pairs > 0).to(pairs.dtype), 0)  # 1 up to the first non-positive pair
    monotone = torch.cummin(pairs, 0).values
    tau = (2 * (monotone * initial).sum(0) - 1).clamp(min=1.0)
    ess = torch.where(constant, float(chains * n), chains * n / tau)
    return ess.reshape(draws.shape[2:]).to(draws.dtype if draws.is_floating_point() else torch.float64)


def split_r_hat(draws: Tensor) -> Tensor:
    r"""Split R-hat of each quantity in ``draws`` ([chains, samples, ...]; Gelman et al., BDA3 §11.4).

    Each chain is cut into its first and last ⌊n/2⌋ draws, giving m = 2·chains chains of n' draws; with W
    the mean within-chain variance and B/n' the variance of the m chain means (both unbiased),
    R̂ = √(((n'−1)/n' · W + B/n') / W). It is 1 for chains that agree and grows when they do not. A quantity
    constant over all draws gets 1; half-chains each constant but not all equal get ∞. Needs at least 4
    draws per chain. (The estimator of ``pyro.ops.stats.split_gelman_rubin``, without importing pyro.)
    """
    if draws.dim() < 2 or draws.shape[1] < 4:
        raise ValueError(
            f"split R-hat needs draws of shape [chains, samples ≥ 4, ...], got {tuple(draws.shape)}"
        )
    half = draws.shape[1] // 2
    x = draws.detach().to(torch.float64)
    x = torch.cat([x[:, :half], x[:, -half:]])  # [2·chains, n', ...]
    within = x.var(1).mean(0)
    between = x.mean(1).var(0)  # B/n'
    var_plus = (half - 1) / half * within + between
    flat = torch.where(var_plus > 0, torch.inf, 1.0)  # W = 0: each half-chain constant; do they agree?
    r_hat = torch.where(within > 0, (var_plus / torch.where(within > 0, within, 1.0)).sqrt(), flat)
    return r_hat.to(draws.dtype if draws.is_floating_point() else torch.float64)


def _layout(model: nn.Module) -> tuple[list[str], list[torch.Size]]:
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [n for n, _ in named], [p.shape for _, p in named]


def _unflatten(theta: Tensor, names: list[str], shapes: list[torch.Size]) -> dict[str, Tensor]:
    out, start = {}, 0
    for name, shape in zip(names, shapes, strict=True):
        size = math.prod(shape)
        out[name] = theta[start : start + size].view(shape)
        start += size
    return out


def nuts_posterior(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    prior_prec: float,
    noise_prec: float | None = None,
    log_likelihood: Callable[[Tensor, Tensor], Tensor] | None = None,
    num_samples: int = 500,
    warmup: int = 500,
    chains: int = 4,
    seed: int = 0,
    target_accept: float = 0.8,
    max_tree_depth: int = 10,
    jit_compile: bool = False,
    init_scale: float = 1.0,
    init_params: Tensor | None = None,
    full_mass: bool = False,
) -> NUTSPosterior:
    r"""Sample the posterior of ``model``'s parameters on (x, y) with pyro's NUTS.

    Args:
        model: a small torch module; its current parameter values are not used (chains start at prior
            draws) and are left unchanged.
        x, y: the whole training set (full-batch potential; NUTS needs the exact U(θ)).
        prior_prec: λ of the prior N(0, I/λ) on every parameter.
        noise_prec: τ of the Gaussian likelihood N(y | f(x; θ), 1/τ); or give ``log_likelihood``.
        log_likelihood: ``(output, y) -> summed log-likelihood`` for another likelihood.
        num_samples, warmup, chains: draws kept per chain, warm-up (adaptation) iterations per chain, and
            the number of chains (≥ 2 for R-hat).
        seed: chain c uses seed + c for its start and its sampler.
        target_accept: NUTS's target acceptance probability for step-size adaptation.
        max_tree_depth: at most 2^depth leapfrog steps per draw.
        jit_compile: let pyro trace the potential with the PyTorch JIT.
        init_scale: chains start at init_scale · (a prior draw).
        init_params: [chains, D] starting points instead (e.g. the last draws of an earlier run, to continue
            from them after the data changed by a point); warm-up still adapts the step size and mass.
        full_mass: adapt a dense mass matrix in warm-up (pyro's ``full_mass=True``) instead of a diagonal one.

    Returns:
        A :class:`NUTSPosterior`.
    """
    pyro = _import_pyro()
    from pyro.infer import MCMC, NUTS

    if (noise_prec is None) == (log_likelihood is None):
        raise ValueError("give exactly one of noise_prec (Gaussian likelihood) or log_likelihood")
    lam = check.positive("prior_prec", prior_prec)
    for name, value in (("num_samples", num_samples), ("warmup", warmup), ("chains", chains)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if num_samples < 2:
        raise ValueError(f"num_samples must be at least 2 (the ESS needs 2 draws a chain), got {num_samples}")
    if not isinstance(x, Tensor) or not isinstance(y, Tensor) or x.shape[0] != y.shape[0]:
        raise ValueError("x and y must be tensors with the same number of rows")
    if not (bool(torch.isfinite(x).all()) and bool(torch.isfinite(y).all())):
        raise ValueError("x and y must be finite (no NaN or Inf)")
    if log_likelihood is None:
        tau = check.positive("noise_prec", noise_prec)

        def log_likelihood(output: Tensor, target: Tensor) -> Tensor:
            return -0.5 * tau * ((output - target.reshape(output.shape)) ** 2).sum()

    names, shapes = _layout(model)
    dim = sum(math.prod(s) for s in shapes)
    dtype = next(model.parameters()).dtype
    x, y = x.to(dtype), y.to(dtype)
    if init_params is not None and tuple(init_params.shape) != (chains, dim):
        raise ValueError(
            f"init_params must have shape [chains, D] = [{chains}, {dim}], got {tuple(init_params.shape)}"
        )

    def potential(params: dict[str, Tensor]) -> Tensor:
        theta = params["theta"]
        output = functional_call(model, _unflatten(theta, names, shapes), (x,))
        return 0.5 * lam * (theta**2).sum() - log_likelihood(output, y)

    draws, divergences, steps, seconds = [], [], [], []
    with torch.random.fork_rng(devices=[]):
        for chain in range(chains):
            pyro.set_rng_seed(seed + chain)
            start = init_scale * torch.randn(dim, dtype=dtype) / math.sqrt(lam)
            if init_params is not None:
                start = init_params[chain].detach().to(dtype).clone()
            kernel = NUTS(
                potential_fn=potential,
                target_accept_prob=target_accept,
                max_tree_depth=max_tree_depth,
                jit_compile=jit_compile,
                ignore_jit_warnings=True,
                full_mass=full_mass,
            )
            mcmc = MCMC(
                kernel,
                num_samples=num_samples,
                warmup_steps=warmup,
                initial_params={"theta": start},
                num_chains=1,
                disable_progbar=True,
            )
            began = time.perf_counter()
            mcmc.run()
            seconds.append(time.perf_counter() - began)
            draws.append(mcmc.get_samples()["theta"].detach())
            info = mcmc.diagnostics()
            divergences.append(len(info["divergences"]["chain 0"]))
            steps.append(float(kernel.step_size))
    stacked = torch.stack(draws)  # [chains, samples, D]
    r_hat = pyro.infer.mcmc.util.diagnostics({"theta": stacked})["theta"]["r_hat"]
    settings = {
        "num_samples": num_samples,
        "warmup": warmup,
        "chains": chains,
        "seed": seed,
        "target_accept": target_accept,
        "max_tree_depth": max_tree_depth,
        "jit_compile": jit_compile,
        "full_mass": full_mass,
    }
    return NUTSPosterior(
        model, stacked, r_hat, effective_sample_size(stacked), divergences, steps, seconds, settings
    )
