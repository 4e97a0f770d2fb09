"""One database of every ngvi trainer, for the tests that hold them all to the same guarantees.

In the spirit of PyTorch's ``OptimizerInfo`` (torch/testing/_internal/common_optimizers.py), written for ngvi:
each :class:`TrainerInfo` says how to build a trainer for a small problem, which closure it needs, what it
supports, and which bad arguments it refuses with which message. Tests parametrize over :data:`TRAINERS`
(or a filtered subset, :func:`trainers`) and ask the entry rather than special-casing names.

The facts below were read off the classes, not assumed:

* ``takes_model``: VOGN and NoisyKFAC hook the model's layers (class attribute ``takes_model``; NoisyAdam with
  ``curvature="ef"`` or ``"fisher"``, an instance attribute), BBVI hooks
  its Linear layers for the local reparameterisation, MCDropout finds its dropout modules; the others take
  ``model.parameters()`` (MAP takes either).
* ``add_param_group``: refused (ValueError) by the engine for ``takes_model`` classes (VOGN, NoisyKFAC);
  BBVI and MCDropout accept further groups (MCDropout builds its own, one per dropout rate).
* ``closure_style``: ``"backward"`` (``loss.backward()``), ``"create_graph"`` (VON's Hutchinson estimator
  takes a Hessian-vector product through the graph) or ``"output"`` (the true Fisher, ``curvature="fisher"``:
  return ``(loss, output)`` without calling backward; the engine samples targets first). Every trainer has
  ``opt.backward(loss, output)``, which does the right thing for all three.
* ``engine``: a :class:`ngvi.VariationalOptimizer`: ``seed=``, ``skip_nonfinite=``, ``num_steps``, and
  several ``sampled_params(train=True)`` blocks as the MC samples of one ``step()``. MAP and MCDropout are
  ``torch.optim.Adam`` underneath and have none of these: their ``sampled_params(train=True)`` block is one
  plain Adam gradient. Every trainer, these two included, raises ``NonFiniteGradientError`` for NaN/Inf
  gradients and a RuntimeError for a closure without backward, changing nothing.
* ``mc_samples``: BAdam (gradient at the mean) and MAP (a point estimate) refuse ``mc_samples != 1``.
* ``manual_form``: how to step without a closure. ``"samples"``: backward passes inside
  ``sampled_params(train=True)`` blocks, one MC sample each, then ``step()`` (BAdam's training block holds
  μ: its gradient is taken at the mean). ``"adam"`` (MAP, MC dropout):
  one backward pass (a block is allowed and changes nothing but dropout's mode), then ``step()``.
* ``posterior``: ``"diagonal"`` (DiagonalGaussian), ``"kronecker"`` (NoisyKFAC's KroneckerGaussian),
  ``"full"`` (NNGFull's FullGaussian), ``"blktri"`` (NNGBlkTri's BlockTridiagonalGaussian) or
  None: MAP's ``posterior()`` raises NotImplementedError (a point estimate, not a point-mass Gaussian) and so
  does MCDropout's (a mixture over masks). Their ``sampled_params()`` leaves the weights as they are (MC
  dropout samples through the masks instead).
* ``joint``: NNGFull and NNGBlkTri couple all parameters in one posterior: a step in which a trainable
  parameter gets no gradient raises a RuntimeError (freeze it) and changes nothing, instead of skipping it.
* ``dtypes``: every trainer runs in float32 and float64, its state in the parameter's dtype.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import ngvi
from conftest import make_mlp, regression_batch
from ngvi.baselines import BBVI, KFAC, MAP, MCDropout, mc_dropout_mlp

N = 64  # the data_size every entry is built with


# ------------------------------------------------------------------------------------------------------------
# Problems: a tiny model, a batch and its mean NLL
# ------------------------------------------------------------------------------------------------------------
def make_conv_net(seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    """A grouped Conv2d and a Linear layer (K-FAC's and VOGN's per-example hooks for both kinds)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1, groups=2), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)
    ).to(dtype)


def image_batch(seed: int = 1, n: int = 8, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, 4, 4, generator=gen, dtype=dtype), torch.randint(0, 3, (n,), generator=gen)


def make_dropout_mlp(seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(seed)
    return mc_dropout_mlp(3, 1, hidden=8, p=0.1, activation=nn.Tanh).to(dtype)


def squared_error(out: Tensor, y: Tensor) -> Tensor:
    return 0.5 * (out - y).square().mean()


@dataclass(frozen=True)
class Problem:
    """``model(seed, dtype=...)``, ``batch(seed, dtype=...)`` → (x, y) and ``loss(output, y)``, the mean NLL
    (the true-Fisher entries of a problem sample their targets from the matching likelihood)."""

    model: Callable[..., nn.Module]
    batch: Callable[..., tuple[Tensor, Tensor]]
    loss: Callable[[Tensor, Tensor], Tensor]


REGRESSION = Problem(make_mlp, regression_batch, squared_error)
CLASSIFICATION = Problem(make_conv_net, image_batch, F.cross_entropy)
DROPOUT_REGRESSION = Problem(make_dropout_mlp, regression_batch, squared_error)


# ------------------------------------------------------------------------------------------------------------
# The database
# ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainerInfo:
    """One trainer (or one variant of it: VON's two estimators, the empirical or true Fisher, ...)."""

    name: str
    cls: type
    #: ``factory(model or model.parameters(), **overrides)`` with the entry's hyperparameters
    factory: Callable[..., Any]
    problem: Problem = REGRESSION
    takes_model: bool = False
    add_param_group: bool = True
    closure_style: str = "backward"
    engine: bool = True
    mc_samples: bool = True
    manual_form: str = "samples"
    #: draws from torch's global generator (MC dropout's masks): ``train`` seeds it
    global_rng: bool = False
    posterior: str | None = "diagonal"
    #: the posterior couples every parameter: unused trainable parameters are refused, not skipped
    joint: bool = False
    #: the message of ``posterior()``'s NotImplementedError where there is none
    no_posterior: str | None = None
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64)
    #: (keyword overrides, regex of the ValueError) beyond the shared ones of ``BAD_ARGUMENTS``
    bad_arguments: tuple[tuple[dict[str, Any], str], ...] = field(default=())

    def __repr__(self) -> str:
        return self.name

    def build(self, model: nn.Module, **overrides: Any):
        """The trainer of ``model`` (built from its parameters or from the model itself)."""
        return self.factory(model if self.takes_model else model.parameters(), **overrides)

    def model(self, seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
        return self.problem.model(seed, dtype=dtype)

    def batch(self, seed: int = 1, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
        return self.problem.batch(seed, dtype=dtype)

    def closure(self, opt, model: nn.Module, x: Tensor, y: Tensor, uniform: bool = False) -> Callable:
        """The closure in the trainer's own style, or (``uniform``) through ``opt.backward(loss, output)``."""

        def closure():
            opt.zero_grad()
            out = model(x)
            loss = self.problem.loss(out, y)
            if uniform:
                opt.backward(loss, out)
            elif self.closure_style == "output":
                return loss, out
            else:
                loss.backward(create_graph=self.closure_style == "create_graph")
            return loss

        return closure

    def train(self, model: nn.Module, opt, steps: int, batch_seed: int = 1) -> list[Tensor]:
        """``steps`` steps on one batch; returns the losses. Where the trainer draws from torch's global
        generator it is seeded here, so that two runs from the same state take the same steps."""
        x, y = self.batch(batch_seed, dtype=next(model.parameters()).dtype)
        closure = self.closure(opt, model, x, y)
        if self.global_rng:
            torch.manual_seed(1000 + batch_seed)
        return [opt.step(closure) for _ in range(steps)]


def _factory(cls: type, **hyper: Any) -> Callable[..., Any]:
    return lambda params, **kw: cls(params, **{**hyper, **kw})


def with_true_fisher(likelihood: str, *args: Any, **kwargs: Any) -> tuple[TrainerInfo, TrainerInfo]:
    """The entry ``TrainerInfo(*args, **kwargs)`` (empirical Fisher) and its true-Fisher variant: the same
    hyperparameters with ``curvature="fisher"``, targets sampled from ``likelihood``, and a closure that
    returns ``(loss, output)``."""
    info = TrainerInfo(*args, **kwargs)
    fisher = {"curvature": "fisher", "likelihood": likelihood}
    return info, replace(
        info,
        name=f"{info.name}_fisher",
        factory=lambda params, **kw: info.factory(params, **{**fisher, **kw}),
        closure_style="output",
        bad_arguments=(),
    )


#: trainers that hook the model's layers: they take the model, keep it in one group, and run on the conv net
HOOKS_LAYERS: dict[str, Any] = dict(problem=CLASSIFICATION, takes_model=True, add_param_group=False)

#: the baselines that are torch.optim.Adam underneath (MAP, MC dropout): no engine, no Gaussian posterior
ADAM: dict[str, Any] = dict(
    engine=False,
    manual_form="adam",
    posterior=None,
    bad_arguments=(
        ({"data_size": float("nan")}, "data_size must be a positive int"),
        ({"prior_prec": -1.0}, "prior_prec must be >= 0, got -1.0"),
        ({"betas": (0.9, 1.5)}, r"betas\[1\] must lie in \[0, 1\), got 1.5"),
        ({"eps": 0.0}, "eps must be > 0, got 0.0"),
    ),
)

TRAINERS: list[TrainerInfo] = [
    TrainerInfo(
        "vadam",
        ngvi.Vadam,
        _factory(ngvi.Vadam, data_size=N, lr=1e-2, init_prec=50.0),
        bad_arguments=(
            ({"betas": (0.9, 1.0)}, r"betas\[1\] must lie in \[0, 1\), got 1.0"),
            ({"betas": 0.9}, r"betas must be a pair \(beta1, beta2\), got 0.9"),
            ({"prior_prec": 0.0}, "prior_prec must be > 0, got 0.0"),
            ({"prior_prec": 2.0, "init_prec": 1.0}, r"init_prec \(1.0\) must be >= prior_prec \(2.0\)"),
            ({"data_size": "many"}, "data_size must be a positive int"),
            ({"data_size": -3}, "data_size must be a positive int"),
            ({"data_size": True}, "data_size must be a positive int"),
            ({"seed": 1.5}, r"seed must be an int in \[0, 2\*\*63\) or None, got 1.5"),
        ),
    ),
    TrainerInfo(
        "vprop",
        ngvi.Vprop,
        _factory(ngvi.Vprop, data_size=N, lr=1e-2, init_prec=50.0),
        bad_arguments=(({"beta": 1.5}, r"beta must lie in \(0, 1\], got 1.5"),),
    ),
    TrainerInfo(
        "vadagrad",
        ngvi.VadaGrad,
        _factory(ngvi.VadaGrad, lr=1e-2, init_prec=100.0),
        bad_arguments=(
            ({"init_prec": 0.0}, "init_prec must be > 0, got 0.0"),
            ({"beta": -0.1}, "beta must be >= 0, got -0.1"),
            ({"prior_prec": 1.0}, "prior_prec must be 0, got 1.0"),
        ),
    ),
    TrainerInfo(
        "von_price",
        ngvi.VON,
        _factory(ngvi.VON, data_size=N, lr=1e-2, beta=0.05, init_prec=50.0),
        bad_arguments=(
            ({"beta": 2.0}, r"beta must lie in \[0, 1\], got 2.0"),
            ({"curvature": "exact"}, r"curvature must be one of \('price', 'hutchinson'\)"),
            ({"hessian": "exact"}, r"hessian must be one of \('price', 'hutchinson'\)"),
        ),
    ),
    TrainerInfo(
        "von_hutchinson",
        ngvi.VON,
        _factory(ngvi.VON, data_size=N, lr=1e-2, beta=0.05, init_prec=50.0, curvature="hutchinson"),
        closure_style="create_graph",
    ),
    *with_true_fisher(
        "categorical",
        "vogn",
        ngvi.VOGN,
        _factory(ngvi.VOGN, data_size=N, lr=0.05, beta=0.1, momentum=0.5, init_prec=10.0),
        **HOOKS_LAYERS,
        bad_arguments=(
            ({"beta": 1.5}, r"beta must lie in \(0, 1\], got 1.5"),
            ({"beta": 0.0}, r"beta must lie in \(0, 1\], got 0.0"),
            ({"momentum": 1.0}, r"momentum must lie in \[0, 1\), got 1.0"),
            ({"prior_prec": 0.0}, "prior_prec must be > 0, got 0.0"),
            ({"init_prec": 0.5, "prior_prec": 1.0}, r"init_prec \(0.5\) must be >= prior_prec \(1.0\)"),
        ),
    ),
    TrainerInfo(
        "ivon",
        ngvi.IVON,
        _factory(ngvi.IVON, data_size=N, lr=0.05, hess_init=1.0),
        bad_arguments=(
            ({"hess_init": -1.0}, "hess_init must be > 0, got -1.0"),
            ({"clip_radius": 0.0}, "clip_radius must be > 0, got 0.0"),
            ({"weight_decay": -1e-4}, "weight_decay must be >= 0, got -0.0001"),
            ({"weight_decay": 1e-4, "prior_prec": 1.0}, "not both"),
        ),
    ),
    TrainerInfo(
        "noisy_adam",
        ngvi.NoisyAdam,
        _factory(ngvi.NoisyAdam, data_size=N, lr=1e-2),
        bad_arguments=(
            ({"prior_var": 0.0}, "prior_var must be > 0, got 0.0"),
            ({"kl_weight": -1.0}, "kl_weight must be > 0, got -1.0"),
            ({"damping": -1.0}, "damping must be >= 0, got -1.0"),
        ),
    ),
    *with_true_fisher(  # per-example curvature (NNG eq. 11 per example) from VOGN's hooks (on the MLP:
        "gaussian",  # the hot-path test runs the elementwise rules on a wide MLP)
        "noisy_adam_ef",
        ngvi.NoisyAdam,
        _factory(ngvi.NoisyAdam, data_size=N, lr=1e-2, curvature="ef"),
        takes_model=True,
        add_param_group=False,
    ),
    *with_true_fisher(
        "categorical",
        "noisy_kfac",
        ngvi.NoisyKFAC,
        _factory(ngvi.NoisyKFAC, data_size=N, lr=0.05, momentum=0.5, stats_every=2, inv_every=3),
        **HOOKS_LAYERS,
        posterior="kronecker",
        bad_arguments=(
            ({"beta": 0.0}, r"beta must lie in \(0, 1\], got 0.0"),
            ({"momentum": 1.2}, r"momentum must lie in \[0, 1\), got 1.2"),
            ({"prior_var": 0.0}, "prior_var must be > 0, got 0.0"),
            ({"kl_weight": -1.0}, "kl_weight must be > 0, got -1.0"),
            ({"damping": -1e-3}, "damping must be >= 0, got -0.001"),
            ({"stats_every": 0}, "stats_every must be a positive int, got 0"),
            ({"inv_every": 1.5}, "inv_every must be a positive int, got 1.5"),
            ({"curvature": "fisher"}, "needs likelihood="),
        ),
    ),
    TrainerInfo(
        "noisy_kfac_local",
        ngvi.NoisyKFAC,
        _factory(ngvi.NoisyKFAC, data_size=N, lr=0.05, momentum=0.5, inv_every=3, sampling="local"),
        **HOOKS_LAYERS,
        posterior="kronecker",
        bad_arguments=(({"sampling": "rows"}, r"sampling must be one of \('auto', 'local', 'weights'\)"),),
    ),
    TrainerInfo(
        "noisy_kfac_weights",
        ngvi.NoisyKFAC,
        _factory(ngvi.NoisyKFAC, data_size=N, lr=0.05, stats_every=2, inv_every=3, sampling="weights"),
        **HOOKS_LAYERS,
        posterior="kronecker",
    ),
    *with_true_fisher(
        "gaussian",
        "nng_blktri",
        ngvi.NNGBlkTri,
        _factory(ngvi.NNGBlkTri, data_size=N, lr=0.05, momentum=0.5, stats_every=2, inv_every=3),
        takes_model=True,
        add_param_group=False,
        joint=True,
        posterior="blktri",
        bad_arguments=(
            ({"beta": 0.0}, r"beta must lie in \(0, 1\], got 0.0"),
            ({"prior_var": 0.0}, "prior_var must be > 0, got 0.0"),
            ({"inv_every": 0}, "inv_every must be a positive int, got 0"),
        ),
    ),
    *with_true_fisher(
        "categorical",
        "nng_full",
        ngvi.NNGFull,
        _factory(ngvi.NNGFull, data_size=N, lr=0.05, momentum=0.5, inv_every=2),
        **HOOKS_LAYERS,
        joint=True,
        posterior="full",
        bad_arguments=(
            ({"beta": 1.5}, r"beta must lie in \(0, 1\], got 1.5"),
            ({"damping": -1.0}, "damping must be >= 0, got -1.0"),
            ({"max_params": 100}, "this model has 235 trainable parameters, more than max_params=100"),
        ),
    ),
    *with_true_fisher(
        "categorical",
        "kfac",
        KFAC,
        _factory(KFAC, data_size=N, lr=0.05, momentum=0.5, prior_prec=1.0, inv_every=3),
        **HOOKS_LAYERS,
        mc_samples=False,
        posterior=None,
        no_posterior="is a point estimate and has no posterior distribution",
        bad_arguments=(
            ({"mc_samples": 2}, "is a point estimate: .*mc_samples must be 1, got 2"),
            ({"prior_prec": -1.0}, "prior_prec must be >= 0, got -1.0"),
            ({"prior_prec": 0.0, "damping": 0.0}, "KFAC needs prior_prec > 0 or damping > 0"),
            ({"init_prec": 5.0}, "KFAC's init_prec is 'auto' .* or None .* got 5.0"),
        ),
    ),
    TrainerInfo(
        "badam",
        ngvi.BAdam,
        _factory(ngvi.BAdam, data_size=N, lr=1e-2, prior_prec=1.0),
        mc_samples=False,
        manual_form="samples",
        bad_arguments=(
            ({"eps": 0.0}, "eps must be > 0, got 0.0"),
            ({"mc_samples": 2}, "takes its gradient at the mean .*mc_samples must be 1, got 2"),
        ),
    ),
    TrainerInfo(
        "bbvi",
        BBVI,
        _factory(BBVI, data_size=N, lr=1e-2),
        takes_model=True,
        bad_arguments=(
            ({"betas": (1.0, 0.999)}, r"betas\[0\] must lie in \[0, 1\), got 1.0"),
            ({"prior_prec": 0.0}, "prior_prec must be > 0, got 0.0"),
            ({"init_prec": -1.0}, "init_prec must be > 0, got -1.0"),
            ({"local_reparam": "yes"}, "local_reparam must be a bool, got 'yes'"),
            ({"eps": 0.0}, "eps must be > 0, got 0.0"),
        ),
    ),
    TrainerInfo(
        "bbvi_weight_reparam",
        BBVI,
        _factory(BBVI, data_size=N, lr=1e-2, local_reparam=False),
        takes_model=True,
    ),
    TrainerInfo(
        "mc_dropout",
        MCDropout,
        _factory(MCDropout, data_size=N, lr=1e-2),
        problem=DROPOUT_REGRESSION,
        takes_model=True,
        **ADAM,
        global_rng=True,
        no_posterior="a mixture over dropout masks, not a Gaussian",
    ),
    TrainerInfo(
        "map",
        MAP,
        _factory(MAP, data_size=N, lr=1e-2),
        **{
            **ADAM,
            "bad_arguments": (
                *ADAM["bad_arguments"],
                ({"mc_samples": 2}, "is a point estimate: .*mc_samples must be 1, got 2"),
            ),
        },
        mc_samples=False,
        no_posterior="is a point estimate and has no posterior distribution",
    ),
]

BY_NAME: dict[str, TrainerInfo] = {info.name: info for info in TRAINERS}

#: the bad arguments every trainer refuses, with the message it gives
BAD_ARGUMENTS: tuple[tuple[dict[str, Any], str], ...] = (
    ({"lr": -1.0}, "lr must be >= 0, got -1.0"),
    ({"lr": float("nan")}, "lr must be finite, got nan"),
    ({"data_size": 64.5}, r"data_size must be a positive int \(the number of training examples\), got 64.5"),
    ({"data_size": 0}, r"data_size must be a positive int \(the number of training examples\), got 0"),
    ({"mc_samples": 0}, "mc_samples must be (a positive int|1), got 0"),
    ({"mc_samples": True}, "mc_samples must be a positive int, got True"),
)


def trainers(where: Callable[[TrainerInfo], bool] = lambda info: True) -> list:
    """``pytest.param`` s of the entries for which ``where(info)`` holds, with their names as ids."""
    return [pytest.param(info, id=info.name) for info in TRAINERS if where(info)]


# ------------------------------------------------------------------------------------------------------------
# Helpers for exact comparisons
# ------------------------------------------------------------------------------------------------------------
def params_of(model: nn.Module) -> list[Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def assert_same(a, b) -> None:
    """Bitwise equality of nested tensors (same dtype and shape), dicts, lists and plain values."""
    if isinstance(a, Tensor):
        assert isinstance(b, Tensor) and a.dtype == b.dtype and torch.equal(a, b), (a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for u, v in zip(a, b, strict=True):
            assert_same(u, v)
    else:
        assert a == b, (a, b)


def saved(obj: Any) -> Any:
    """``obj`` through ``torch.save`` and ``torch.load(weights_only=True)``: what a checkpoint restores."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)
