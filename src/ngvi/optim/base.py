r"""The weight-perturbation engine shared by every ngvi optimizer.

Each algorithm is a small subclass that says four things, in the notation of DESIGN.md:

* ``_init_state``  — its state at t=0 (e.g. s₀ = (init_prec − λ)/N);
* ``_precision``   — the posterior precision, so that q = N(μ, 1/precision);
* ``_curvature``   — the per-sample curvature estimate ĥ (ĝ², the Price estimator ĝ⊙ε/σ, ...);
* ``_update``      — the update of μ and the state from the MC means of ĝ and ĥ.

The engine does the rest once: drawing θ = μ + σ⊙ε from its own seeded generator, calling the closure
``mc_samples`` times, averaging, restoring μ (also when the closure raises), skipping parameters without a
gradient, refusing non-finite gradients without touching any state, and saving everything needed for a
bit-identical resume in ``state_dict``.

**Noise.** Each sample draws ε ~ N(0, I) parameter by parameter, in group order, with
``tensor.normal_(generator=g)`` from ``g = torch.Generator().manual_seed(seed)`` (one generator per device).
Opt-in alternatives (``noise=``, ``noise_dtype=``) trade this exact stream for speed; see
:class:`VariationalOptimizer`.

**Distributed** (:mod:`ngvi.distributed`). Under ``torchrun`` the seed is rank 0's. With the default
``rank_noise="shared"`` all ranks draw the same ε and DDP averages ĝ, so R ranks × batch B step exactly as one
process with batch R·B; curvature a rule computes from local data (``local_statistics = ("curv",)``: VOGN's
per-example squares, K-FAC factors) is averaged over ranks by :meth:`VariationalOptimizer._reduce_statistics`
before ``_update``. With ``rank_noise="independent"`` each rank's ε is one more MC sample; the model is not
wrapped in DDP and ĝ and ĥ are averaged here. The finiteness verdict is agreed by all ranks.

**Cost per step** (the hot path, for rules that keep the default diagonal ``_perturb``): μ is saved with one
multi-tensor copy; the precision is computed once per sample (its square root is reused by rules whose
curvature reads ε, see :meth:`VariationalOptimizer._sampled_sqrt_precision`); ε is drawn straight into the
parameter and θ = μ + σ⊙ε is formed in place, so no noise buffer is kept unless the rule needs ε; μ's copy
is freed on restore, before ĥ and the update; ``elementwise`` rules run ``_precision`` and ``_update`` on
slices of the parameters, so no temporary holds a full copy; the finiteness check is one fused 2-norm and
one host sync. All of this is bitwise the plain computation. On CPU, drawing ε dominates what remains.

Two ways to drive it::

    loss = opt.step(closure)                # closure: zero_grad, mean NLL, backward, return loss

    for _ in range(k):                      # manual form: k posterior samples, then one update
        with opt.sampled_params(train=True):
            opt.zero_grad(); loss_fn(model(x), y).backward()
    opt.step()
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from .. import distributed as dist_util
from .._tensorlist import TensorList
from ..posterior import DiagonalGaussian
from . import _validation as check

__all__ = ["NOISES", "NonFiniteGradientError", "VariationalOptimizer", "initial_curvature"]

NOISES = ("normal", "antithetic")


def initial_curvature(group: dict[str, Any], p: Tensor) -> Tensor:
    """s₀ = (init_prec − λ)/N, shaped like p, so that q₀ has precision N(s₀ + λ/N) = init_prec;
    zero for ``init_prec=None`` (q₀ is the prior)."""
    init, prior, n = group["init_prec"], group["prior_prec"], group["data_size"]
    return torch.full_like(p, 0.0 if init is None else (init - prior) / n)


class NonFiniteGradientError(FloatingPointError):
    """A step saw a NaN or Inf gradient, curvature or loss; parameters and optimizer state are unchanged."""


class VariationalOptimizer(Optimizer):
    """Base class: a Gaussian posterior over the parameters, trained by weight perturbation.

    Args:
        params: parameters or parameter groups, as for any ``torch.optim.Optimizer``.
        defaults: per-group hyperparameters (validated by the subclass's ``_check_group``).
        mc_samples: posterior samples per ``step(closure)``; gradients and curvature are averaged.
        seed: seed of the optimizer's own noise generator. ``None`` draws one from torch's global RNG, so
            ``torch.manual_seed`` makes a run reproducible.
        skip_nonfinite: if True, a step with a non-finite gradient is skipped (and counted in
            ``skipped_steps``) instead of raising :class:`NonFiniteGradientError`.
        noise: ``"normal"`` (default): a fresh ε for every sample. ``"antithetic"``: samples come in pairs
            (ε, −ε); the second of a pair draws nothing, halving the cost of the noise. Pairs run across
            steps when ``mc_samples`` is odd (step 2k uses ε, step 2k+1 uses −ε). Each θ is still an exact
            draw from q, but the two of a pair are perfectly anti-correlated: the pair's mean gradient
            cancels the first-order noise term (lower variance), while a single step is no longer
            independent of the previous one. Costs one persistent noise buffer (one copy of the parameters).
        noise_dtype: dtype in which ε is drawn (``None``: the parameter's). ``torch.float32`` for float64
            parameters draws ~4× faster on CPU; ε then has float32 resolution (tails cut at |ε| ≈ 5.8
            instead of ≈ 8.6, a probability of ~1e-8).
        rank_noise: ``"shared"`` (default) or ``"independent"`` noise across ``torch.distributed`` ranks;
            see :mod:`ngvi.distributed`. Ignored in a single process.
        compile: run the rule's update core through ``torch.compile`` (same maths; agrees with the eager
            update to float tolerance, not bitwise).
    """

    #: the rule's ``_curvature`` reads the standard-normal draw ε of each sample
    needs_noise: bool = False
    #: False for rules that take their gradient at the mean (BAdam); sampling is then only for prediction
    perturbs_in_step: bool = True
    #: statistics the rule computes from its rank's own data, averaged over ranks before ``_update`` under
    #: ``torch.distributed``: "curv" for curvature from per-example terms or layer activations (VOGN,
    #: noisy K-FAC). ĝ needs no entry: DDP averages it (and ``rank_noise="independent"`` averages both).
    local_statistics: tuple[str, ...] = ()
    #: ``_precision`` and ``_update`` act weight by weight, so the engine may call them on slices of a
    #: group's parameters (bounding every temporary by a quarter of the parameters, or the largest one).
    #: Not inherited: it counts only where declared by the classes that define both methods.
    elementwise: bool = False
    #: ``_curvature`` needs the sample still in the parameters (a Hessian-vector product through the
    #: sample's graph); otherwise μ is restored first, so μ's copy and ĥ are never held together
    curvature_reads_sample: bool = False
    #: :meth:`backward` keeps the graph for a Hessian-vector product (VON's Hutchinson estimator)
    backward_create_graph: bool = False

    def __init__(
        self,
        params,
        defaults: dict[str, Any],
        *,
        mc_samples: int = 1,
        seed: int | None = None,
        skip_nonfinite: bool = False,
        noise: str = "normal",
        noise_dtype: torch.dtype | None = None,
        rank_noise: str = "shared",
        compile: bool = False,
    ):
        if not isinstance(compile, bool):
            raise ValueError(f"compile must be a bool, got {compile!r}")
        self.compile = compile
        self.mc_samples = check.positive_int("mc_samples", mc_samples)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        self.noise = check.choice("noise", noise, NOISES)
        floating = isinstance(noise_dtype, torch.dtype) and noise_dtype.is_floating_point
        if noise_dtype is not None and not floating:
            raise ValueError(f"noise_dtype must be a floating torch.dtype or None, got {noise_dtype!r}")
        self.noise_dtype = noise_dtype
        self.rank_noise = check.choice("rank_noise", rank_noise, dist_util.RANK_NOISE)
        seed = int(torch.randint(0, 2**62, ()).item()) if seed is None else seed
        self.seed = dist_util.broadcast_seed(seed)  # all ranks share rank 0's seed
        self.skip_nonfinite = bool(skip_nonfinite)
        self.skipped_steps = 0
        self.num_steps = 0
        self.num_draws = 0  # samples drawn so far (the counter of rank_noise="independent")
        self._pair_start: dict[str, Tensor] | None = None  # RNG state before an antithetic pair's ε
        self._init_transient()
        super().__init__(params, defaults)

    def _init_transient(self) -> None:
        self._generators: dict[torch.device, torch.Generator] = {}
        self._means: dict[Tensor, Tensor] = {}  # μ while the parameters hold a sample
        self._noise: dict[Tensor, Tensor] = {}  # ε of the current sample (needs_noise, antithetic)
        self._noise_negated = False  # antithetic: the buffers hold −ε
        self._sqrt_prec: dict[Tensor, Tensor] = {}  # √precision of the current sample (needs_noise)
        self._in_sample = False
        self._acc_grad: dict[Tensor, Tensor] = {}
        self._acc_curv: dict[Tensor, Tensor] = {}
        self._n_samples = 0
        self._rng_checkpoint: tuple[Any, ...] | None = None
        self._curv_sqrt_prec: TensorList | None = None
        self._reseed_to: int | None = None

    # ------------------------------------------------------------------------------------------------
    # The rule interface (subclasses override these)
    # ------------------------------------------------------------------------------------------------
    def _check_group(self, group: dict[str, Any]) -> None:
        """Raise ValueError naming any bad hyperparameter of ``group``."""

    def _init_state(self, group: dict[str, Any], p: Tensor, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _precision(self, group: dict[str, Any], states: list[dict[str, Any]]) -> TensorList:
        """Posterior precision 1/σ² of each parameter in ``states`` order, as new tensors (the engine
        may modify them in place)."""
        raise NotImplementedError

    def _curvature(
        self, group: dict[str, Any], grads: TensorList, noise: TensorList | None, states: list[dict[str, Any]]
    ) -> TensorList | None:
        """Per-sample curvature estimate ĥ (None for rules that need none)."""
        return None

    def _update(
        self,
        group: dict[str, Any],
        means: TensorList,
        grads: TensorList,
        curvs: TensorList | None,
        states: list[dict[str, Any]],
    ) -> None:
        """Update μ (``means``, in place) and the state from the MC means ĝ and ĥ. ``state['step']`` is t."""
        raise NotImplementedError

    def _perturb(
        self, group: dict[str, Any], params: TensorList, noise: TensorList, states: list[dict[str, Any]]
    ) -> None:
        """θ ← μ + σ⊙ε in place (``params`` hold μ on entry). Structured posteriors override this.

        The engine does not call this default: it runs the same arithmetic in a fused form
        (:meth:`_perturb_diagonal`). A subclass that overrides it gets it called with ε in ``noise``."""
        params.addcmul_(noise, self._precision(group, states).rsqrt())

    def _sampled_sqrt_precision(self, group: dict[str, Any], states: list[dict[str, Any]]) -> TensorList:
        """√precision = 1/σ at the current sample, for ``_curvature`` (e.g. the Price term ĝ⊙ε/σ).

        Inside a sample the state has not changed since the draw, so this is the value the draw computed
        (no second pass over the state); otherwise it is computed."""
        cached = self._curv_sqrt_prec
        if cached is not None and len(cached) == len(states):
            return cached
        return self._precision(group, states).sqrt_()

    def backward(self, loss: Tensor, output: Tensor | None = None) -> None:
        """The backward pass of one posterior sample, as this optimizer needs it.

        Closures may call ``opt.backward(loss, output)`` instead of ``loss.backward()``: every trainer
        then gets what its curvature needs (a graph for Hessian-vector products, sampled targets for the
        true Fisher) without the caller knowing which trainer it drives. Here: ``loss.backward()``, keeping
        the graph when ``backward_create_graph`` is set."""
        loss.backward(create_graph=self.backward_create_graph)

    def _closure_loss(self, result: Any) -> Tensor:
        """The loss from what the closure returned: the loss, or ``(loss, output)``."""
        if isinstance(result, tuple | list) and len(result) == 2:
            result = result[0]
        if isinstance(result, Tensor):
            return result.detach()
        if isinstance(result, int | float):
            return torch.tensor(float(result))
        raise TypeError(
            f"the closure must return the loss (a tensor), got {type(result).__name__}; write it as "
            "`def closure(): opt.zero_grad(); loss = loss_fn(model(x), y); loss.backward(); return loss`"
        )

    # ------------------------------------------------------------------------------------------------
    # torch.optim.Optimizer plumbing
    # ------------------------------------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        self._check_group(self.param_groups[-1])

    def _state_of(self, group: dict[str, Any], p: Tensor) -> dict[str, Any]:
        state = self.state[p]
        if not state:
            with torch.no_grad():
                self._init_state(group, p, state)
            state["step"] = 0
        return state

    def _trainable(self, group: dict[str, Any]) -> list[Tensor]:
        return [p for p in group["params"] if p.requires_grad]

    def _generator(self, device: torch.device) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device)
            gen.manual_seed(self._reseed_to if self._reseed_to is not None else self.seed)
            self._generators[device] = gen
        return gen

    def _rng_state(self) -> dict[str, Tensor]:
        return {str(dev): gen.get_state() for dev, gen in self._generators.items()}

    def _set_rng_state(self, states: dict[str, Tensor]) -> None:
        for dev, state in states.items():
            self._generator(torch.device(dev)).set_state(state)

    def _checkpoint(self) -> tuple[Any, ...]:
        """Everything a discarded sample must roll back: the RNG, the draw counter, the antithetic pair."""
        return (self._rng_state(), self.num_draws, self._pair_start, self._noise_negated)

    def _rollback(self, checkpoint: tuple[Any, ...]) -> None:
        rng, self.num_draws, self._pair_start, negated = checkpoint
        self._set_rng_state(rng)
        if negated != self._noise_negated:  # the antithetic buffers were flipped by the discarded draw
            for buf in self._noise.values():
                buf.neg_()
            self._noise_negated = negated

    def _independent_noise(self) -> bool:
        return self.rank_noise == "independent" and dist_util.is_distributed()

    def _reseed_for_draw(self) -> None:
        """rank_noise="independent": each draw's stream depends only on (seed, rank, draw counter)."""
        seed = dist_util.rank_seed(self.seed, dist_util.rank(), self.num_draws)
        for gen in self._generators.values():
            gen.manual_seed(seed)
        self._reseed_to = seed  # generators created later in this draw start here too

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["ngvi"] = {
            "seed": self.seed,
            "rng": self._rng_state(),
            "skipped_steps": self.skipped_steps,
            "num_steps": self.num_steps,
            "num_draws": self.num_draws,
        }
        if self._pair_start is not None:  # mid antithetic pair: ε is redrawn from here on load
            sd["ngvi"]["pair_start"] = self._pair_start
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._in_sample or self._n_samples:
            raise RuntimeError(
                "load_state_dict() was called with a posterior sample pending; call it between steps"
            )
        state_dict = dict(state_dict)
        extra = state_dict.pop("ngvi", None)
        super().load_state_dict(state_dict)
        if extra is not None:
            self.seed = int(extra["seed"])
            self.skipped_steps = int(extra["skipped_steps"])
            self.num_steps = int(extra["num_steps"])
            self.num_draws = int(extra.get("num_draws", 0))
            self._generators.clear()
            self._set_rng_state(extra["rng"])
            self._pair_start = extra.get("pair_start") if self.noise == "antithetic" else None
            self._redraw_pair()

    def __getstate__(self) -> dict[str, Any]:
        if self._in_sample:
            raise RuntimeError(
                "cannot copy or pickle the optimizer inside sampled_params(); do it between steps"
            )
        out = super().__getstate__()
        out.update(
            mc_samples=self.mc_samples,
            seed=self.seed,
            skip_nonfinite=self.skip_nonfinite,
            skipped_steps=self.skipped_steps,
            num_steps=self.num_steps,
            num_draws=self.num_draws,
            noise=self.noise,
            noise_dtype=self.noise_dtype,
            rank_noise=self.rank_noise,
            compile=self.compile,
            _pair_start=self._pair_start,
            _rng=self._rng_state(),
        )
        out.update(self._extra_getstate())
        return out

    def __setstate__(self, state: dict[str, Any]) -> None:
        rng = state.pop("_rng", {})
        super().__setstate__(state)
        self._init_transient()
        self._set_rng_state(rng)
        self._redraw_pair()

    def _extra_getstate(self) -> dict[str, Any]:
        """Further picklable configuration of a subclass (plain attributes set in its __init__)."""
        return {}

    # ------------------------------------------------------------------------------------------------
    # Sampling
    # ------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def sampled_params(self, train: bool = False) -> Iterator[None]:
        """Within the block, the parameters hold one posterior sample θ ~ q; on exit μ is restored.

        With ``train=True`` the gradient left in ``p.grad`` by a backward pass inside the block is kept as
        one MC sample for the next ``step()`` (call ``zero_grad()`` inside the block first). The weights
        are restored even if the block raises; a sample whose block raised is discarded.
        """
        with self._sample_scope(perturb=True, train=train):
            yield

    @contextlib.contextmanager
    def _sample_scope(self, *, perturb: bool, train: bool, keep_grad_refs: bool = False) -> Iterator[None]:
        if self._in_sample:
            raise RuntimeError("sampled_params() blocks cannot be nested")
        if train and self._rng_checkpoint is None:
            self._rng_checkpoint = self._checkpoint()
        if perturb:
            self._draw()
        self._in_sample = True
        try:
            try:
                yield
                if train and self.curvature_reads_sample:
                    self._accumulate_sample(keep_grad_refs)
            finally:
                self._in_sample = False
                if perturb:
                    self._restore()
            if train and not self.curvature_reads_sample:
                self._accumulate_sample(keep_grad_refs)
        finally:
            self._sqrt_prec.clear()

    @torch.no_grad()
    def _draw(self) -> None:
        done: list[Tensor] = []
        checkpoint = self._checkpoint()
        try:
            if self._independent_noise():
                self._reseed_for_draw()
            reuse = self.noise == "antithetic" and self._pair_start is not None  # second of a pair: −ε
            if self.noise == "antithetic" and not reuse:
                self._pair_start = self._rng_state_for_draw()
            for group in self.param_groups:
                params = self._trainable(group)
                if not params:
                    continue
                states = [self._state_of(group, p) for p in params]
                means = [torch.empty_like(p, memory_format=torch.preserve_format) for p in params]
                torch._foreach_copy_(means, [p.detach() for p in params])
                for p, mean in zip(params, means, strict=True):
                    self._means[p] = mean
                    done.append(p)
                if self._uses_default_perturb():
                    self._perturb_diagonal(group, params, means, states, reuse)
                else:
                    noise = TensorList(self._noise_for(p, reuse) for p in params)
                    self._perturb(group, TensorList(p.detach() for p in params), noise, states)
            if self.noise == "antithetic":
                self._noise_negated = reuse
                if reuse:
                    self._pair_start = None
            self.num_draws += 1
        except BaseException:
            for p in done:
                p.copy_(self._means.pop(p))
            self._sqrt_prec.clear()
            self._rollback(checkpoint)
            if self.noise == "antithetic":  # some buffers may have been flipped: redraw the pair's ε
                self._redraw_pair()
            raise

    def _uses_default_perturb(self) -> bool:
        return type(self)._perturb is VariationalOptimizer._perturb

    def _keeps_noise(self) -> bool:
        return self.needs_noise or self.noise == "antithetic"

    def _perturb_diagonal(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        means: list[Tensor],
        states: list[dict[str, Any]],
        reuse: bool,
    ) -> None:
        """The default θ = μ + ε/√precision, bit for bit, with one precision pass and no spare copies.

        ``params`` hold μ on entry (saved in ``means``). Without a kept noise buffer ε is drawn straight
        into the parameter and θ is formed in place, ``torch.addcmul(μ, ε, σ, out=p)``: the same kernel and
        operand order as ``p.addcmul_(ε, σ)``, so the result is bitwise that of :meth:`_perturb`."""
        for part in self._slices(params):
            sqrt_prec = self._precision(group, states[part]).sqrt_()
            if self.needs_noise:  # the curvature reads ĝ⊙ε·√precision: keep √precision for this sample
                self._sqrt_prec.update(zip(params[part], sqrt_prec, strict=True))
                sigma = sqrt_prec.reciprocal()
            else:
                sigma = sqrt_prec.reciprocal_()
            if self._keeps_noise():
                noise = TensorList(self._noise_for(p, reuse) for p in params[part])
                TensorList(p.detach() for p in params[part]).addcmul_(noise, sigma)
                continue
            for p, mean, s in zip(params[part], means[part], sigma, strict=True):
                p = p.detach()
                if self.noise_dtype in (None, p.dtype) and p.is_contiguous():
                    eps = p.normal_(generator=self._generator(p.device))
                else:
                    eps = p.copy_(self._normal_like(p))
                torch.addcmul(mean, eps, s, out=eps)

    def _elementwise(self) -> bool:
        """``elementwise`` as declared by the classes defining ``_precision`` and ``_update`` (a subclass
        that overrides either, e.g. with group-wide scratch buffers, must declare it again)."""
        owners = [next(c for c in type(self).__mro__ if m in c.__dict__) for m in ("_precision", "_update")]
        return all(c.__dict__.get("elementwise", False) for c in owners)

    def _slices(self, params: list[Tensor]) -> list[slice]:
        """Consecutive runs of ``params`` of at most a quarter of their elements (or one parameter) each,
        for ``elementwise`` rules: their temporaries then never hold a full copy of the parameters."""
        if not self._elementwise() or len(params) < 2:
            return [slice(0, len(params))]
        budget = -(-sum(p.numel() for p in params) // 4)
        out, start, size = [], 0, 0
        for i, p in enumerate(params):
            if size and size + p.numel() > budget:
                out.append(slice(start, i))
                start, size = i, 0
            size += p.numel()
        out.append(slice(start, len(params)))
        return out

    def _normal_like(self, p: Tensor) -> Tensor:
        """A fresh ε shaped like p (drawn in ``noise_dtype`` when set), laid out as ``empty_like(p)``."""
        dtype = self.noise_dtype or p.dtype
        buf = torch.empty_like(p, dtype=dtype, memory_format=torch.preserve_format)
        return buf.normal_(generator=self._generator(p.device))

    def _noise_for(self, p: Tensor, reuse: bool) -> Tensor:
        """ε for p: with ``reuse`` (the second of an antithetic pair) −ε of the pair's first, else fresh."""
        buf = self._noise.get(p) if reuse else None
        if buf is None:
            return self._standard_normal(p)
        return buf if self._noise_negated else buf.neg_()

    def _standard_normal(self, p: Tensor) -> Tensor:
        """A fresh ε ~ N(0, I) for p from the optimizer's generator, kept in ``_noise`` when the rule or
        the antithetic option needs it after the draw."""
        if not self._keeps_noise():
            return self._normal_like(p)
        buf = self._noise.get(p)
        if buf is None:
            buf = self._noise[p] = torch.empty_like(p, memory_format=torch.preserve_format)
        if self.noise_dtype in (None, p.dtype):
            return buf.normal_(generator=self._generator(p.device))
        return buf.copy_(self._normal_like(p))

    def _rng_state_for_draw(self) -> dict[str, Tensor]:
        """The RNG state before a draw, with the generators this draw will use created first."""
        for group in self.param_groups:
            for p in self._trainable(group):
                self._generator(p.device)
        return self._rng_state()

    @torch.no_grad()
    def _redraw_pair(self) -> None:
        """After load_state_dict or unpickling mid antithetic pair: redraw the pair's ε from its saved
        RNG state (so the next sample is −ε, as without the interruption), then go back to the saved RNG."""
        self._noise.clear()
        self._noise_negated = False
        if self._pair_start is None:
            return
        now = self._rng_state()
        self._set_rng_state(self._pair_start)
        for group in self.param_groups:
            for p in self._trainable(group):
                self._standard_normal(p)
        self._set_rng_state(now)

    @torch.no_grad()
    def _restore(self) -> None:
        params = list(self._means)
        if params:
            torch._foreach_copy_([p.detach() for p in params], [self._means[p] for p in params])
        self._means.clear()  # freed until the next draw: the update's temporaries can use the memory

    def _mean_of(self, p: Tensor) -> Tensor:
        """μ of a parameter, also while the parameter holds a sample."""
        return self._means[p] if self._in_sample and p in self._means else p.detach()

    # ------------------------------------------------------------------------------------------------
    # Accumulating MC samples and stepping
    # ------------------------------------------------------------------------------------------------
    def _accumulate_sample(self, keep_grad_refs: bool) -> None:
        for group in self.param_groups:
            params = [p for p in self._trainable(group) if p.grad is not None]
            if not params:
                continue
            for p in params:
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            states = [self._state_of(group, p) for p in params]
            grads = TensorList(p.grad.detach() for p in params)
            noise = TensorList(self._noise[p] for p in params) if self.needs_noise else None
            if self.needs_noise and all(p in self._sqrt_prec for p in params):
                self._curv_sqrt_prec = TensorList(self._sqrt_prec[p] for p in params)
            try:
                with torch.no_grad():
                    curvs = self._curvature(group, grads, noise, states)
            finally:
                self._curv_sqrt_prec = None
            for i, p in enumerate(params):
                self._add(self._acc_grad, p, grads[i], keep_grad_refs)
                if curvs is not None:
                    self._add(self._acc_curv, p, curvs[i], keep_ref=True)
        self._n_samples += 1

    @staticmethod
    def _add(acc: dict[Tensor, Tensor], p: Tensor, value: Tensor, keep_ref: bool) -> None:
        if p in acc:
            acc[p].add_(value)
        else:
            acc[p] = value if keep_ref else value.clone()

    def _discard_pending(self) -> None:
        self._acc_grad.clear()
        self._acc_curv.clear()
        self._n_samples = 0
        if self._rng_checkpoint is not None:
            self._rollback(self._rng_checkpoint)
            self._rng_checkpoint = None

    def step(self, closure: Callable[[], Any] | None = None) -> Tensor | None:
        """One update from ``mc_samples`` posterior samples (closure form) or from the pending samples
        collected with ``sampled_params(train=True)`` (manual form). Returns the mean loss."""
        if self._in_sample:
            raise RuntimeError("step() was called inside sampled_params(); call it after the with-block")
        if closure is None:
            if self._n_samples == 0:
                if not self.perturbs_in_step:
                    with self._sample_scope(perturb=False, train=True):
                        pass
                    return self._finish(None)
                raise RuntimeError(
                    f"{type(self).__name__}.step() needs gradients at posterior samples: pass a closure, "
                    "`opt.step(closure)`, or first run `with opt.sampled_params(train=True): ...backward()`"
                )
            return self._finish(None)
        if self._n_samples:
            raise RuntimeError(
                f"step(closure) was called with {self._n_samples} pending sample(s) from "
                "sampled_params(train=True); call step() without a closure to use them"
            )
        losses = []
        try:
            for _ in range(self.mc_samples):
                with self._sample_scope(
                    perturb=self.perturbs_in_step, train=True, keep_grad_refs=self.mc_samples == 1
                ):
                    with torch.enable_grad():
                        result = closure()
                    losses.append(self._closure_loss(result))
        except BaseException:
            self._discard_pending()
            raise
        loss = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        return self._finish(loss)

    def _finish(self, loss: Tensor | None) -> Tensor | None:
        updates = []
        for group in self.param_groups:
            params = [p for p in group["params"] if p in self._acc_grad]
            if not params:
                continue
            grads = TensorList(self._acc_grad[p] for p in params)
            curvs = TensorList(self._acc_curv[p] for p in params) if params[0] in self._acc_curv else None
            updates.append((group, params, grads, curvs))
        self._reduce_statistics(updates)
        everything = [t for _, _, g, c in updates for t in (*g, *(c or []))]
        if loss is not None:
            everything.append(loss.reshape(1))
        if not dist_util.all_agree(TensorList(everything).all_finite()):
            message = self._nonfinite_message(updates, loss)
            self._discard_pending()
            if self.skip_nonfinite:
                self.skipped_steps += 1
                return loss
            raise NonFiniteGradientError(message)
        scale = 1.0 / self._n_samples
        with torch.no_grad():
            for group, params, grads, curvs in updates:
                if self._n_samples > 1:
                    grads.mul_(scale)
                    if curvs is not None:
                        curvs.mul_(scale)
                states = [self.state[p] for p in params]
                for state in states:
                    state["step"] += 1
                means = TensorList(p.detach() for p in params)
                for part in self._slices(params):
                    self._update(
                        group,
                        TensorList(means.tensors[part]),
                        TensorList(grads.tensors[part]),
                        None if curvs is None else TensorList(curvs.tensors[part]),
                        states[part],
                    )
        self._acc_grad.clear()
        self._acc_curv.clear()
        self._n_samples = 0
        self._rng_checkpoint = None
        self.num_steps += 1
        return loss

    def _reduce_statistics(self, updates: list[tuple[dict[str, Any], list[Tensor], TensorList, Any]]) -> None:
        """Under torch.distributed, average over ranks (in place) what each rank computed from its own
        data, so that every rank takes the same update: ĝ and ĥ with ``rank_noise="independent"``, and the
        rule's ``local_statistics`` always. A no-op in a single process. (With ``mc_samples`` > 1 the sums
        over samples are averaged; the engine divides by the sample count afterwards.)"""
        if not dist_util.is_distributed():
            return
        local = {"grad", "curv"} if self.rank_noise == "independent" else set(self.local_statistics)
        tensors: list[Tensor] = []
        for _, _params, grads, curvs in updates:
            if "grad" in local:  # with mc_samples=1 ĝ is p.grad itself, averaged in place as DDP would
                tensors += grads.tensors
            if "curv" in local and curvs is not None:
                tensors += curvs.tensors
        dist_util.all_reduce_mean_(tensors)

    def _nonfinite_message(self, updates, loss: Tensor | None) -> str:
        where = []
        for group, params, grads, curvs in updates:
            gi = self.param_groups.index(group)
            all_params = group["params"]
            bad = set(grads.nonfinite_indices()) | set(curvs.nonfinite_indices() if curvs else [])
            where += [
                f"param_groups[{gi}]['params'][{_index(all_params, params[i])}] "
                f"(shape {tuple(params[i].shape)})"
                for i in sorted(bad)
            ]
        what = ", ".join(where) if where else f"the loss ({loss.item() if loss is not None else 'n/a'})"
        return (
            f"{type(self).__name__}: non-finite gradient or curvature in {what}. The parameters and "
            "optimizer state are unchanged. Check the loss for NaN/Inf, lower the learning rate or the "
            "initial variance (init_prec), or pass skip_nonfinite=True to skip such steps."
        )

    # ------------------------------------------------------------------------------------------------
    # The posterior
    # ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def posterior(self) -> DiagonalGaussian:
        """A snapshot of q = N(μ, σ²) over all parameters, in parameter order."""
        means, variances = [], []
        for group in self.param_groups:
            params = list(group["params"])
            if not params:
                continue
            states = [self._state_of(group, p) for p in params]
            means += [self._mean_of(p) for p in params]
            variances += list(self._precision(group, states).reciprocal())
        return DiagonalGaussian(means, variances)


def _index(params: list[Tensor], p: Tensor) -> int:
    return next(i for i, q in enumerate(params) if q is p)
