r"""The weight-perturbation engine shared by every ngvi optimizer (docs/ARCHITECTURE.md draws its parts).

A rule says, in the notation of docs/NOTATION.md, its state at t=0 (``_init_state``), the posterior
precision (``_precision``) and its update from the MC means of ĝ and ĥ (``_update``), and is given a curvature
estimator for ĥ (:mod:`ngvi.curvature`). The engine does the rest once, with its parts: the
:class:`~.noise.NoiseSource`, the :class:`~.accumulator.SampleAccumulator`, the draw (:mod:`.perturbation`)
and sample-scope plugins (objects whose ``scope(train=...)`` is entered inside every sample: curvature hooks,
BBVI's local reparameterisation). It restores μ also when the closure raises, skips parameters without a
gradient, refuses non-finite gradients without touching any state, and resumes bit-identically.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from ... import _validation as check
from ..._tensorlist import TensorList
from ...curvature.estimators import CurvatureEstimator, estimator_for
from ...posterior import DiagonalGaussian
from .. import diagnostics as _diagnostics
from . import empirical_bayes as _eb
from . import flat, group_keys, mixed_precision, posterior_prior, sample_guard, sharded, state_checks
from .accumulator import SampleAccumulator
from .buffers import BufferGuard
from .closure import closure_loss, run_backward
from .device_check import CHECKS, PendingChecks, agreed, masked, nonfinite_flags, use_device_check
from .noise import NOISES, NoiseCheckpoint, NoiseSource
from .options import EngineOptions
from .options import resolve as resolve_options
from .perturbation import draw, slices, sqrt_prec_and_sigma
from .prior import initial_curvature
from .region import GroupUpdate

__all__ = ["NOISES", "NonFiniteGradientError", "VariationalOptimizer", "initial_curvature"]


@dataclass(frozen=True)
class _OpenSample:
    """What :meth:`VariationalOptimizer.end_sample` needs of the sample it closes."""

    train: bool
    perturb: bool
    keep_grad_refs: bool
    checkpoint: NoiseCheckpoint  # the noise before this sample's draw
    plugins: contextlib.ExitStack


class NonFiniteGradientError(FloatingPointError):
    """A step saw a NaN or Inf gradient, curvature or loss; parameters and optimizer state are unchanged."""


class VariationalOptimizer(Optimizer):
    """Base class: a Gaussian posterior over the parameters, trained by weight perturbation.

    Args:
        params: parameters or parameter groups, as for any ``torch.optim.Optimizer``.
        defaults: per-group hyperparameters (validated by the subclass's ``_check_group``).
        mc_samples: posterior samples per ``step(closure)``; gradients and curvature are averaged.
        curvature: the estimator of ĥ (None for rules that need none).  plugins: more sample-scope plugins.
        seed: seed of the optimizer's own generators (``None``: drawn from torch's global RNG).
        skip_nonfinite: skip (and count) a non-finite step instead of raising NonFiniteGradientError.
        engine: how the engine runs the step: an :class:`~.options.EngineOptions` or a dict of its fields
            (``noise``, ``noise_dtype``, ``rank_noise``, ``fp32_state``, ``finite_check``, ``flat``,
            ``compile``).
        empirical_bayes: learn the prior precision during training (:mod:`.empirical_bayes`): ``None``
            (default: λ stays as given), ``True`` or ``"group"`` (one λ per parameter group), ``"layer"``
            (one per parameter tensor), or an :class:`~.empirical_bayes.EmpiricalBayes` for the schedule.
        **legacy: the engine's options as keywords: deprecated (a ``DeprecationWarning``; refused from 0.3.0).
    """

    #: False for rules that take their gradient at the mean (BAdam); sampling is then only for prediction
    _perturbs_in_step: bool = True
    #: ``_precision`` and ``_update`` act weight by weight, so the engine may call them on slices. Counts
    #: only where declared by the classes that define both methods (see ``__init_subclass__``).
    elementwise: bool = False
    _elementwise: bool = False
    #: the rule keeps the default ``_perturb``, so the fused path (:mod:`.perturbation`) may run it
    _diagonal_perturb: bool = True
    #: the draw is θ = μ + v·ε⊙r with :meth:`_draw_factors`' r and v (the default ``_perturb``, or a rule's
    #: own diagonal draw that overrides both), so a flat bucket (:mod:`.flat`) may form it
    _flat_draw: bool = True
    _local_params: frozenset[Tensor] = frozenset()  #: sampled per example (:mod:`ngvi.optim._diag_local`)
    #: the curvature estimators the rule accepts through ``curvature=`` (:mod:`ngvi.curvature.estimators`)
    curvatures: tuple[str, ...] = ()
    #: the optimizer takes the model and hooks its layers: its parameters are the model's, in one group
    takes_model: bool = False
    #: ``posterior()`` gives a Gaussian (False for point estimates built on the engine: the K-FAC baseline)
    _has_posterior: bool = True
    #: the posterior precision is (data part) + λ, weight by weight (False where the prior is damping inside
    #: Kronecker or full factors): :mod:`.empirical_bayes` then keeps every precision positive when λ falls
    _additive_prior: bool = True
    #: ``_update`` writes only μ and the tensors in the parameters' state (in place or by replacing them), so
    #: ``finite_check="device"`` can mask it (:mod:`.device_check`)
    _maskable_update: bool = True
    #: whether ``finite_check="auto"`` masks on an accelerator (False where the mask costs more than a read)
    _device_check_by_default: bool = True
    #: the noise of ``noise=None`` where no parameter is an FSDP2 shard
    _default_noise: str = "normal"
    #: ``set_prior`` takes a mean-field posterior, read weight by weight by the rule (:mod:`.posterior_prior`)
    _takes_posterior_prior: bool = False

    @classmethod
    def builds_from_model(cls, **options: Any) -> bool:
        """Whether ``cls(..., **options)`` takes the model itself rather than its parameters (so that a
        framework that builds the optimizer, e.g. the Hugging Face Trainer, knows what to pass)."""
        return cls.takes_model

    #: attributes rebuilt by ``_init_transient`` (never pickled)
    _transient: tuple[str, ...] = (
        "_means",
        "_sqrt_prec",
        "_in_sample",
        "_open_sample",
        "_backward_done",
        "_rng_checkpoint",
        "_pending_checks",
        "_bound",
        "_buckets",
        "_thetas",
        "_in_place",
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)

        def owner(*names: str) -> type:  # the class that defines the method (the default runs the core)
            found = (c for c in cls.__mro__ for n in names if n in c.__dict__)
            return next((c for c in found if c is not VariationalOptimizer), VariationalOptimizer)

        rule = (owner("_precision", "_precision_core"), owner("_update"))
        cls._elementwise = all(c.__dict__.get("elementwise", False) for c in rule)
        cls._diagonal_perturb = cls._perturb is VariationalOptimizer._perturb
        cls._flat_draw = cls._diagonal_perturb or owner("_perturb") is owner("_draw_factors")

    def __init__(
        self,
        params,
        defaults: dict[str, Any],
        *,
        mc_samples: int = 1,
        curvature: str | CurvatureEstimator | None = None,
        plugins: tuple[Any, ...] = (),
        seed: int | None = None,
        skip_nonfinite: bool = False,
        empirical_bayes: Any = None,
        engine: EngineOptions | Mapping[str, Any] | None = None,
        **legacy: Any,
    ):
        options = self.engine = resolve_options(type(self).__name__, engine, legacy)
        noise, noise_dtype, rank_noise = options.noise, options.noise_dtype, options.rank_noise
        flat, finite_check = options.flat, options.finite_check
        self.flat = None if flat is None else check.boolean("flat", flat)
        self.empirical_bayes = _eb.configure(self, empirical_bayes, defaults)
        self.mc_samples = check.positive_int("mc_samples", mc_samples)
        self.finite_check = check.choice("finite_check", finite_check, CHECKS)
        if finite_check == "device" and not self._maskable_update:
            raise ValueError(
                f"{type(self).__name__} reads values back in its step (its factorisations), so it cannot "
                "decide non-finite steps on the device: use finite_check='host'"
            )
        self.fp32_state = check.boolean("fp32_state", options.fp32_state)
        self.skip_nonfinite = check.boolean("skip_nonfinite", skip_nonfinite)
        self.compile = check.boolean("compile", options.compile)
        estimator = None if curvature is None else estimator_for(curvature, self.curvatures)
        self.curvature_estimator = estimator
        self.plugins = (*([estimator] if estimator is not None else []), *plugins)
        mode = self._default_noise if noise is None else noise
        self.noise_source = NoiseSource.configured(seed, mode, noise_dtype, rank_noise, keep=self.needs_noise)
        self._noise_chosen = noise is not None  # else shards take "chunked" (:func:`.sharded.choose_noise`)
        self.skipped_steps = 0
        self.num_steps = 0
        self.accumulator = SampleAccumulator()
        self._init_transient()
        super().__init__(params, defaults)
        if self.empirical_bayes is not None and self.empirical_bayes.per == "layer":
            _eb.split_layers(self)

    def _init_transient(self) -> None:
        self._means: dict[Tensor, Tensor] = {}  # μ while the parameters hold a sample
        self._thetas: dict[Tensor, Tensor] = {}  # θ's tensor of each parameter where the draw kept it
        self._buckets: dict[int, list] = {}  # id(group) → its flat buckets (:mod:`.flat`)
        self._in_place: list = []  # sharded buckets whose shards hold θ (:mod:`.sharded`)
        self._bound: sample_guard.Bound = {}  # θ's tensors and version counters, checked at end_sample
        self._sqrt_prec: dict[Tensor, Tensor] = {}  # √precision of the current sample (needs_noise)
        self._in_sample = False
        self._open_sample: _OpenSample | None = None  # what end_sample() closes
        self._backward_done = False  # opt.backward() ran in the current sample
        self._rng_checkpoint = None  # the noise before the pending samples: a discard rolls back to it
        self._buffer_guard = BufferGuard()  # batch norm's running statistics, for a skipped step
        self._pending_checks = PendingChecks()  # the device path's flags on their way to the host

    def _estimator_flag(self, name: str) -> bool:  # what the estimator asks of the engine
        return bool(getattr(self.curvature_estimator, name, False))

    needs_noise = property(lambda self: self._estimator_flag("needs_noise"), doc="ĥ reads ε")
    _curvature_reads_sample = property(lambda self: self._estimator_flag("reads_sample"))
    _backward_create_graph = property(lambda self: self._estimator_flag("create_graph"))
    curvature = property(lambda self: getattr(self.curvature_estimator, "name", None), doc="ĥ's estimator")
    model = property(lambda self: self.curvature_estimator.model if self.takes_model else None, doc="hooked")
    seed = property(lambda self: self.noise_source.seed, lambda self, v: self.noise_source.reseed(v))
    noise = property(lambda self: self.noise_source.mode)
    noise_dtype = property(lambda self: self.noise_source.dtype)
    rank_noise = property(lambda self: self.noise_source.rank_noise)
    num_draws = property(lambda self: self.noise_source.num_draws)

    # -- the rule interface (subclasses override these) ---------------------------------------------------
    def _check_group(self, group: dict[str, Any]) -> None:
        """Raise ValueError naming any bad hyperparameter of ``group``."""

    def _init_state(self, group: dict[str, Any], p: Tensor, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _precision(self, group: dict[str, Any], states: list[dict[str, Any]]) -> TensorList:
        """Posterior precision 1/σ² of each parameter in ``states`` order, as new tensors: by default the
        rule's ``_precision_core`` → (pure core, state lists, hyperparameters), which the compiled draw
        also fuses with σ = 1/√precision (:func:`~.functional.diagonal_sigma`)."""
        core, lists, hyper = self._precision_core(group, states)
        return TensorList(core(*lists, **hyper))

    def _update(self, group, means: TensorList, grads: TensorList, curvs: TensorList | None, states) -> None:
        """Update μ (``means``, in place) and the state from the MC means ĝ and ĥ. ``state['step']`` is t."""
        raise NotImplementedError

    def _perturb(self, group, params: TensorList, noise: TensorList, states) -> None:
        """θ ← μ + σ⊙ε in place (``params`` hold μ on entry). Structured posteriors override this; the
        default is run in a fused form (:meth:`_perturb_diagonal`), bitwise the same."""
        params.addcmul_(noise, self._precision(group, states).rsqrt())

    def _draw_factors(self, group, states) -> tuple[TensorList | None, TensorList, float]:
        """(√precision, r, v) of ``states`` with θ = μ + v·(ε⊙r), as a flat bucket forms the draw: by default
        r = σ = 1/√precision and v = 1 (√precision is kept, else None, where the curvature reads ε). A rule
        whose own ``_perturb`` is diagonal in another form overrides this too, so that the flat draw is
        bitwise its per-tensor one (VOGN)."""
        sqrt_prec, sigma = sqrt_prec_and_sigma(self, group, states)
        return sqrt_prec, sigma, 1.0

    def unsampled(self, p: Tensor, train: bool) -> bool:
        """True for a parameter that a draw leaves at μ (sampled elsewhere: BBVI's local trick, the layers of
        :func:`~ngvi.optim._diag_local.sample_preactivations` in training; or a point estimate)."""
        return self.point_estimate(p) or (train and p in self._local_params)

    def point_estimate(self, p: Tensor) -> bool:
        """True for a parameter that is a point estimate: no posterior noise, variance 0 in ``posterior()``
        (batch-norm parameters under the hook-based rules, see :mod:`ngvi.curvature.layers`)."""
        hooks = getattr(self.curvature_estimator, "hooks", None)
        return p in getattr(hooks, "point_params", ())

    # -- plumbing ------------------------------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if self.takes_model and self.param_groups:
            raise ValueError(f"{type(self).__name__} {check.MODEL_GROUPS}")
        if isinstance(param_group, dict):
            group_keys.warn_unknown(self, param_group)
        super().add_param_group(param_group)
        try:
            names = {id(p): n for n, p in self.model.named_parameters()} if self.takes_model else None
            where = (type(self).__name__, self.param_groups[-1]["params"], len(self.param_groups) - 1, names)
            check.nonempty_params(*where)
            if not flat.takes_shards(self):  # FSDP2's shards take the flat path, where θ is written there
                check.no_dtensor(*where)
            sharded.choose_noise(self, self.param_groups[-1]["params"])
            self._check_group(self.param_groups[-1])
        except ValueError:
            self.param_groups.pop()  # a refused group leaves the optimizer as it was
            raise

    def state_of(self, group: dict[str, Any], p: Tensor) -> dict[str, Any]:
        """p's state, created at first use."""
        state = self.state[p]
        if not state:
            mixed_precision.init_state(self, group, p, state)
            state["step"] = 0
            for key, value in state.items():  # a shard's state is the rank's part only (:mod:`.sharded`)
                if isinstance(value, Tensor) and sharded.is_sharded(value):
                    state[key] = sharded.local(value).contiguous()
        return state

    @staticmethod
    def trainable(group: dict[str, Any]) -> list[Tensor]:
        return [p for p in group["params"] if p.requires_grad]

    def _all_trainable(self) -> list[Tensor]:
        return [p for group in self.param_groups for p in self.trainable(group)]

    def mean_of(self, p: Tensor) -> Tensor:
        """μ of a parameter, also while it holds a sample (a bfloat16 parameter's float32 master)."""
        return mixed_precision.mean(self, p, self._means.get(p) if self._in_sample else None)

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict plus the engine's ``"ngvi"`` entry. Refused while a sample is open: the model's
        parameters then hold θ, and a checkpoint of the model beside this one would resume from θ as μ."""
        if self._in_sample:
            raise RuntimeError(
                f"{type(self).__name__}.state_dict() was called while a posterior sample is open: the "
                "parameters hold the sample, not the mean, so a checkpoint taken now would resume from the "
                "sample; save between steps (outside sampled_params(), or after end_sample())"
            )
        self.check_finite()  # a checkpoint never holds a step the device flagged but nobody read
        out = super().state_dict()
        params = [p for group in self.param_groups for p in group["params"]]
        out["state"] = {  # a look-up may leave an empty entry; FSDP2's shards: DTensors (:mod:`.sharded`)
            k: sharded.as_dtensors(params[k], v) if sharded.is_sharded(params[k]) else v
            for k, v in out["state"].items()
            if v
        }
        return {**out, "ngvi": state_checks.engine_state(self)}

    @torch.no_grad()
    def init_state(self) -> None:
        """Create the state of every trainable parameter now, as its first step would (nothing else
        changes): a fresh optimizer's ``state_dict()`` then has every entry, as
        ``torch.distributed.checkpoint.load`` needs to load a checkpoint into it (the noise generators of
        the parameters' devices included)."""
        for group in self.param_groups:
            for p in self.trainable(group):
                self.state_of(group, p)
                self.noise_source.generator(p.device)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict()``; state that this optimizer cannot use is refused with a ValueError that
        names what differs, and the optimizer is left as it was. A group saved before its rule had
        ``kl_clip`` (the trust region, issue 32) resumes without one (``kl_clip=None``), as it was trained."""
        groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
        if "kl_clip" in self.defaults and isinstance(groups, list):
            groups = [{"kl_clip": None, **g} if isinstance(g, dict) else g for g in groups]
            state_dict = {**state_dict, "param_groups": groups}
        self._read_checks(wait=True, loading=True)  # a masked step is reported, not dropped unread
        state_checks.load(self, state_dict, super().load_state_dict)

    def __getstate__(self) -> dict[str, Any]:
        if self._in_sample:
            raise RuntimeError(
                "cannot copy or pickle the optimizer while a posterior sample is open (in sampled_params(), "
                "or before end_sample()); do it between steps"
            )
        self.check_finite()
        skip = {*self._transient, "accumulator", "step", "_opt_called"}  # LR schedulers patch `step`
        out = {k: v for k, v in self.__dict__.items() if k not in skip and not k.startswith("_optimizer_")}
        return {**out, **super().__getstate__()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.accumulator = SampleAccumulator()
        self._init_transient()
        self.noise_source.redraw_pair()

    # -- sampling ------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def sampled_params(self, train: bool = False) -> Iterator[None]:
        """Within the block, the parameters hold one posterior sample θ ~ q; on exit μ is restored.

        With ``train=True`` the gradient left in ``p.grad`` by a backward pass inside the block is kept as
        one MC sample for the next ``step()`` (call ``zero_grad()`` inside the block first; a rule that takes
        its gradient at the mean, BAdam, then holds μ). The weights are restored even if the block raises; a
        sample whose block raised is discarded, its noise rolled back. :meth:`begin_sample` and
        :meth:`end_sample` are the same for frameworks that drive training through callbacks.
        """
        self.begin_sample(train=train)
        try:
            yield
        except BaseException as err:
            self._end_sample(discard=True, error=err)
            raise
        self.end_sample()

    def begin_sample(self, train: bool = False) -> None:
        """Put one posterior sample θ ~ q into the parameters until :meth:`end_sample` (the callback form
        of :meth:`sampled_params`: open it where a framework begins a step, close it before the update)."""
        self._begin_sample(perturb=self._perturbs_in_step or not train, train=train)

    def end_sample(self, discard: bool = False) -> None:
        """Restore μ. With ``train=True`` the gradients now in ``p.grad`` are one MC sample for ``step()``,
        unless ``discard``: then the sample is dropped and its noise rolled back, as if never drawn (what a
        framework should do when the forward or backward pass raised).

        The parameters must not be changed while the sample is open (``model.load_state_dict()``,
        ``model.double()``, in-place writes): restoring μ would undo the change, so it is refused: μ is
        restored, the sample discarded, and a RuntimeError names the parameter (:mod:`.sample_guard`; a
        warning where the sample is discarded anyway). Make such changes between steps."""
        if not self._in_sample:
            raise RuntimeError(
                f"{type(self).__name__}.end_sample(): no sample is open (begin_sample() first)"
            )
        self._end_sample(discard=discard)

    @property
    def in_sample(self) -> bool:
        """True between :meth:`begin_sample` and :meth:`end_sample` (or inside ``sampled_params()``)."""
        return self._in_sample

    def _begin_sample(self, *, perturb: bool, train: bool, keep_grad_refs: bool = False) -> None:
        if self._in_sample:
            raise RuntimeError(
                "a posterior sample is already open: sampled_params() blocks cannot be nested, and "
                "begin_sample() needs end_sample() first (end_sample(discard=True) after an error)"
            )
        mixed_precision.check_dtypes(self)  # a model.double() after a step: named, not a KeyError in a draw
        checkpoint = self.noise_source.checkpoint()  # a discarded sample rolls back to here
        self._backward_done = False
        if perturb:
            draw(self, train)  # on error: parameters and noise as before
            self._bound = sample_guard.bound(self._means, self._thetas)
        self._in_sample = True  # plugins see the sample (mean_of gives μ)
        plugins = contextlib.ExitStack()
        try:
            for plugin in self.plugins:
                plugins.enter_context(plugin.scope(train=train))
        except BaseException:
            plugins.close()
            self._in_sample = False
            if perturb:
                self._restore()
            self._sqrt_prec.clear()
            self.noise_source.rollback(checkpoint)
            raise
        if train and self._rng_checkpoint is None:
            self._rng_checkpoint = checkpoint
        if train and self.skip_nonfinite:
            self._buffer_guard.begin_sample()
        self._open_sample = _OpenSample(train, perturb, keep_grad_refs, checkpoint, plugins)

    def _end_sample(self, *, discard: bool, error: BaseException | None = None) -> None:
        sample, self._open_sample = self._open_sample, None
        keep = sample.train and not discard
        exc = (None, None, None) if error is None else (type(error), error, error.__traceback__)
        try:
            try:  # in the plugins' scope (the hooks' records): ĥ at θ, then ĝ (and the rest) at μ
                try:
                    if sample.perturb:  # a change to the parameters since the draw: refused, not undone
                        sample_guard.check(self, discard=discard or error is not None)
                    if keep and self._curvature_reads_sample:
                        self.accumulator.add_sample(self, sample.keep_grad_refs)
                finally:
                    self._in_sample = False
                    if sample.perturb:
                        self._restore()
                if keep and not self._curvature_reads_sample:
                    self.accumulator.add_sample(self, sample.keep_grad_refs)
            finally:
                sample.plugins.__exit__(*exc)
        except BaseException:
            discard = True
            raise
        finally:
            self._sqrt_prec.clear()
            if sample.train and self.skip_nonfinite:
                self._buffer_guard.end_sample(discard)
            if discard:
                self._rollback_sample(sample)

    def _rollback_sample(self, sample: _OpenSample) -> None:
        """The noise as before ``sample``'s draw; the earlier pending samples stay."""
        self.noise_source.rollback(sample.checkpoint)
        if self._rng_checkpoint is sample.checkpoint:
            self._rng_checkpoint = None

    @torch.no_grad()
    def _restore(self) -> None:
        in_place = {p for b in self._in_place for p in b.params}
        for p, mean in self._means.items():  # μ never left its tensors: rebind (see perturbation)
            if p not in in_place:
                p.data = mean
        for b in self._in_place:
            flat.restore(b)
        self._in_place.clear()
        self._means.clear()  # per tensor, θ's tensors are freed: the update's temporaries can use the memory
        self._thetas.clear()
        self._bound = {}

    # -- backward, accumulation and the step --------------------------------------------------------------
    def backward(self, loss: Tensor, output: Tensor | None = None) -> None:
        """The backward pass of one posterior sample, as this optimizer needs it (a graph for
        Hessian-vector products, sampled targets for the true Fisher): closures that call it instead of
        ``loss.backward()`` work with every trainer."""
        run_backward(self, loss, output)

    def _discard_pending(self) -> None:
        self.accumulator.clear()
        self._buffer_guard.discard_all()
        if self._rng_checkpoint is not None:
            self.noise_source.rollback(self._rng_checkpoint)
            self._rng_checkpoint = None

    def step(self, closure: Callable[[], Any] | None = None) -> Tensor | None:
        """One update from ``mc_samples`` posterior samples (closure form) or from the pending samples
        collected with ``sampled_params(train=True)`` (manual form). Returns the mean loss."""
        if self._in_sample:
            raise RuntimeError("step() was called inside sampled_params(); call it after the with-block")
        self._read_checks(wait=False)  # the device path: earlier steps' flags that have arrived
        pending = self.accumulator.count
        if closure is None:
            if 0 < pending < self.mc_samples and not self.__dict__.get("_few_samples_warned"):
                self._few_samples_warned = True
                warnings.warn(
                    f"{type(self).__name__}.step() got {pending} posterior sample(s), fewer than "
                    f"mc_samples={self.mc_samples}: in the manual form each sampled_params(train=True) "
                    "block (or begin_sample/end_sample pair) is one sample; open mc_samples of them before "
                    "step(), or pass a closure (warned once)",
                    UserWarning,
                    stacklevel=2,
                )
            if pending == 0:
                if self._perturbs_in_step:
                    raise RuntimeError(
                        f"{type(self).__name__}.step() needs gradients at posterior samples: pass a closure, "
                        "`opt.step(closure)`, or first run `with opt.sampled_params(train=True): ...`"
                    )
                self._begin_sample(perturb=False, train=True)
                self._end_sample(discard=False)
            return self._finish(None)
        if pending:
            raise RuntimeError(
                f"step(closure) was called with {pending} pending sample(s) from sampled_params(train=True); "
                "call step() without a closure to use them"
            )
        losses = []
        try:
            for _ in range(self.mc_samples):
                keep = self.mc_samples == 1
                self._begin_sample(perturb=self._perturbs_in_step, train=True, keep_grad_refs=keep)
                try:
                    with torch.enable_grad():
                        result = closure()
                    losses.append(closure_loss(self, result))
                except BaseException as err:
                    self._end_sample(discard=True, error=err)
                    raise
                self._end_sample(discard=False)
        except BaseException:
            self._discard_pending()
            raise
        return self._finish(losses[0] if len(losses) == 1 else torch.stack(losses).mean())

    def _finish(self, loss: Tensor | None) -> Tensor | None:
        acc = self.accumulator
        sums = acc.sums(self.param_groups)
        acc.reduce(sums, independent=self.rank_noise == "independent", local=self._estimator_flag("local"))
        if not sums and self._all_trainable():
            self._discard_pending()
            raise RuntimeError(
                f"{type(self).__name__}.step(): no parameter has a gradient, so there is nothing to update "
                "(the step count and the noise are left as they were). Does the closure call "
                "loss.backward() or opt.backward(loss, output)?"
            )
        bad = self._flag_on_device(sums, loss) if use_device_check(self) else None
        if bad is None and not acc.all_finite(sums, loss):
            message = acc.nonfinite_message(type(self).__name__, sums, self.param_groups, loss)
            self._discard_pending()
            if self.skip_nonfinite:
                self.skipped_steps += 1
                return loss
            raise NonFiniteGradientError(message)
        with torch.no_grad(), contextlib.ExitStack() as masks:
            acc.mean_(sums)
            plan = GroupUpdate()
            scopes = {id(g): g.get("region", i) for i, g in enumerate(self.param_groups)}
            for s in sums:
                scope = scopes[id(s.group)]
                if s.bucket is not None:
                    self._update_bucket(s, bad, plan, scope, masks)
                    continue
                states = [self.state[p] for p in s.params]
                for state in states:
                    state["step"] += 1
                for part in slices(s.params, self._elementwise and not self.compile):
                    means = TensorList(mixed_precision.mean(self, p) for p in s.params[part])
                    grads = TensorList(t.detach() for t in s.grads.tensors[part])
                    curvs = None if s.curvs is None else TensorList(s.curvs.tensors[part])
                    if bad is not None:
                        written = _written(s.params[part], means, states[part])
                        masks.enter_context(masked(written, bad, states[part]))
                    update = functools.partial(self._update, s.group, means, grads, curvs, states[part])
                    plan.add(scope, update)
                    plan.then(functools.partial(mixed_precision.write_back, self, s.params[part]))
            plan.run()
        acc.clear()
        if bad is None:
            self._buffer_guard.commit()
        else:
            self._buffer_guard.commit_unless(bad)
        self._rng_checkpoint = None
        self.num_steps += 1
        _eb.after_step(self)  # a no-op unless empirical_bayes= is set
        _diagnostics.after_step(self)  # warns once if the variance is frozen or at the float limits
        return loss

    def _update_bucket(self, s: Any, bad: Tensor | None, plan: GroupUpdate, scope: Any, masks: Any) -> None:
        """The rule's update on a bucket's flat tensors, as on one parameter (:mod:`.flat`)."""
        b = s.bucket
        b.gather()
        b.state["step"] += 1
        if bad is not None:
            masks.enter_context(masked(b.written(), bad))
        update = functools.partial(self._update, s.group)
        flat.update(b, update, s.grads[0], s.curvs, self.compile, plan=plan, scope=scope)
        plan.then(b.write_back)
        plan.then(b.sync_state)

    def _flag_on_device(self, sums: list[Any], loss: Tensor | None) -> Tensor:
        """The device path's check (:mod:`.device_check`): a 0-dim bool on the device, True when any ĝ, ĥ
        or the loss of this step is non-finite on any rank; the per-tensor flags go to the host unread."""
        checked = [t for s in sums for part in s.per_param() for t in part]
        checked += [] if loss is None else [loss.detach().reshape(1)]
        flags = nonfinite_flags(checked)
        bad = agreed(flags.any())
        layout = [(s.group, s.params, s.curvs is not None) for s in sums]

        def describe(indices: list[int]) -> list[str]:
            places = []
            for group, params, has_curvs in layout:
                gi = next(i for i, g in enumerate(self.param_groups) if g is group)
                for what in ("gradient", "curvature") if has_curvs else ("gradient",):
                    for p in params:
                        j = next(i for i, q in enumerate(group["params"]) if q is p)
                        places.append(
                            f"the {what} of param_groups[{gi}]['params'][{j}] (shape {tuple(p.shape)})"
                        )
            places += ["the loss"] if loss is not None else []
            return [places[i] if i < len(places) else "another rank" for i in indices]

        self._pending_checks.record(
            self.num_steps, torch.cat([flags, bad.reshape(1) & ~flags.any()]), describe
        )
        return bad

    def check_finite(self) -> None:
        """Wait for the device path's pending checks (:mod:`.device_check`) and act on them: raise
        ``NonFiniteGradientError`` for a masked step (or count it, with ``skip_nonfinite=True``). A no-op on
        the host path, where every step was checked when it ran."""
        self._read_checks(wait=True)

    def _read_checks(self, wait: bool, loading: bool = False) -> None:
        """Act on the device path's flags that have arrived (all of them with ``wait``): a masked step raises
        (its pending samples discarded first, so a caught error never leaves a sample of this step behind)
        or, with ``skip_nonfinite=True``, is counted as skipped; when ``loading`` a state that replaces
        the masked one, it is a warning."""
        found = self._pending_checks.arrived(wait)
        if not found:
            return
        if self.skip_nonfinite:
            self.skipped_steps += len(found)
            return
        step, places = found[0]
        more = f" ({len(found) - 1} later step(s) too)" if len(found) > 1 else ""
        what = f"{type(self).__name__}: step {step + 1} had a non-finite value in {', '.join(places)}{more}. "
        masked_note = (
            "That update was masked on the device: μ and the optimizer state kept their values (the steps "
            "queued after it were applied)."
        )
        if loading:
            replaced = " The state being loaded replaces it."
            warnings.warn(what + masked_note + replaced, RuntimeWarning, stacklevel=3)
            return
        pending = self.accumulator.count
        self._discard_pending()
        dropped = f" The {pending} pending posterior sample(s) were discarded." if pending else ""
        advice = (
            " Check the loss for NaN/Inf, lower the learning rate or the initial variance (init_prec), or "
            "pass skip_nonfinite=True to skip such steps."
        )
        raise NonFiniteGradientError(what + masked_note + dropped + advice)

    # -- the posterior -------------------------------------------------------------------------------------
    def set_prior(self, prior: Any, model: Any = None) -> None:
        """Train on under ``prior`` (a posterior, e.g. the last task's ``opt.posterior()``, or a saved
        file) instead of the scalar N(0, I/λ); ``None`` goes back to the scalar prior. The KL term then
        pulls towards the prior's mean with its per-weight precision (:mod:`.posterior_prior`)."""
        if not self._takes_posterior_prior:
            raise TypeError(
                f"{type(self).__name__} does not take a posterior as its prior (yet); the diagonal rules "
                "(Vadam, Vprop, VON, VOGN, IVON, NoisyAdam, BAdam) and NNGFull do"
            )
        posterior_prior.set_diagonal_prior(self, prior, model)

    def diagnostics(self) -> _diagnostics.Diagnostics:
        """Is the variance being learned? Moved precisions, σ and SNR quantiles (ngvi.optim.diagnostics)."""
        self.check_finite()
        return _diagnostics.report(self)

    @torch.no_grad()
    def posterior(self) -> DiagonalGaussian:
        """A snapshot of q = N(μ, σ²) over the trainable parameters, in parameter order (point estimates:
        σ² = 0). Frozen parameters (``requires_grad=False``) are fixed, not random: they are left out, as by
        every ngvi optimizer, and get no state. Under FSDP2 it gathers the shards into whole tensors on every
        rank: call it on all ranks."""
        self.check_finite()
        means, variances, point = [], [], []
        for group in self.param_groups:
            params = self.trainable(group)
            if not params:
                continue
            states = [self.state_of(group, p) for p in params]
            for p, precision in zip(params, self._precision(group, states), strict=True):
                if self.point_estimate(p):
                    point.append(len(means))
                    variances.append(torch.zeros_like(precision))
                else:
                    variances.append(precision.reciprocal())
                means.append(self.mean_of(p))
                if sharded.is_sharded(p):
                    means[-1], variances[-1] = (sharded.whole(p, t) for t in (means[-1], variances[-1]))
        return DiagonalGaussian(means, variances, point=point)


def _written(params: list[Tensor], means: TensorList, states: list[dict[str, Any]]) -> list[Tensor]:
    """What an update may write: μ, every tensor in the parameters' state, and a promoted parameter (which
    receives its rounded master)."""
    out = [*means, *(v for st in states for v in st.values() if isinstance(v, Tensor))]
    return out + [p.detach() for p, st in zip(params, states, strict=True) if "master" in st]
