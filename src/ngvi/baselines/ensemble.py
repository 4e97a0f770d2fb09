r"""Deep ensembles (Lakshminarayanan et al. 2017): K networks trained as MAP from independent inits.

Each member is the :class:`~ngvi.baselines.MAP` estimate of the same model — Adam on
f(θ) + (λ/2N)‖θ‖², i.e. ``torch.optim.Adam(weight_decay=prior_prec / data_size)`` — from its own
initialisation, on the same minibatches. The predictive is the uniform mixture of the K networks: the
reference a user would reach for instead of a variational posterior.

**One model, K sets of weights.** The ensemble keeps each member's trainable parameters as its own tensors
(K copies) with its own Adam state (2 tensors per parameter, K times); the model's parameters are the slot a
member is loaded into for a forward pass, and outside :meth:`DeepEnsemble.step` and
:meth:`DeepEnsemble.sampled_params` they hold member 0's weights. Memory is therefore K× MAP's (plus the
model's own copy), and each step runs the closure K times: an ensemble costs K× a single network in
memory and compute. Frozen parameters (``requires_grad=False``) and buffers (BatchNorm running statistics)
are not per member: the members share the model's own.

**Initialisation.** Member 0 keeps the model's weights as they are; member k ≥ 1 is the model
re-initialised by every module's ``reset_parameters()`` (or by ``init(model)``) under its own seed, drawn
from ``seed``. The global RNG and the model's buffers are left as they were.

**Training.** ``step(closure)`` loads each member in turn and calls the closure (which zeroes the
gradients, computes the mean minibatch NLL and calls ``backward``), so every member sees the same batch;
all K gradients are checked before any member moves (a NaN in one member's gradient changes nothing), then
each member's Adam steps. It returns the members' mean loss. There is no closure-free form: a step must
visit every member.

**Sampling.** ``sampled_params()`` loads the members **in turn** (a cycle, not random draws), so S
consecutive samples use every member ⌊S/K⌋ or ⌈S/K⌉ times, and exactly m times when S = K·m:
``ngvi.predict(model, ens, x, samples=K)`` is the ensemble's predictive with no Monte Carlo error. The
cycle's position is part of the state (``state_dict``). ``posterior()`` raises: the ensemble is a mixture
of point masses, not a Gaussian.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .. import _validation as check
from ..optim.diagnostics import Diagnostics
from ..optim.engine.optimizer import NonFiniteGradientError
from .map import MAP

__all__ = ["DeepEnsemble"]

#: the key that marks a DeepEnsemble's state_dict
_STATE_KEY = "deep_ensemble"


class DeepEnsemble:
    """K members trained as MAP (Adam with weight decay λ/N), each from its own initialisation.

    Args:
        model: the network (an ``nn.Module``: members 1..K−1 are re-initialised through its modules).
        data_size: N, the number of training examples (the closure returns a mean over a minibatch).
        members: K, the number of networks.
        lr, betas, eps: each member's Adam's.
        prior_prec: λ of the prior N(0, I/λ), as weight decay λ/N (as :class:`~ngvi.baselines.MAP`).
        seed: seeds the inits of members 1..K−1 (None: drawn from torch's global generator).
        init: ``init(model)`` re-initialises the model's parameters in place (run under each member's
            seed); default: ``reset_parameters()`` of every module that has one.
        mc_samples: 1 (accepted for the shared vocabulary; a member is a point estimate).

    ``param_groups`` are member 0's; each step copies their hyperparameters (``lr``, ``prior_prec``,
    ``data_size``, ...) to every member, so a schedule that sets them drives the whole ensemble. Memory: K
    copies of the trainable parameters and K Adam states (3K× the parameters, plus the model's own), and K
    gradients during a step; compute: K forward and backward passes per step.

    Raises:
        ValueError: for a bad argument, a model whose parameters some module cannot re-initialise, or an
            init that gives a member the same weights as member 0.
    """

    #: its samples are distinct networks; predict(vectorize=True) must go through sampled_params()
    deterministic = False
    samples_by_loading = True

    @classmethod
    def builds_from_model(cls, **options: Any) -> bool:
        """True: the ensemble takes the model, to re-initialise it for each member."""
        return True

    def __init__(
        self,
        model: nn.Module,
        data_size: int,
        members: int = 5,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        prior_prec: float = 1.0,
        eps: float = 1e-8,
        seed: int | None = None,
        init: Callable[[nn.Module], Any] | None = None,
        mc_samples: int = 1,
    ):
        check.model(model, "DeepEnsemble", "so that it can re-initialise each member")
        k = check.positive_int("members", members)
        if check.positive_int("mc_samples", mc_samples) != 1:
            raise ValueError(
                f"DeepEnsemble's members are point estimates: mc_samples must be 1, got {mc_samples!r}; "
                "use members= for more networks"
            )
        if init is not None and not callable(init):
            raise TypeError(f"init must be a callable init(model) or None, got {type(init).__name__}")
        self.mc_samples = 1
        base_seed = check.seed(seed)
        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self._params:
            raise ValueError("model has no trainable parameters")
        names = {id(p): n for n, p in model.named_parameters()}
        self._names = [names[id(p)] for p in self._params]
        if init is None:
            _check_resettable(model, self._params)
        weights = [[p.detach().clone() for p in self._params]]
        weights += _reinitialised(model, self._params, init or _reset_all, base_seed, k - 1)
        for j in range(1, k):
            if all(torch.equal(a, b) for a, b in zip(weights[0], weights[j], strict=True)):
                raise ValueError(
                    f"member {j}'s initial weights equal member 0's: the model's init is deterministic, so "
                    "the members would train identically; pass init= that draws random weights"
                )
        self._weights = [[w.requires_grad_(True) for w in ws] for ws in weights]
        self._members = [
            MAP(ws, data_size, lr=lr, betas=betas, prior_prec=prior_prec, eps=eps) for ws in self._weights
        ]
        self.seed = base_seed
        self._cursor = 0
        self._num_steps = 0
        self._stepping = False
        self._open_sample: Any = None

    # -- the ensemble -------------------------------------------------------------------------------------
    @property
    def members(self) -> int:
        """K, the number of networks."""
        return len(self._members)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Member 0's parameter groups: their hyperparameters are copied to every member at each step."""
        return self._members[0].param_groups

    @property
    def num_steps(self) -> int:
        """The number of steps taken (each trains every member once)."""
        return self._num_steps

    def member_weights(self, k: int) -> list[Tensor]:
        """Member k's trainable weights (clones), in ``model.parameters()`` order."""
        return [w.detach().clone() for w in self._weights[self._index(k)]]

    @contextlib.contextmanager
    def member(self, k: int) -> Iterator[None]:
        """Hold member k's weights in the model for the block; member 0's are put back on exit."""
        k = self._index(k)
        try:
            self._load(k)
            yield
        finally:
            self._load(0)

    def _index(self, k: Any) -> int:
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < self.members:
            raise ValueError(f"member must be an int in [0, {self.members}), got {k!r}")
        return k

    @torch.no_grad()
    def _load(self, k: int) -> None:
        for p, w in zip(self._params, self._weights[k], strict=True):
            p.copy_(w)

    # -- training -----------------------------------------------------------------------------------------
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Train every member on the closure's batch; returns the members' mean loss.

        Raises a RuntimeError for a member whose closure computed no gradient and
        :class:`~ngvi.NonFiniteGradientError` for a NaN/Inf loss or gradient; either way no member moves."""
        if closure is None:
            raise RuntimeError(
                "DeepEnsemble.step() needs a closure: it runs it once per member (zero_grad, loss, "
                "opt.backward(loss, output)), so every member trains on the same batch"
            )
        if self.in_sample:
            raise RuntimeError("DeepEnsemble.step() inside an open sample: call end_sample() first")
        self._sync_hyperparameters()
        losses: list[Any] = []
        self._stepping = True
        try:
            for k, weights in enumerate(self._weights):
                self._load(k)
                with torch.enable_grad():
                    result = closure()
                loss = result[0] if isinstance(result, tuple | list) else result
                losses.append(loss.detach() if isinstance(loss, Tensor) else loss)
                for p, w in zip(self._params, weights, strict=True):  # the gradient moves to its member
                    w.grad, p.grad = p.grad, None
                self._check_member(k, losses[-1])
        except BaseException:
            self._clear_gradients()
            for p in self._params:
                p.grad = None
            raise
        finally:
            self._stepping = False
            self._load(0)
        for member in self._members:
            member.step()
        self._clear_gradients()
        self._load(0)
        self._num_steps += 1
        if any(loss is None for loss in losses):
            return None
        return torch.stack([torch.as_tensor(loss) for loss in losses]).mean()

    def _sync_hyperparameters(self) -> None:
        """Copy member 0's group hyperparameters (a schedule sets them there) to every member."""
        lead = self._members[0].param_groups
        for member in self._members[1:]:
            for src, dst in zip(lead, member.param_groups, strict=True):
                dst.update({key: value for key, value in src.items() if key != "params"})

    def _check_member(self, k: int, loss: Any) -> None:
        weights = self._weights[k]
        if all(w.grad is None for w in weights):
            raise RuntimeError(
                f"DeepEnsemble.step(): member {k}'s closure left no gradient, so no member was updated. "
                "Does the closure call loss.backward() or opt.backward(loss, output)?"
            )
        bad = [
            name
            for name, w in zip(self._names, weights, strict=True)
            if w.grad is not None and not bool(torch.isfinite(w.grad).all())
        ]
        if isinstance(loss, Tensor) and not bool(torch.isfinite(loss).all()):
            bad.insert(0, "the loss")
        if bad:
            raise NonFiniteGradientError(
                f"DeepEnsemble: member {k} has a non-finite gradient in {', '.join(bad)}. No member was "
                "updated. Check the loss for NaN/Inf or lower the learning rate."
            )

    def _clear_gradients(self) -> None:
        for weights in self._weights:
            for w in weights:
                w.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients (and, outside a step, the members')."""
        for p in self._params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()
        if not self._stepping:
            self._clear_gradients()

    def backward(self, loss: Tensor, output: Tensor | None = None) -> None:
        """``loss.backward()``: the uniform backward of every ngvi trainer (see ``PosteriorOptimizer``)."""
        loss.backward()

    # -- sampling -----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def sampled_params(self, train: bool = False) -> Iterator[None]:
        """The next member in the cycle, held in the model for the block (member 0 is put back on exit).
        ``train`` is accepted for the ngvi API; training goes through ``step(closure)``."""
        k = self._cursor
        self._cursor = (k + 1) % self.members
        with self.member(k):
            yield

    def begin_sample(self, train: bool = False) -> None:
        """The callback form of :meth:`sampled_params` (as :meth:`ngvi.VariationalOptimizer.begin_sample`)."""
        if self.in_sample:
            raise RuntimeError("a sample is already open: call end_sample() first")
        scope = self.sampled_params(train=train)
        scope.__enter__()
        self._open_sample = scope

    def end_sample(self, discard: bool = False) -> None:
        """Close the sample (member 0 back in the model); ``discard`` also drops its gradients."""
        if not self.in_sample:
            raise RuntimeError("DeepEnsemble.end_sample(): no sample is open (begin_sample() first)")
        scope, self._open_sample = self._open_sample, None
        scope.__exit__(None, None, None)
        if discard:
            self.zero_grad()

    @property
    def in_sample(self) -> bool:
        return self._open_sample is not None

    def posterior(self):
        raise NotImplementedError(
            "DeepEnsemble's predictive is a uniform mixture of its members' networks, not a Gaussian; draw "
            "from it with sampled_params() or ngvi.predict(model, ens, x, samples=S) (S a multiple of "
            "members uses each member equally)"
        )

    def diagnostics(self) -> Diagnostics:
        """Steps and data size; point estimates have no variance to report (those fields are None)."""
        return Diagnostics(
            optimizer="DeepEnsemble",
            steps=self._num_steps,
            skipped_steps=0,
            data_size=[int(g["data_size"]) for g in self.param_groups],
        )

    # -- checkpoints --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every member's weights and Adam state, the cycle's position and the step count."""
        if self.in_sample:
            raise RuntimeError("DeepEnsemble.state_dict() inside an open sample: call end_sample() first")
        return {
            _STATE_KEY: {
                "members": self.members,
                "cursor": self._cursor,
                "num_steps": self._num_steps,
                "seed": self.seed,
            },
            "weights": [[w.detach() for w in ws] for ws in self._weights],
            "optimizers": [member.state_dict() for member in self._members],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; a state of another trainer or shape is refused, unchanged."""
        meta = state.get(_STATE_KEY) if isinstance(state, dict) else None
        if not isinstance(meta, dict) or not {"weights", "optimizers"} <= set(state):
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(
                f"not a DeepEnsemble state_dict (got {keys}); pass the dict that DeepEnsemble.state_dict() "
                "returned"
            )
        sizes = {meta.get("members"), len(state["weights"]), len(state["optimizers"])}
        if sizes != {self.members}:
            raise ValueError(
                f"the state has {meta.get('members')} members, this DeepEnsemble {self.members}; build it "
                f"with members={meta.get('members')}"
            )
        for k, ws in enumerate(state["weights"]):
            shapes = [(tuple(w.shape), w.dtype) if isinstance(w, Tensor) else type(w).__name__ for w in ws]
            ours = [(tuple(p.shape), p.dtype) for p in self._params]
            if shapes != ours:
                raise ValueError(
                    f"member {k}'s weights in the state have shapes/dtypes {shapes}, the model's trainable "
                    f"parameters {ours}: load it into the model it was saved from"
                )
        backup = copy.deepcopy([member.state_dict() for member in self._members])
        try:
            for member, opt_state in zip(self._members, state["optimizers"], strict=True):
                member.load_state_dict(opt_state)
        except Exception:
            for member, opt_state in zip(self._members, backup, strict=True):
                member.load_state_dict(opt_state)
            raise
        with torch.no_grad():
            for ws, saved in zip(self._weights, state["weights"], strict=True):
                for w, v in zip(ws, saved, strict=True):
                    w.copy_(v)
        self._cursor = int(meta["cursor"]) % self.members
        self._num_steps = int(meta["num_steps"])
        self.seed = meta.get("seed", self.seed)
        self._load(0)

    def __repr__(self) -> str:
        group = self.param_groups[0]
        return (
            f"DeepEnsemble(members={self.members}, lr={group['lr']}, prior_prec={group['prior_prec']}, "
            f"data_size={group['data_size']})"
        )


# ------------------------------------------------------------------------------------------------------------
# Initialising the members
# ------------------------------------------------------------------------------------------------------------
def _reset_all(model: nn.Module) -> None:
    for module in model.modules():
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()


def _check_resettable(model: nn.Module, params: Sequence[Tensor]) -> None:
    """Every trainable parameter must belong to a module with ``reset_parameters()``, or the members would
    share its init."""
    covered: set[int] = set()
    for module in model.modules():
        if callable(getattr(module, "reset_parameters", None)):
            covered.update(id(p) for p in module.parameters(recurse=False))
    names = {id(p): n for n, p in model.named_parameters()}
    missing = [names[id(p)] for p in params if id(p) not in covered]
    if missing:
        raise ValueError(
            f"DeepEnsemble re-initialises members with each module's reset_parameters(), but {missing} "
            "belong to modules without one; add reset_parameters() to them or pass init=fn (fn(model) "
            "re-initialises it in place, run under each member's seed)"
        )


@torch.no_grad()
def _reinitialised(
    model: nn.Module, params: Sequence[Tensor], init: Callable[[nn.Module], Any], seed: int, count: int
) -> list[list[Tensor]]:
    """``count`` sets of re-initialised weights of ``params``, each under its own seed drawn from ``seed``;
    the model's parameters (frozen ones too: the members share them), buffers and the global RNG are left as
    they were."""
    if count == 0:
        return []
    seeds = torch.randint(0, 2**62, (count,), generator=torch.Generator().manual_seed(seed)).tolist()
    kept = [(t, t.detach().clone()) for t in [*model.parameters(), *model.buffers()]]
    devices = sorted({p.device.index or 0 for p in params if p.device.type == "cuda"})
    out = []
    try:
        for member_seed in seeds:
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(member_seed)
                init(model)
            out.append([p.detach().clone() for p in params])
    finally:
        for t, value in kept:
            t.copy_(value)
    return out
