r"""Post-hoc calibration on held-out data: :func:`calibrate` fits what a rule's defaults cannot know.

After training, ``calibrate(model, opt, val_data, task=...)`` chooses

* the **prior precision** λ of the posterior, for the diagonal rules whose precision is the data's part plus λ
  (:data:`PRIOR_KEYS`): Vadam, Vprop, VON, VOGN, BAdam (``prior_prec``), IVON (λ = N·δ, ``weight_decay``)
  and noisy Adam (λ = 1/η, ``prior_var``). λ changes the posterior's variances, not its mean: 1/σ² = P + λ,
  with P the data's part that training left in the state. One λ is fitted for all parameter groups (a
  scalar prior, as laplace-torch's grid search), by minimising the held-out NLL of the Monte-Carlo predictive
  over a log-spaced grid and then a golden-section search on log λ between the grid best's neighbours;
  where the best grid point is an end of the default grid the grid is extended by four decades that way
  (twice at most). VON's and IVON's data part P comes from Hessian estimates that may be negative for some
  weights (only P + λ is kept positive in training), so a λ below −min P leaves no valid posterior: such
  candidates score +∞. The value is written into the rule's own group key, so ``opt.posterior()``,
  :func:`ngvi.predict`, ``state_dict()`` and :func:`ngvi.save_posterior` all use it.
* for **regression**, the noise s.d. σ of the Gaussian likelihood, by the same held-out NLL: at each λ
  the σ that minimises it (a grid and a golden-section search on log σ; no network pass is repeated), so λ
  is chosen on the profile min_σ NLL(λ, σ). σ is returned in the :class:`Calibration`; the helpers that form
  a regression predictive take it: ``ngvi.uncertainty_report(..., noise_std=cal.noise_std)``,
  ``ngvi.metrics.gaussian_log_likelihood(samples, y, cal.noise_prec)``.

The held-out NLL is the one of :mod:`ngvi.metrics` (per point, output dimensions summed): for regression
−(1/N) Σₙ log (1/S) Σₛ N(yₙ | fₛ(xₙ), σ²), for classification −(1/N) Σₙ log (1/S) Σₛ softmax(fₛ(xₙ))[yₙ]
(token-level [N, T, V] logits count the tokens of :func:`ngvi.evaluation.token_rows`). Every candidate λ
is scored with the same ``samples`` standard-normal draws ε, θₛ = μ + σ(λ)⊙εₛ (``posterior().sample`` with a
generator seeded by ``seed``, ``chunk`` draws at a time: the two fix ε), so the objective is a smooth
function of λ and differences between candidates are not Monte-Carlo noise; the optimizer's own noise
stream is not touched.

The K-FAC family (whose prior is damping inside factors inverted during training) and BBVI (whose σ is
learned directly) get a posterior temperature T instead, covariance × T, fitted the same way
(:mod:`ngvi.calibrate_temperature`, issue 44). A fit at an end of the values searched warns.

Refused, with the optimizer left as it was: VadaGrad (no prior), point estimates and ensembles (no posterior
to widen), an empty ``val_data``, a model whose parameters are not the optimizer's, a sample left open, and
an optimizer trained under a posterior prior (``set_prior``: its precision is per weight, not one λ).
``fit_prior=False`` fits only the regression noise and works for every trainer :func:`ngvi.predict` takes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import vmap

from .calibrate_temperature import TEMPERATURE_GRID, TemperatureKey, temperature_key, warn_at_grid_end
from .evaluation import token_rows
from .optim import IVON, VON, BAdam, NoisyAdam, VadaGrad, Vadam, Vprop
from .optim.kronecker import KroneckerFamily
from .predict import OutputSelector, _call, _eval_mode, _param_keys, predict
from .protocol import unwrap
from .report import _batches

__all__ = ["PRIOR_KEYS", "Calibration", "PriorKey", "calibrate", "prior_key"]

TASKS = ("regression", "classification")
#: the default grid of λ: 10⁻⁴ … 10⁴, four points a decade; extended where its best is an end
DEFAULT_GRID = tuple(10.0 ** (k / 4) for k in range(-16, 17))
_EXTEND_DECADES, _MAX_EXTENSIONS = 4, 2
_TOL_LOG_PRIOR = 0.01 * math.log(10)  # golden section stops at a bracket of 1% of a decade in λ
_TOL_LOG_NOISE = 1e-3  # … and of 0.1% in σ
_NOISE_STEPS = tuple(range(-6, 3))  # σ's grid: the moment-matched σ × 2^k


@dataclass(frozen=True)
class PriorKey:
    """Where a rule keeps λ: the group key and the maps between its value and λ (``group`` gives N).

    ``key``: the parameter-group key; ``from_prior(λ, group)``: the value to store for λ;
    ``to_prior(value, group)``: the λ a stored value means.
    """

    key: str
    from_prior: Callable[[float, dict[str, Any]], float]
    to_prior: Callable[[float, dict[str, Any]], float]


#: the rules whose posterior precision is (data part) + λ, read off their ``_precision_core``: Vadam and
#: Vprop N·s + λ, VON and VOGN N(s + λ/N), BAdam N(√v̂ + ε) + λ (``prior_prec``); IVON N(h + δ), λ = Nδ
#: (``weight_decay``); noisy Adam (N/κ)(f + κ/(Nη)) = (N/κ)f + 1/η, λ = 1/η (``prior_var``)
PRIOR_KEYS: tuple[tuple[tuple[type, ...], PriorKey], ...] = (
    ((Vadam, Vprop, VON, BAdam), PriorKey("prior_prec", lambda lam, g: lam, lambda v, g: v)),
    (
        (IVON,),
        PriorKey("weight_decay", lambda lam, g: lam / g["data_size"], lambda v, g: v * g["data_size"]),
    ),
    ((NoisyAdam,), PriorKey("prior_var", lambda lam, g: 1.0 / lam, lambda v, g: 1.0 / v)),
)


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` fitted, on ``points`` held-out points with ``samples`` posterior draws.

    ``task``: ``"regression"`` or ``"classification"``, as given. ``prior_prec``: the λ written into every
    parameter group (as ``key``: ``prior_prec``, IVON's ``weight_decay`` = λ/N or noisy Adam's
    ``prior_var`` = 1/λ); None where the prior was not fitted. ``prior_prec_before``: each group's λ before.
    ``noise_std`` (regression): the fitted noise s.d., or the one given when it was not fitted;
    ``noise_std_before``: the one given (None if none was). ``nll_before``: the held-out NLL at the λ before
    and ``noise_std_before`` (when none was given, at the σ fitted for the λ before); ``nll_after``: at the
    fitted values. ``grid`` and ``grid_nll``: the λ of the grid, in increasing order, and the NLL at each (at
    its own best σ for regression). ``seed``: the seed of the draws. ``temperature``: the posterior
    temperature T fitted for the K-FAC family and BBVI (:mod:`ngvi.calibrate_temperature`; ``grid`` then holds
    the T searched), None where λ was fitted.
    """

    task: str
    prior_prec: float | None
    prior_prec_before: tuple[float, ...]
    noise_std: float | None
    noise_std_before: float | None
    nll_before: float
    nll_after: float
    grid: tuple[float, ...]
    grid_nll: tuple[float, ...]
    key: str | None
    samples: int
    points: int
    seed: int
    temperature: float | None = None  # the K-FAC family's and BBVI's (calibrate_temperature); λ's is None

    def __repr__(self) -> str:
        values = {"prior_prec": self.prior_prec, "temperature": self.temperature, "noise_std": self.noise_std}
        fitted = ", ".join(f"{k}={v:.4g}" for k, v in values.items() if v is not None) or "nothing fitted"
        grid = ""
        if self.grid:
            grid = f", {len(self.grid)} grid values {min(self.grid):.3g}…{max(self.grid):.3g}"
        return (
            f"Calibration({self.task}, {fitted}, held-out NLL {self.nll_before:.4f} → {self.nll_after:.4f} "
            f"on {self.points} points{grid})"
        )

    @property
    def noise_prec(self) -> float | None:
        """1/σ², the ``noise_prec`` of :mod:`ngvi.metrics` and of the curvature's Gaussian likelihood."""
        return None if self.noise_std is None else 1.0 / self.noise_std**2


class _Objective:
    """The held-out NLL of the current posterior: draws with fixed ε, and the best σ for regression."""

    def __init__(self, model, opt, batches, task, samples, seed, vectorize, chunk, output):
        self.model, self.opt, self.batches, self.task = model, opt, batches, task
        self.samples, self.seed, self.vectorize, self.chunk, self.output = (
            samples, seed, vectorize, chunk, output,
        )  # fmt: skip
        self.with_posterior = _has_posterior(opt)
        self.y = (
            torch.cat([y.reshape(y.shape[0], -1).double() for _, y in batches])
            if task == "regression"
            else None
        )

    def outputs(self, posterior: Any, x: Any) -> Tensor:
        """[S, n, ...] outputs under the draws μ + σ⊙εₛ, the same ε for every call (seeded)."""
        if not self.with_posterior:  # noise only, a trainer without a Gaussian posterior: its own draws
            return predict(self.model, self.opt, x, self.samples, output=self.output)
        device = next(iter(posterior.mean)).device
        generator = torch.Generator(device=device).manual_seed(self.seed)
        keys = _param_keys(self.model, self.opt)
        outs = []
        with torch.no_grad(), _eval_mode(self.model):
            for start in range(0, self.samples, self.chunk):
                draws = dict(
                    zip(keys, posterior.sample(min(self.chunk, self.samples - start), generator), strict=True)
                )
                if self.vectorize:
                    outs.append(vmap(lambda theta, x=x: _call(self.model, theta, x, self.output))(draws))
                else:
                    n = next(iter(draws.values())).shape[0]
                    outs += [
                        _call(self.model, {k: d[s] for k, d in draws.items()}, x, self.output)[None]
                        for s in range(n)
                    ]
        return torch.cat(outs)

    def __call__(self, noise_std: float | None) -> tuple[float, float | None]:
        """(NLL, σ) of the current posterior; σ fitted when ``noise_std`` is None (regression)."""
        try:
            posterior = self.opt.posterior() if self.with_posterior else None
        except ValueError:  # a precision ≤ 0: VON's and IVON's data part may be negative (docstring)
            return math.inf, None
        if self.task == "classification":
            total, count = 0.0, 0
            for x, y in self.batches:
                probs = torch.softmax(self.outputs(posterior, x).double(), -1).mean(0)
                if probs.dim() == 3:
                    probs, y = token_rows(probs, y, x)
                elif probs.dim() != 2:
                    raise ValueError(
                        f"a classifier's outputs must be [N, C] or [N, T, V] logits, got {list(probs.shape)}"
                    )
                picked = probs.gather(1, y.long().view(-1, 1).to(probs.device)).squeeze(1)
                total -= float(picked.clamp_min(torch.finfo(torch.float64).tiny).log().sum())
                count += picked.numel()
            return total / count, None
        f = torch.cat([_rows(self.outputs(posterior, x)) for x, _ in self.batches], dim=1)  # [S, N, D]
        assert self.y is not None  # set for task="regression"
        if f.shape[1:] != self.y.shape:
            raise ValueError(
                f"the model's outputs {list(f.shape[1:])} and y {list(self.y.shape)} differ in size"
            )
        y = self.y.to(f.device)
        sq = (y - f).square().sum(-1).T.contiguous()  # [N, S]: each point's sum over S runs along a row
        low = sq.min(-1).values
        residuals = (sq.sub_(low[:, None]), low)
        dims = y.shape[1]
        if noise_std is not None:
            return _mixture_nll(residuals, dims, math.log(noise_std)), noise_std
        # σ's grid is centred on the moment-matched σ² = mean (y − E f)² − mean Var f (floored), the optimum
        # of a Gaussian predictive whose model variance is constant; the mixture's optimum is sought around it
        resid, spread = float((y - f.mean(0)).square().mean()), float(f.var(0, unbiased=False).mean())
        centre = 0.5 * math.log(max(resid - spread, 1e-6 * resid, 1e-24))
        grid = [centre + k * math.log(2.0) for k in _NOISE_STEPS]
        log_sigma, nll = _minimise(lambda v: _mixture_nll(residuals, dims, v), grid, _TOL_LOG_NOISE, extend=8)
        return nll, math.exp(log_sigma)


def _rows(out: Tensor) -> Tensor:
    """[S, n, ...] outputs as [S, n, D] float64 (output dimensions flattened)."""
    return out.reshape(out.shape[0], out.shape[1], -1).double()


def _mixture_nll(residuals: tuple[Tensor, Tensor], dims: int, log_sigma: float) -> float:
    """−(1/N) Σₙ log (1/S) Σₛ N(yₙ | fₛ, σ²I) from the squared residuals rₙₛ = ‖yₙ − fₛ‖², given as
    rₙₛ − minₛ rₙₛ ([N, S]: the largest term of each row is exp(0), so no overflow) and minₛ rₙₛ ([N])."""
    sq, low = residuals
    scale = 0.5 * math.exp(-2 * log_sigma)
    log_sum = sq.mul(-scale).exp_().sum(-1).log_().sub_(low, alpha=scale)
    const = dims * (log_sigma + 0.5 * math.log(2 * math.pi)) + math.log(sq.shape[1])
    return float(const - log_sum.mean())


def _golden(fn: Callable[[float], float], lo: float, hi: float, tol: float) -> tuple[float, float]:
    """min of fn on [lo, hi] by golden-section search, to a bracket narrower than ``tol``: (x, fn(x))."""
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = fn(c), fn(d)
    while b - a > tol:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = fn(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = fn(d)
    return (c, fc) if fc <= fd else (d, fd)


def _minimise(
    fn: Callable[[float], float], grid: Sequence[float], tol: float, extend: int = 0
) -> tuple[float, float]:
    """The best of a sorted, evenly spaced grid, moved on by its spacing while the best is an end (``extend``
    times at most), then refined by golden section between its neighbours: (x, fn(x))."""
    grid = list(grid)
    values = [fn(g) for g in grid]
    for _ in range(extend):
        i = min(range(len(grid)), key=values.__getitem__)
        if 0 < i < len(grid) - 1 or len(grid) < 2:
            break
        step = grid[1] - grid[0]
        more = (
            [grid[-1] + k * step for k in range(1, len(grid))]
            if i
            else [grid[0] - k * step for k in range(len(grid) - 1, 0, -1)]
        )
        grid = [*grid, *more] if i else [*more, *grid]
        values = [*values, *map(fn, more)] if i else [*map(fn, more), *values]
    i = min(range(len(grid)), key=values.__getitem__)
    if len(grid) < 2:
        return grid[i], values[i]
    x, fx = _golden(fn, grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)], tol)
    return (x, fx) if fx < values[i] else (grid[i], values[i])


def _extension(logs: list[float], nll: list[float]) -> list[float]:
    """λ beyond an end of the sorted grid that is its best (by more than 10⁻⁶ nats over its neighbour):
    four decades more that way, at the default grid's spacing; [] where the best is inside."""
    step = 10.0 ** (1 / 4)
    if len(logs) < 2:
        return []
    best = min(range(len(logs)), key=nll.__getitem__)
    if best == 0 and nll[0] < nll[1] - 1e-6:
        return [math.exp(logs[0]) / step**k for k in range(1, 4 * _EXTEND_DECADES + 1)]
    if best == len(logs) - 1 and nll[-1] < nll[-2] - 1e-6:
        return [math.exp(logs[-1]) * step**k for k in range(1, 4 * _EXTEND_DECADES + 1)]
    return []


class _PriorSearch:
    """λ by the held-out NLL: a log-spaced grid (extended at a best end), then golden section on log λ
    between the best grid point's neighbours. Writes each candidate into ``opt`` to score it."""

    def __init__(self, opt: Any, key: PriorKey, objective: _Objective, noise_std: float | None):
        self.opt, self.key, self.objective, self.noise_std = opt, key, objective, noise_std
        self.scores: dict[float, tuple[float, float | None]] = {}  # log λ -> (NLL, σ)
        self.given: dict[float, float] = {}  # log λ -> λ for the grid's values, written as given

    def lam(self, log_lam: float) -> float:
        return self.given.get(log_lam, math.exp(log_lam))

    def write(self, log_lam: float) -> None:
        for g in self.opt.param_groups:
            g[self.key.key] = self.key.from_prior(self.lam(log_lam), g)

    def nll(self, log_lam: float) -> float:
        if log_lam not in self.scores:
            self.write(log_lam)
            self.scores[log_lam] = self.objective(self.noise_std)
        return self.scores[log_lam][0]

    def add(self, lams: Sequence[float]) -> list[float]:
        """Score the feasible ones of ``lams`` not yet scored; their log λ."""
        new = {math.log(lam): lam for lam in _feasible_grid(self.opt, self.key, lams)}
        new = {k: v for k, v in new.items() if k not in self.scores}
        self.given.update(new)
        for log_lam in new:
            self.nll(log_lam)
        return list(new)

    def run(self, grid: Sequence[float], before: tuple[float, ...], extend: bool) -> tuple[Any, ...]:
        """(fitted λ, written into ``opt``; its NLL and σ; the grid's λ, sorted; their NLL)."""
        shared = len(set(before)) == 1 and before[0] > 0  # the λ before is a candidate when groups share it
        logs = self.add([*grid, before[0]] if shared else grid)
        for _ in range(_MAX_EXTENSIONS if extend else 0):
            logs.sort()
            added = self.add(_extension(logs, [self.scores[v][0] for v in logs]))
            if not added:
                break
            logs += added
        logs.sort()
        grid_nll = tuple(self.scores[v][0] for v in logs)
        _minimise(self.nll, logs, _TOL_LOG_PRIOR)
        best = min(self.scores, key=lambda v: self.scores[v][0])  # of all evaluated: grid and refinement
        if not math.isfinite(self.scores[best][0]):
            raise ValueError(
                "calibrate: no λ of the grid gives a posterior with positive, finite variances; pass a grid "
                "of larger values (grid=)"
            )
        self.write(best)
        return self.lam(best), *self.scores[best], tuple(self.lam(v) for v in logs), grid_nll


def prior_key(opt: Any) -> PriorKey:
    """Where ``opt`` keeps λ, or a TypeError that says why λ cannot be fitted for it and what to use."""
    if any("prior_prec" in st for st in getattr(opt, "state", {}).values()):
        raise TypeError(
            f"calibrate: {type(opt).__name__} trains under a posterior prior (set_prior), whose precision is "
            "per weight, not one λ to fit; calibrate(..., fit_prior=False) still fits a regression's noise "
            "scale, or call opt.set_prior(None) first to calibrate a scalar prior"
        )
    for classes, key in PRIOR_KEYS:
        if isinstance(opt, classes):
            return key
    name = type(opt).__name__
    noise_only = "calibrate(..., fit_prior=False) still fits a regression's noise scale"
    if isinstance(opt, VadaGrad):
        why = "VadaGrad has no prior (it minimises E_q[F], App. F), so there is no λ to fit"
        fix = f"use ngvi.Vadam for a posterior under a prior; {noise_only}"
    elif isinstance(opt, KroneckerFamily):
        why = (
            f"{name}'s prior is damping inside its Kronecker (or full) factors, whose roots are formed when "
            "they are inverted during training, so a new prior does not reach the posterior afterwards"
        )
        fix = (
            f"{noise_only}; choose prior_var (prior_prec) and damping on validation data before training, or "
            "use a diagonal rule (ngvi.VOGN, ngvi.IVON, ngvi.Vadam) whose λ calibrate fits after it"
        )
    else:
        why = f"{name} has no posterior precision of the form (data part) + λ"
        fix = noise_only
    raise TypeError(f"calibrate: fitting the prior precision is not supported for {name}: {why}. Fix: {fix}")


def _has_posterior(opt: Any) -> bool:
    try:
        opt.posterior()
    except (NotImplementedError, AttributeError):
        return False
    return True


def _check_pair(model: nn.Module, opt: Any) -> None:
    """The optimizer's trainable parameters must be the model's (the draws are put into its layers)."""
    if getattr(opt, "in_sample", False):
        raise RuntimeError(
            "calibrate: a posterior sample is open (end_sample() or leave sampled_params() first)"
        )
    if not hasattr(opt, "param_groups"):
        return
    try:
        _param_keys(model, opt)
    except ValueError as err:
        raise ValueError(
            f"calibrate: the model and the optimizer do not match ({err}): pass the model whose parameters "
            f"{type(opt).__name__} was built with"
        ) from None


def _feasible_grid(opt: Any, key: PriorKey, grid: Sequence[float]) -> list[float]:
    """The grid below the largest λ every group accepts: an ``init_prec`` given as a number bounds λ
    (q₀ may not be wider than the prior), as the rules' own checks say."""
    caps = [g["init_prec"] for g in opt.param_groups if isinstance(g.get("init_prec"), int | float)]
    cap = min(caps, default=math.inf)
    kept = sorted({float(v) for v in grid if v <= cap})
    return kept if cap == math.inf or cap in kept else [*kept, float(cap)]


def _check_labels(model: nn.Module, batches: list[tuple[Any, Tensor | None]], output: OutputSelector) -> None:
    """Classification labels must be class indices in [0, C) (−100 also, for token-level [N, T] labels:
    not counted), C read off one forward pass of the first batch at the mean weights."""
    with torch.no_grad(), _eval_mode(model):
        classes = _call(model, {}, batches[0][0], output).shape[-1]
    for i, (_, y) in enumerate(batches):
        assert y is not None  # _batches(..., need_labels=True) refused a batch without labels
        if y.is_floating_point() and not bool((y == y.round()).all()):
            raise ValueError(
                "calibrate: val_data's labels must be class indices (whole numbers), got values such as "
                f"{float(y[y != y.round()][0])}; pass the class of each point"
            )
        kept = y[y != -100] if y.dim() > 1 else y  # token-level labels: -100 marks a position not counted
        if kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= classes):
            raise ValueError(
                f"calibrate: val_data's labels must be class indices in [0, {classes}) for the model's "
                f"{classes} outputs, got values in [{int(kept.min())}, {int(kept.max())}] (batch {i})"
            )


def calibrate(
    model: nn.Module,
    opt: Any,
    val_data: Any,
    task: str = "regression",
    *,
    noise_std: float | None = None,
    fit_prior: bool = True,
    fit_noise: bool | None = None,
    grid: Iterable[float] | None = None,
    samples: int = 32,
    seed: int = 0,
    batch_size: int = 1000,
    vectorize: bool = False,
    chunk: int | None = None,
    output: OutputSelector = None,
) -> Calibration:
    """Fit λ (and, for regression, the noise s.d.) on held-out data; write λ into ``opt`` (module docstring).

    Args:
        model: the trained network.
        opt: the ngvi optimizer that trained it (or a wrapper of one); its parameter groups get the fitted λ.
        val_data: held-out data: ``(x, y)`` tensors, a Mapping batch with ``labels``, or an iterable of either
            (a DataLoader).
        task: ``"regression"`` (outputs shaped like y) or ``"classification"`` (logits).
        noise_std: the likelihood's noise s.d. (regression): the value to keep with ``fit_noise=False``, else
            the "before" of the comparison.
        fit_prior: fit λ on the grid (False: only the noise s.d.).
        fit_noise: fit the regression noise s.d. too (default: True for regression).
        grid: the candidate λ (default 10⁻⁴…10⁴, extended at its ends while the best is there).
        samples: posterior draws per evaluation, the same draws for every λ (common random numbers).
        seed: seeds those draws.
        batch_size: points per forward pass when ``val_data`` is one batch.
        vectorize: evaluate ``chunk`` draws in one ``torch.func.vmap`` pass.
        chunk: draws per vectorised pass (default all).
        output: picks the tensor of a non-tensor output (:func:`ngvi.predict`).

    Returns:
        A :class:`Calibration` with the fitted and the previous values and the held-out NLL at each.

    Raises:
        ValueError: an unknown ``task``, nothing to fit, a ``noise_std`` or ``fit_noise`` that does not fit
            the task, bad ``samples``, ``chunk`` or ``grid``, or no held-out points; the message says which.
        TypeError: ``opt`` has no posterior to sample, or its rule keeps λ where it cannot be refitted (the
            message names the fix).
    """
    if task not in TASKS:
        raise ValueError(f"task must be 'regression' or 'classification', got {task!r}")
    fit_noise = task == "regression" if fit_noise is None else fit_noise
    if fit_noise and task != "regression":
        raise ValueError("fit_noise=True is for task='regression' (a Gaussian likelihood's noise scale)")
    if not (fit_prior or fit_noise):
        raise ValueError("nothing to fit: pass fit_prior=True and/or fit_noise=True (regression)")
    if noise_std is not None and task != "regression":
        raise ValueError("noise_std is the Gaussian likelihood's noise s.d.: it is for task='regression'")
    if noise_std is not None and not (isinstance(noise_std, int | float) and noise_std > 0):
        raise ValueError(f"noise_std must be a positive number, got {noise_std!r}")
    if task == "regression" and not fit_noise and noise_std is None:
        raise ValueError(
            "fit_noise=False keeps the noise scale: give it as noise_std= (the likelihood's s.d.)"
        )
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive int, got {samples!r}")
    chunk = samples if chunk is None else chunk
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive int or None, got {chunk!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an int in [0, 2**63) (it seeds the draws), got {seed!r}")
    opt = unwrap(opt)
    temperature = temperature_key(opt) if fit_prior else None  # the K-FAC family's and BBVI's (issue 44)
    key = prior_key(opt) if fit_prior and temperature is None else None
    if fit_prior and not _has_posterior(opt):
        raise TypeError(f"calibrate: {type(opt).__name__} has no posterior() to sample")
    extend = grid is None
    grid = DEFAULT_GRID if grid is None else tuple(float(v) for v in grid)
    if fit_prior and (not grid or not all(math.isfinite(v) and v > 0 for v in grid)):
        raise ValueError(f"grid must hold positive finite values of λ, got {list(grid)}")
    _check_pair(model, opt)
    try:
        batches = _batches(val_data, True, batch_size, "val_data")
    except ValueError as err:
        if "no batch" in str(err):
            raise ValueError("calibrate: val_data holds no batch; it needs held-out (x, y) data") from None
        raise ValueError(f"calibrate: {err}") from None  # a label per input, finite inputs and targets
    points = 0
    for _, y in batches:
        assert y is not None  # _batches(..., need_labels=True) refused a batch without labels
        points += int(y.shape[0])
    if points == 0:
        raise ValueError("calibrate: val_data holds no points; it needs held-out (x, y) data")
    if task == "classification":
        _check_labels(model, batches, output)

    objective = _Objective(model, opt, batches, task, samples, seed, vectorize, chunk, output)
    fixed_noise = None if fit_noise else noise_std
    before_values = [g[key.key] for g in opt.param_groups] if key else []
    before_prior = (
        tuple(key.to_prior(v, g) for v, g in zip(before_values, opt.param_groups, strict=True)) if key else ()
    )
    nll_before, _ = objective(noise_std)
    if not fit_prior:
        nll_after, noise_after = objective(fixed_noise)
        return Calibration(
            task, None, (), noise_after, noise_std, nll_before, nll_after, (), (), None, samples, points, seed
        )

    if temperature is not None:
        searched = None if extend else grid
        return _temperature_calibration(
            opt, objective, task, fixed_noise, searched, nll_before, noise_std, samples, points, seed
        )
    assert key is not None  # fit_prior
    try:
        search = _PriorSearch(opt, key, objective, fixed_noise)
        fitted, nll_after, noise_after, grid_lams, grid_nll = search.run(grid, before_prior, extend)
        for g in opt.param_groups:
            opt._check_group(g)  # the value must pass the rule's own check (a later load_state_dict runs it)
    except BaseException:
        for g, v in zip(opt.param_groups, before_values, strict=True):
            g[key.key] = v
        raise
    warn_at_grid_end(
        "λ", fitted, grid_lams, "treat it as 'flat' or 'no weight noise', not as a prior to reuse"
    )
    return Calibration(
        task=task,
        prior_prec=fitted,
        prior_prec_before=before_prior,
        noise_std=noise_after if task == "regression" else None,
        noise_std_before=noise_std if task == "regression" else None,
        nll_before=nll_before,
        nll_after=nll_after,
        grid=grid_lams,
        grid_nll=grid_nll,
        key=key.key,
        samples=samples,
        points=points,
        seed=seed,
    )


def _temperature_calibration(opt, objective, task, noise, grid, nll_before, noise_std, samples, points, seed):
    """:func:`calibrate` for a family with a temperature (:mod:`ngvi.calibrate_temperature`)."""
    key, fitted, nll_after, noise_after, grid_t, grid_nll = _fit_temperature(opt, objective, noise, grid)
    warn_at_grid_end("temperature T", fitted, grid_t, "the posterior's spread does not help the held-out NLL "
                     "there (T → 0: the mean network) or is far too narrow (T → ∞)")  # fmt: skip
    regression = task == "regression"
    return Calibration(
        task, None, (), noise_after if regression else None, noise_std if regression else None, nll_before,
        nll_after, grid_t, grid_nll, key.key, samples, points, seed, temperature=fitted,
    )  # fmt: skip


def _fit_temperature(
    opt: Any, objective: Any, noise_std: float | None, grid: Sequence[float] | None
) -> tuple[TemperatureKey, float, float, float | None, tuple[float, ...], tuple[float, ...]]:
    """(the key, the fitted T written into ``opt``, its NLL and σ, the grid's T sorted, their NLL), by the
    search :func:`ngvi.calibrate` uses for λ (``objective``: its held-out NLL); ``opt`` unchanged on error."""
    found = temperature_key(opt)
    if found is None:
        raise TypeError(f"calibrate: {type(opt).__name__} has no posterior temperature")
    key = found

    class _Search(_PriorSearch):
        def write(self, log_t: float) -> None:
            key.write(self.lam(log_t))

        def add(self, values: Sequence[float]) -> list[float]:  # every T > 0 is feasible
            new = {math.log(v): float(v) for v in sorted(set(values))}
            new = {k: v for k, v in new.items() if k not in self.scores}
            self.given.update(new)
            for log_t in new:
                self.nll(log_t)
            return list(new)

    search = _Search(opt, PriorKey(key.key, lambda t, g: t, lambda t, g: t), objective, noise_std)
    try:
        fitted, nll, noise, grid_t, grid_nll = search.run(
            TEMPERATURE_GRID if grid is None else grid, (1.0,), extend=grid is None
        )
    except BaseException:
        key.restore()
        raise
    return key, fitted, nll, noise, grid_t, grid_nll
