r"""ngvi under the Hugging Face Trainer (``pip install "ngvi[hf]"``): full fine-tuning or LoRA (PEFT).

The Trainer calls ``optimizer.step()`` without a closure, after its own backward passes, so an ngvi optimizer
needs its posterior sample opened around them: :class:`NGVICallback` does it for a stock ``Trainer`` (or
``SFTTrainer``, ...), :class:`VariationalTrainer` is a ``Trainer`` with it built in, plus the Bayesian model
average in ``evaluate()``/``predict()`` and ``posterior()``.

**One sample per optimizer step.** θ ~ q is drawn at ``on_step_begin`` and held across the
``gradient_accumulation_steps`` micro-batches, whose backward passes add their gradients at θ; the Trainer
clips that gradient (``max_grad_norm``) while the sample is still open, so clipping applies to the sample's
gradient; ``on_pre_optimizer_step`` restores μ and hands the gradient to the engine, and ``optimizer.step()``
(no closure) uses it. So k micro-batches of b are one step on a batch of k·b, to float precision.

**``mc_samples`` must be 1.** The Trainer runs each micro-batch once, so more samples per step cannot see the
same data; an optimizer with ``mc_samples > 1`` is refused at ``train()`` (average over more data with more
steps or a larger batch instead). The hook-based rules (VOGN, NoisyKFAC, NNGFull) need one backward pass per
sample, so they are refused with ``gradient_accumulation_steps > 1``.

**Weight decay** (``TrainingArguments.weight_decay``): the Trainer writes it into its parameter groups, where
it would replace an ngvi optimizer's prior without a word. :class:`VariationalTrainer` builds one group of
the trainable parameters instead and maps a nonzero value by rule (:func:`prior_kwargs`): IVON's
``weight_decay`` is δ = λ/N, the prior, so it becomes that (unless the optimizer's kwargs set one too: then
it refuses); every other rule has ``prior_prec=`` and refuses it. 0.0 (the default) changes nothing.
A given optimizer (``optimizers=(ngvi.X(...), None)``) is built already, with its own prior, and the
Trainer leaves it as it is: :class:`NGVICallback` refuses a nonzero value at ``train()`` unless IVON's
groups carry it (so neither path drops it), and warns when a stock Trainer's groups overrode IVON's
``weight_decay``.

**Resuming** (``train(resume_from_checkpoint=...)``): loading the optimizer's state replaces every
group's hyperparameters with the checkpoint's, as torch's ``load_state_dict`` does, so a changed
``data_size`` (or any other) would be dropped without a word. :class:`VariationalTrainer` refuses a resume
whose given hyperparameters differ from the checkpoint's, naming each: resume with the checkpoint's values,
or start a new run. (Refused rather than warned: a warning in the Trainer's log would still train on
values nobody asked for.) A stock Trainer has no hook between building and loading the optimizer, so
only :class:`VariationalTrainer` checks. A prior learned under ``empirical_bayes=`` is state, not a setting:
its key is not compared, the checkpoint's learned value is resumed, and ``TrainingArguments.weight_decay``
is checked against the δ IVON was built with rather than the learned one.

**The posterior travels with the model.** :meth:`VariationalTrainer.save_model` (and so the Trainer's
checkpoints) writes ``posterior.safetensors`` beside the weights, a full model's or a PEFT adapter's, with the
metadata :func:`ngvi.load_posterior` checks (parameter names, shapes, the rule and its hyperparameters);
:func:`load_with_posterior` loads a saved folder back as a model and a :class:`~ngvi.PosteriorSampler` for
:func:`ngvi.predict` and :func:`ngvi.uncertainty_report`.

**Errors.** :class:`VariationalTrainer` restores μ (and drops the sample, rolling its noise back) when
anything in ``train()`` raises, so the trainer and the optimizer stay usable. A stock Trainer has no hook for
that: :class:`NGVICallback` drops a sample left open by an error at the next ``on_train_begin``, and
:meth:`NGVICallback.close` does it on demand.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import Trainer, TrainerCallback

from ..artefacts import PosteriorSampler, posterior_of
from ..baselines.map import MAP
from ..optim.base import VariationalOptimizer
from ..optim.engine import empirical_bayes
from ..optim.ivon import IVON
from ..posterior import GaussianPosterior
from ..posterior.io import load_posterior
from ..protocol import unwrap

__all__ = [
    "POSTERIOR_FILE",
    "LoadedModel",
    "NGVICallback",
    "VariationalTrainer",
    "load_with_posterior",
    "next_token_labels",
    "prior_kwargs",
]

IGNORE_INDEX = -100  # Hugging Face's label of positions that do not count
#: the posterior's file name in a saved model's folder, beside the weights
POSTERIOR_FILE = "posterior.safetensors"


def sampling_optimizer(optimizer: Any) -> Any:
    """The ngvi optimizer inside ``optimizer`` (accelerate wraps it), with begin_sample/end_sample."""
    opt = unwrap(optimizer)
    if not hasattr(opt, "begin_sample"):
        raise TypeError(
            f"{type(opt).__name__} has no begin_sample()/end_sample(): the Hugging Face integration needs an "
            "ngvi optimizer (optimizers=(ngvi.IVON(...), None) or optimizer_cls_and_kwargs)"
        )
    return opt


def check_training(opt: Any, gradient_accumulation_steps: int) -> None:
    """Refuse what one sample per optimizer step cannot do (see the module docstring)."""
    name = type(opt).__name__
    if getattr(opt, "mc_samples", 1) != 1:
        raise ValueError(
            f"{name}(mc_samples={opt.mc_samples}) under the Hugging Face Trainer: the Trainer runs each "
            "micro-batch once, so one posterior sample is taken per optimizer step (held across the "
            "gradient-accumulation micro-batches); pass mc_samples=1"
        )
    if getattr(opt, "takes_model", False) and gradient_accumulation_steps > 1:
        raise ValueError(
            f"{name} reads per-example curvature from one backward pass per sample, so it cannot accumulate "
            f"gradients over micro-batches: set gradient_accumulation_steps=1 (got "
            f"{gradient_accumulation_steps}) or use a parameter-based rule (IVON, Vadam)"
        )


class NGVICallback(TrainerCallback):
    """Opens one posterior sample per optimizer step of a stock ``Trainer``: add it with
    ``Trainer(..., optimizers=(ngvi.IVON(model.parameters(), N), None), callbacks=[NGVICallback()])``."""

    def __init__(self) -> None:
        self._opt: Any = None

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        # Two callbacks would both open a sample at each step and fail there; the TrainerState is new at
        # every train(), so a mark on it finds a second callback of this run (and no stale one).
        owner = getattr(state, "_ngvi_callback", None)
        if owner is not None and owner is not self:
            raise ValueError(
                "this Trainer has two NGVICallbacks, and each would open a posterior sample at every step: "
                "keep one (a VariationalTrainer has its own built in: pass it no NGVICallback)"
            )
        state._ngvi_callback = self
        opt = self._opt = sampling_optimizer(optimizer)
        self.close()  # a sample left open by an error in an earlier train()
        check_training(opt, args.gradient_accumulation_steps)
        check_weight_decay(opt, args.weight_decay)
        _warn_overridden_prior(opt)

    def on_step_begin(self, args, state, control, **kwargs):
        self._opt.begin_sample(train=True)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._opt.end_sample()  # after the Trainer's clipping: the clipped gradient is the sample's

    def on_train_end(self, args, state, control, **kwargs):
        self.close()
        if hasattr(self._opt, "check_finite"):  # the device check's last flags: a masked step is not lost
            self._opt.check_finite()

    def close(self) -> None:
        """Drop a sample that an error left open (μ restored, its noise rolled back); a no-op otherwise."""
        if self._opt is not None and self._opt.in_sample:
            self._opt.end_sample(discard=True)


def learned_keys(opt: Any) -> frozenset[str]:
    """The group keys the optimizer learns while it trains: the prior's key (IVON's ``weight_decay``,
    ``prior_prec``, ``prior_var``) under ``empirical_bayes=``. Such a value is state, like μ: it differs
    from the value the run started with after the first update, and a checkpoint carries the learned one."""
    if getattr(opt, "empirical_bayes", None) is None:
        return frozenset()
    key = empirical_bayes.prior_key(opt)
    return frozenset() if key is None else frozenset({key[0]})


def _warn_overridden_prior(opt: Any) -> None:
    if not isinstance(opt, IVON) or "weight_decay" in learned_keys(opt):
        return
    default = opt.defaults["weight_decay"]
    groups = [i for i, g in enumerate(opt.param_groups) if g["weight_decay"] != default]
    if groups:
        warnings.warn(
            f"IVON's parameter groups {groups} carry weight_decay "
            f"{sorted({opt.param_groups[i]['weight_decay'] for i in groups})} instead of the optimizer's "
            f"own {default}: the Trainer's groups (TrainingArguments.weight_decay) replaced IVON's prior. "
            "Use ngvi.integrations.hf.VariationalTrainer, or pass optimizers=(IVON(...), None)",
            UserWarning,
            stacklevel=2,
        )


def _refuse_weight_decay(name: str, weight_decay: float) -> None:
    raise ValueError(
        f"TrainingArguments(weight_decay={weight_decay}) has no meaning for {name}: its prior is "
        "prior_prec= in the optimizer kwargs; set weight_decay=0.0"
    )


def check_weight_decay(opt: Any, weight_decay: float) -> None:
    """Refuse a nonzero ``TrainingArguments.weight_decay`` that the optimizer's groups do not carry: the
    Trainer leaves a given optimizer (``optimizers=(opt, None)``) as it is, so it would be dropped. IVON
    carries it where :func:`prior_kwargs` mapped it (or the Trainer's own groups hold it); every other rule
    refuses it, as :func:`prior_kwargs` does."""
    if not weight_decay:
        return
    if not isinstance(opt, IVON):
        _refuse_weight_decay(type(opt).__name__, weight_decay)
    # under empirical_bayes= the groups hold the learned δ (a resumed run's differs from the start), so the
    # value the optimizer was built with is what the Trainer's must be
    learned = "weight_decay" in learned_keys(opt)
    values = [opt.defaults["weight_decay"]] if learned else [g["weight_decay"] for g in opt.param_groups]
    if all(v != weight_decay for v in values):
        own = sorted(set(values))
        raise ValueError(
            f"TrainingArguments(weight_decay={weight_decay}) would be dropped: the Trainer leaves the given "
            f"{type(opt).__name__} as it is, with its own prior weight_decay {own}; build it with "
            f"weight_decay={weight_decay}, or set TrainingArguments(weight_decay=0.0) to keep its own"
        )


def prior_kwargs(optimizer_cls: type, kwargs: dict[str, Any], weight_decay: float) -> dict[str, Any]:
    """The optimizer kwargs with ``TrainingArguments.weight_decay`` mapped by rule (module docstring)."""
    if not weight_decay:
        return dict(kwargs)
    name = optimizer_cls.__name__
    if not issubclass(optimizer_cls, IVON):
        _refuse_weight_decay(name, weight_decay)
    if kwargs.get("weight_decay") is not None or kwargs.get("prior_prec") is not None:
        raise ValueError(
            f"TrainingArguments(weight_decay={weight_decay}) and IVON's own weight_decay/prior_prec both set "
            "the prior: set one (TrainingArguments(weight_decay=0.0) keeps the optimizer's)"
        )
    return {**kwargs, "weight_decay": weight_decay}


class VariationalTrainer(Trainer):
    """A ``transformers.Trainer`` that trains with an ngvi optimizer (module docstring).

    Args:
        eval_samples: S > 0: ``evaluate()`` and ``predict()`` use the Bayesian model average, logits =
            log (1/S) Σₛ softmax(f(x; θₛ)), and the loss is its NLL (:meth:`bma_loss`); 0: the mean weights.
        causal_lm: the labels are the inputs, shifted inside the model (a causal LM): :meth:`bma_loss` shifts
            them too. None: a causal LM of transformers' auto mapping, or a class named "...ForCausalLM"
            (PEFT's wrapper: its base model's).
        *args, **kwargs: as for ``Trainer``; the optimizer comes from ``optimizers=(ngvi.X(...), None)`` or
            ``optimizer_cls_and_kwargs=(ngvi.X, {...})`` (one group of the trainable parameters).
    """

    def __init__(self, *args: Any, eval_samples: int = 0, causal_lm: bool | None = None, **kwargs: Any):
        if isinstance(eval_samples, bool) or not isinstance(eval_samples, int) or eval_samples < 0:
            raise ValueError(f"eval_samples must be an int >= 0, got {eval_samples!r}")
        super().__init__(*args, **kwargs)
        self.eval_samples = eval_samples
        self.causal_lm = is_causal_lm(self.model) if causal_lm is None else causal_lm
        self.ngvi_callback = NGVICallback()
        self.add_callback(self.ngvi_callback)

    @property
    def ngvi_optimizer(self) -> Any:
        """The ngvi optimizer (``trainer.optimizer`` is accelerate's wrapper of it during training)."""
        if self.optimizer is None:
            raise RuntimeError("no optimizer yet: train() creates it, or pass optimizers=(ngvi.X(...), None)")
        return sampling_optimizer(self.optimizer)

    def posterior(self) -> GaussianPosterior:
        """The optimizer's q over the trainable parameters (LoRA: the adapters')."""
        return self.ngvi_optimizer.posterior()

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The Trainer's ``save_model`` (the weights, or a PEFT model's adapter), then the posterior beside
        them (:meth:`save_posterior`). The Trainer's checkpoints go through here too.

        Args:
            output_dir: the folder (default ``args.output_dir``).
            _internal_call: the Trainer's own flag, passed on.
        """
        super().save_model(output_dir, _internal_call)
        self.save_posterior(output_dir)

    def save_posterior(self, output_dir: str | os.PathLike[str] | None = None) -> Path | None:
        """Write ``posterior.safetensors`` (:data:`POSTERIOR_FILE`) into ``output_dir``: the optimizer's q
        over the trainable parameters, named as the model names them (``ngvi.posterior_of``).

        Every process forms the posterior (a sharded one is gathered collectively); the process that saves
        (``args.should_save``) writes it.

        Args:
            output_dir: the folder (default ``args.output_dir``).

        Returns:
            The file written, or None where there is nothing to write: no optimizer yet, or one without a
            Gaussian posterior (MAP, MC dropout).
        """
        if self.optimizer is None:
            return None
        try:
            post = posterior_of(self.model, self.ngvi_optimizer)
        except NotImplementedError:  # a point estimate or MC dropout: no Gaussian to save
            return None
        if not self.args.should_save:
            return None
        folder = Path(self.args.output_dir if output_dir is None else output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        return post.save(folder / POSTERIOR_FILE)

    def create_optimizer(self, model: nn.Module | None = None):
        cls, kwargs = self.optimizer_cls_and_kwargs or (None, None)
        if self.optimizer is not None or not is_ngvi_trainer(cls):
            return super().create_optimizer(model)
        model = self.model if model is None else model
        kwargs = prior_kwargs(cls, kwargs or {}, self.args.weight_decay)
        trainable = [p for p in model.parameters() if p.requires_grad]
        params = model if cls.builds_from_model(**kwargs) else trainable
        self.optimizer = cls(params, **kwargs)
        return self.optimizer

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        # torch's load_state_dict replaces every group's hyperparameters with the checkpoint's: refuse a
        # resume whose given ones differ, rather than train on with values nobody asked for
        opt = None if self.optimizer is None or checkpoint is None else sampling_optimizer(self.optimizer)
        given = None if opt is None else group_settings(opt)
        super()._load_optimizer_and_scheduler(checkpoint)
        if opt is not None:
            check_resumed_settings(
                type(opt).__name__, given, group_settings(opt), checkpoint, learned=learned_keys(opt)
            )

    def train(self, *args: Any, **kwargs: Any):
        callbacks = self.callback_handler.callbacks
        extra = [cb for cb in callbacks if isinstance(cb, NGVICallback) and cb is not self.ngvi_callback]
        if extra:
            more = f"{len(extra)} more {'was' if len(extra) == 1 else 'were'} given"
            raise ValueError(
                f"VariationalTrainer opens its posterior samples with its own NGVICallback, and {more} "
                "(callbacks= or add_callback), which would open a second sample at every step: pass no "
                "NGVICallback to a VariationalTrainer (it is for a stock Trainer)"
            )
        if not any(cb is self.ngvi_callback for cb in callbacks):
            raise ValueError(
                "VariationalTrainer's NGVICallback was removed, so no posterior sample would be drawn: "
                "add it back with trainer.add_callback(trainer.ngvi_callback)"
            )
        try:
            return super().train(*args, **kwargs)
        except BaseException:
            self.ngvi_callback.close()  # μ back in the weights, the failed sample's noise rolled back
            raise

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        if self.eval_samples == 0:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        opt, log_probs, labels = self.ngvi_optimizer, [], None
        for _ in range(self.eval_samples):
            with opt.sampled_params(train=False):
                _, logits, labels = super().prediction_step(model, inputs, False, ignore_keys)
            logits = logits[0] if isinstance(logits, tuple | list) else logits
            log_probs.append(torch.log_softmax(logits.float(), -1))
        bma = torch.logsumexp(torch.stack(log_probs), 0) - math.log(self.eval_samples)
        loss = None if labels is None else self.bma_loss(bma, labels)
        return (loss, None, None) if prediction_loss_only else (loss, bma, labels)

    def bma_loss(self, log_probs: Tensor, labels: Tensor) -> Tensor:
        """Mean NLL of the labels under the BMA ``log_probs`` ([B, C] or token-level [B, T, V]; labels −100
        do not count; shifted by one position for a causal LM)."""
        if self.causal_lm and log_probs.dim() == 3:
            log_probs, labels = log_probs[:, :-1], labels[:, 1:]
        return F.nll_loss(log_probs.flatten(0, -2), labels.flatten().long(), ignore_index=IGNORE_INDEX)


def group_settings(opt: Any) -> list[dict[str, Any]]:
    """Each parameter group's hyperparameters (all but its parameters)."""
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


def check_resumed_settings(
    name: str,
    given: list[dict[str, Any]],
    loaded: list[dict[str, Any]],
    checkpoint: str,
    learned: frozenset[str] = frozenset(),
) -> None:
    """Refuse a resume whose given hyperparameters differ from the checkpoint's, naming each (module
    docstring). ``lr`` is the scheduler's (its base, ``initial_lr``, is compared) where a scheduler runs.
    ``learned``: keys the optimizer learns (:func:`learned_keys`): state, resumed as the checkpoint has it."""
    absent = "(absent)"
    diffs = []
    for i, (a, b) in enumerate(zip(given, loaded, strict=False)):
        for key in sorted(a.keys() | b.keys()):
            if key == "lr" and "initial_lr" in a and "initial_lr" in b:
                continue
            if key in learned:
                continue
            x, y = a.get(key, absent), b.get(key, absent)
            if not _same(x, y):
                where = f"group {i} " if len(given) > 1 else ""
                label = "lr" if key == "initial_lr" else key  # the lr the user gave
                diffs.append(f"{where}{label} given {x!r}, checkpoint {y!r}")
    if diffs:
        raise ValueError(
            f"resume_from_checkpoint={checkpoint!r}: the checkpoint's {name} hyperparameters would replace "
            f"the given ones ({'; '.join(diffs)}); pass the checkpoint's values to resume, or start a new "
            "run (no resume_from_checkpoint) to train with the new ones"
        )


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, Tensor) or isinstance(y, Tensor):
        return isinstance(x, Tensor) and isinstance(y, Tensor) and torch.equal(x.cpu(), y.cpu())
    if isinstance(x, tuple | list) and isinstance(y, tuple | list):  # betas may come back as a list
        return len(x) == len(y) and all(_same(u, v) for u, v in zip(x, y, strict=True))
    return bool(x == y)


def is_ngvi_trainer(cls: Any) -> bool:
    """True for an ngvi optimizer class or a baseline (MAP, MCDropout) that :class:`VariationalTrainer`
    builds itself, passing the model where ``cls.builds_from_model(**kwargs)`` says it takes one."""
    return isinstance(cls, type) and issubclass(cls, VariationalOptimizer | MAP)


def is_causal_lm(model: nn.Module) -> bool:
    """True for a model whose labels are its inputs, shifted inside (a causal LM, also under PEFT)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = {type(m).__name__ for m in (model, base)}
    return any("CausalLM" in n or n in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() for n in names)


def next_token_labels(input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """The labels of a causal LM's output positions, [B, T]: position t predicts token t+1; the last
    position, and positions whose next token is padding, are −100 (for :func:`ngvi.evaluate_classifier`).
    The labels are int64 whatever the ids' integer dtype (−100 does not fit uint8: it would wrap to 156)."""
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must be token ids (an integer tensor), got {input_ids.dtype}")
    labels = torch.full(input_ids.shape, IGNORE_INDEX, dtype=torch.int64, device=input_ids.device)
    labels[:, :-1] = input_ids[:, 1:]
    if attention_mask is not None:
        labels[:, :-1][attention_mask[:, 1:] == 0] = IGNORE_INDEX
    return labels


class LoadedModel(NamedTuple):
    """What :func:`load_with_posterior` gives back.

    ``model``: the network with the posterior mean μ in its weights (a ``PeftModel`` for an adapter), in
    eval mode; ``posterior``: the loaded :class:`~ngvi.GaussianPosterior`; ``sampler``: a
    :class:`~ngvi.PosteriorSampler` over both, the ``opt`` of :func:`ngvi.predict`,
    :func:`ngvi.evaluate_classifier` and :func:`ngvi.uncertainty_report`.
    """

    model: nn.Module
    posterior: GaussianPosterior
    sampler: PosteriorSampler


def load_with_posterior(
    folder: str | os.PathLike[str], model: nn.Module | None = None, *, seed: int | None = None, **kwargs: Any
) -> LoadedModel:
    """Load a model saved by :meth:`VariationalTrainer.save_model` and its posterior, ready for prediction.

    A folder with a PEFT adapter (``adapter_config.json``) is loaded onto ``model``, the base model it was
    trained on (``peft.PeftModel.from_pretrained``, adapters trainable, the base frozen); a folder with a full
    model is loaded by the class its ``config.json`` names (``config.architectures``), so ``model`` stays
    None, and the weights the posterior leaves out are frozen, as in training. The file's names and shapes
    are checked against the trainable parameters (an adapter on another base, with other layers or ranks,
    is refused) and μ is put into the weights.

        loaded = load_with_posterior("out", model=GPT2LMHeadModel.from_pretrained("base"), seed=0)
        samples = ngvi.predict(loaded.model, loaded.sampler, {"input_ids": ids}, samples=16)

    Args:
        folder: the saved folder, holding ``posterior.safetensors`` beside the weights.
        model: for an adapter, the base model (not a ``PeftModel``); None for a full model.
        seed: seeds the sampler's draws (None: unseeded).
        **kwargs: passed to ``from_pretrained`` (e.g. ``torch_dtype``).

    Returns:
        A :class:`LoadedModel`: ``(model, posterior, sampler)``.

    Raises:
        FileNotFoundError: ``folder`` has no ``posterior.safetensors``.
        ValueError: an adapter without its base model, a full model's folder with ``model`` given, a
            config that names no known architecture, or a posterior that does not match the model (its
            first difference named; also every refusal of :func:`ngvi.load_posterior`).
    """
    import transformers

    folder = Path(folder)
    path = folder / POSTERIOR_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{folder} has no {POSTERIOR_FILE}: save the model with VariationalTrainer.save_model (or write "
            f"one with ngvi.save_posterior(model, opt, {str(path)!r}))"
        )
    if (folder / "adapter_config.json").is_file():
        import peft

        if model is None or isinstance(model, peft.PeftModel):
            raise ValueError(
                f"{folder} holds a PEFT adapter: pass the base model it was trained on as model= (a plain "
                "transformers model, e.g. from_pretrained of the base), not None or a PeftModel"
            )
        # trainable adapters, a frozen base: as in training, so the posterior must cover exactly the adapters
        model = peft.PeftModel.from_pretrained(model, folder, is_trainable=True, **kwargs)
    elif model is not None:
        raise ValueError(
            f"{folder} holds a full model, which is loaded from its own weights: leave model=None (model= is "
            "the base model of a PEFT adapter)"
        )
    else:
        config = transformers.AutoConfig.from_pretrained(folder)
        names = list(getattr(config, "architectures", None) or [])
        cls = getattr(transformers, names[0], None) if names else None
        if cls is None:
            raise ValueError(
                f"{folder}/config.json names no model class this transformers has (architectures={names}): "
                "load the model yourself, then ngvi.load_posterior and ngvi.PosteriorSampler"
            )
        model = cls.from_pretrained(folder, **kwargs)
        # from_pretrained makes every weight trainable; those training froze are the ones the posterior
        # leaves out (its names must all be the model's: checked below, with the shapes)
        covered = set(load_posterior(path).names or [])
        if covered <= {name for name, _ in model.named_parameters()}:
            for name, p in model.named_parameters():
                p.requires_grad_(name in covered)
    posterior = load_posterior(path, model=model)  # names and shapes against the trainable parameters
    model.eval()
    return LoadedModel(model, posterior, PosteriorSampler(model, posterior, seed=seed))
