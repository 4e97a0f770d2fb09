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

from .._tensorlist import TensorList
from ..posterior import DiagonalGaussian
from . import _validation as check

__all__ = ["NonFiniteGradientError", "VariationalOptimizer"]


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
    """

    #: the rule's ``_curvature`` reads the standard-normal draw ε of each sample
    needs_noise: bool = False
    #: False for rules that take their gradient at the mean (BAdam); sampling is then only for prediction
    perturbs_in_step: bool = True

    def __init__(
        self,
        params,
        defaults: dict[str, Any],
        *,
        mc_samples: int = 1,
        seed: int | None = None,
        skip_nonfinite: bool = False,
    ):
        self.mc_samples = check.positive_int("mc_samples", mc_samples)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        self.seed = int(torch.randint(0, 2**62, ()).item()) if seed is None else seed
        self.skip_nonfinite = bool(skip_nonfinite)
        self.skipped_steps = 0
        self.num_steps = 0
        self._init_transient()
        super().__init__(params, defaults)

    def _init_transient(self) -> None:
        self._generators: dict[torch.device, torch.Generator] = {}
        self._means: dict[Tensor, Tensor] = {}  # μ while the parameters hold a sample
        self._noise: dict[Tensor, Tensor] = {}  # ε of the current sample (rules with needs_noise)
        self._in_sample = False
        self._acc_grad: dict[Tensor, Tensor] = {}
        self._acc_curv: dict[Tensor, Tensor] = {}
        self._n_samples = 0
        self._rng_checkpoint: dict[str, Tensor] | None = None

    # ------------------------------------------------------------------------------------------------
    # The rule interface (subclasses override these)
    # ------------------------------------------------------------------------------------------------
    def _check_group(self, group: dict[str, Any]) -> None:
        """Raise ValueError naming any bad hyperparameter of ``group``."""

    def _init_state(self, group: dict[str, Any], p: Tensor, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _precision(self, group: dict[str, Any], states: list[dict[str, Any]]) -> TensorList:
        """Posterior precision 1/σ² of each parameter in ``states`` order."""
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
        """θ ← μ + σ⊙ε in place (``params`` hold μ on entry). Structured posteriors override this."""
        params.addcmul_(noise, self._precision(group, states).rsqrt())

    def _closure_loss(self, result: Any) -> Tensor:
        """The loss from what the closure returned (subclasses may accept richer returns)."""
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
            gen.manual_seed(self.seed)
            self._generators[device] = gen
        return gen

    def _rng_state(self) -> dict[str, Tensor]:
        return {str(dev): gen.get_state() for dev, gen in self._generators.items()}

    def _set_rng_state(self, states: dict[str, Tensor]) -> None:
        for dev, state in states.items():
            self._generator(torch.device(dev)).set_state(state)

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["ngvi"] = {
            "seed": self.seed,
            "rng": self._rng_state(),
            "skipped_steps": self.skipped_steps,
            "num_steps": self.num_steps,
        }
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
            self._generators.clear()
            self._set_rng_state(extra["rng"])

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
            _rng=self._rng_state(),
        )
        out.update(self._extra_getstate())
        return out

    def __setstate__(self, state: dict[str, Any]) -> None:
        rng = state.pop("_rng", {})
        super().__setstate__(state)
        self._init_transient()
        self._set_rng_state(rng)

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
            self._rng_checkpoint = self._rng_state()
        if perturb:
            self._draw()
        self._in_sample = True
        try:
            yield
            if train:
                self._accumulate_sample(keep_grad_refs)
        finally:
            self._in_sample = False
            if perturb:
                self._restore()

    @torch.no_grad()
    def _draw(self) -> None:
        done: list[Tensor] = []
        try:
            for group in self.param_groups:
                params = self._trainable(group)
                if not params:
                    continue
                states = [self._state_of(group, p) for p in params]
                for p in params:
                    mean = self._means.get(p)
                    if mean is None:
                        mean = self._means[p] = torch.empty_like(p, memory_format=torch.preserve_format)
                    mean.copy_(p)
                    done.append(p)
                noise = TensorList(self._standard_normal(p) for p in params)
                self._perturb(group, TensorList(p.detach() for p in params), noise, states)
        except BaseException:
            for p in done:
                p.copy_(self._means[p])
            raise

    def _standard_normal(self, p: Tensor) -> Tensor:
        buf = self._noise.get(p) if self.needs_noise else None
        if buf is None:
            buf = torch.empty_like(p, memory_format=torch.preserve_format)
            if self.needs_noise:
                self._noise[p] = buf
        return buf.normal_(generator=self._generator(p.device))

    @torch.no_grad()
    def _restore(self) -> None:
        for group in self.param_groups:
            for p in self._trainable(group):
                mean = self._means.get(p)
                if mean is not None:
                    p.copy_(mean)

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
            with torch.no_grad():
                curvs = self._curvature(group, grads, noise, states)
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
            self._set_rng_state(self._rng_checkpoint)
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
        everything = [t for _, _, g, c in updates for t in (*g, *(c or []))]
        if loss is not None:
            everything.append(loss.reshape(1))
        if not TensorList(everything).all_finite():
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
                self._update(group, TensorList(p.detach() for p in params), grads, curvs, states)
        self._acc_grad.clear()
        self._acc_curv.clear()
        self._n_samples = 0
        self._rng_checkpoint = None
        self.num_steps += 1
        return loss

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
