"""What ``ngvi bench`` times: each method builds a step function for a fresh model.

ngvi's trainers come from the harness's registry (:data:`ngvi.experiments.core.METHODS`) and train with its
one closure. Beside them: ``torch.optim.Adam`` (the reference of every ratio), the *floor* (an Adam step plus
one standard-normal draw per weight: the least any weight-perturbation method can cost), forward + backward
alone (the closure without an optimizer: what a step costs beyond it is the optimizer's), the compiled rules
(``compile=True``) and the optional reference implementations (ivon-opt, BackPACK).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ...optim.engine.chunked import chunked_normal_
from ...optim.kronecker import DEFAULTS as KRONECKER_DEFAULTS
from ..core import training
from ..core.methods import METHODS as REGISTRY

DATA_SIZE = 60_000
#: the references of every ratio and difference: timed first in each round, whatever ``--methods`` says
REFERENCES = ("adam", "floor", "fwd_bwd")
Step = Callable[[], Any]
Build = Callable[[nn.Module, torch.Tensor, torch.Tensor], Step]


@dataclass(frozen=True)
class Method:
    label: str
    build: Build
    requires: str = ""  # a method of the registry ("vogn") or a package that must import ("package:ivon")
    amortised: bool = False  # report the mean over whole cycles, not the median step
    cycle: int = 1


def _adam(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Step:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    closure = training.closure(model, opt, F.cross_entropy, x, y)
    return lambda: opt.step(closure)


def _forward_backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Step:
    """The harness's closure with no optimizer: the model zeroes its gradients (to None, as every
    optimizer's ``zero_grad`` does) and the loss is backpropagated; nothing is updated."""
    return training.closure(model, model, F.cross_entropy, x, y)


def _floor(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Step:
    """An Adam step plus one N(0, 1) draw per weight into a kept buffer: the work every weight-perturbation
    step must do at least (the optimizers' own generators are torch's CPU generator too)."""
    adam = _adam(model, x, y)
    buffers = [torch.empty_like(p) for p in model.parameters()]
    generator = torch.Generator(device=buffers[0].device).manual_seed(0)

    def step() -> Any:
        for b in buffers:
            b.normal_(generator=generator)
        return adam()

    return step


def _floor_chunked(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Step:
    """The floor with ``noise="chunked"``'s draw: chunks from their own generators, on torch's threads."""
    adam = _adam(model, x, y)
    buffers = [torch.empty_like(p) for p in model.parameters()]
    draws = iter(range(1 << 62))

    def step() -> Any:
        t = next(draws)
        for i, b in enumerate(buffers):
            chunked_normal_(b, 0, t, i)
        return adam()

    return step


def trainer_step(factory: Callable[[nn.Module], Any]) -> Build:
    """``opt.step(closure)`` of the trainer ``factory(model)``, with the harness's one closure."""

    def build(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Step:
        opt = factory(model)
        closure = training.closure(model, opt, F.cross_entropy, x, y)
        return lambda: opt.step(closure)

    return build


def ngvi_method(name: str, **options: Any) -> Build:
    """A step of the registry's method ``name``, built with ``options`` beside data_size."""
    return trainer_step(lambda model: REGISTRY[name].build(model, DATA_SIZE, **options))


def _ivon_opt(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Step:
    import ivon  # the reference implementation (pip ivon-opt)

    opt = ivon.IVON(model.parameters(), lr=0.1, ess=DATA_SIZE, hess_init=1.0)

    def step() -> None:
        with opt.sampled_params(train=True):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def _backpack_sgs_adam(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Step:
    """BackPACK's per-example squared-gradient sums (VOGN's curvature), then an Adam step."""
    from backpack import backpack, extend
    from backpack.extensions import SumGradSquared

    model = extend(model)
    loss_fn = extend(nn.CrossEntropyLoss())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)

    def step() -> None:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        with backpack(SumGradSquared()):
            loss.backward()
        opt.step()

    return step


#: the registry's methods timed as a user builds them: ``cls(params, data_size=N)``, every other option at its
#: default (Vprop's default noise is antithetic, VON's and the K-FAC family's momentum 0.5, ...)
DEFAULT_RULES = (
    "vadam", "vprop", "von", "vadagrad", "ivon", "noisy_adam", "badam", "vogn", "noisy_kfac", "kfac", "bbvi",
)  # fmt: skip
#: options beside the defaults: ngvi.baselines.KFAC, the reference of "× K-FAC", takes the step settings of
#: noisy K-FAC's defaults explicitly (the family's, read here), so the two rows differ only by the noise
OPTIONS: dict[str, dict[str, Any]] = {
    "von": {
        "lr": 0.01
    },  # the default lr=0.1 diverges within the bench's steps (random labels); lr costs nothing
    "kfac": {k: KRONECKER_DEFAULTS[k] for k in ("lr", "beta", "momentum", "init_prec", "inv_every")},
}
#: extra rows, labelled: the settings of the recorded runs (the papers' rules: init_prec=100, independent
#: noise, no natural momentum), which the bench timed before it timed the defaults
PINNED: dict[str, dict[str, Any]] = {
    "vadam": {"init_prec": 100.0},
    "vprop": {"init_prec": 100.0, "noise": "normal"},
    "von": {"init_prec": 100.0, "momentum": 0.0, "lr": 0.01},
    "vogn": {"momentum": 0.0},
    "noisy_kfac": {"momentum": 0.0},
}
#: the K-FAC family: timed as the mean over whole inversion cycles (their amortised step)
KFAC_CYCLE = {"noisy_kfac": 20, "kfac": 20}
#: the diagonal rules whose defaults are also timed with ``compile=True``
COMPILED = ("vadam", "vprop", "von", "vadagrad", "ivon", "noisy_adam")


def _options(options: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in options.items())


def methods(noise_variants: bool = False) -> dict[str, Method]:
    out = {
        "adam": Method("torch.optim.Adam (foreach)", _adam),
        "floor": Method("floor: Adam + one N(0,1) draw per weight", _floor),
        "fwd_bwd": Method("forward + backward alone (no optimizer step)", _forward_backward),
        "floor-chunked": Method("floor with noise='chunked' (parallel chunks)", _floor_chunked),
    }
    for name in COMPILED[:2]:
        out[f"{name}-chunked"] = Method(
            f"ngvi.{REGISTRY[name].cls}, noise='chunked'", ngvi_method(name, noise="chunked")
        )
    for name in DEFAULT_RULES:
        registered = REGISTRY[name]
        cycle = KFAC_CYCLE.get(name, 1)
        amortised = f" (amortised over inv_every={cycle})" if cycle > 1 else ""
        label = (
            f"ngvi.{registered.cls}" + (f", {_options(OPTIONS[name])}" if name in OPTIONS else "") + amortised
        )
        if name == "noisy_kfac":
            label = f"ngvi.NoisyKFAC, sampling='auto' (the default){amortised}"
        out[name] = Method(
            label, ngvi_method(name, **OPTIONS.get(name, {})), requires=name, amortised=cycle > 1, cycle=cycle
        )
        if name == "noisy_kfac":  # the paper's form (Alg. 2): one weight draw for the minibatch
            out["noisy_kfac-weights"] = Method(
                f"ngvi.NoisyKFAC, sampling='weights'{amortised}",
                ngvi_method(name, sampling="weights"),
                requires=name,
                amortised=True,
                cycle=cycle,
            )
    for name in COMPILED:
        cls = REGISTRY[name].cls
        options = OPTIONS.get(name, {})
        out[f"{name}-compiled"] = Method(
            f"ngvi.{cls}, compile=True" + (f", {_options(options)}" if options else ""),
            ngvi_method(name, compile=True, **options),
        )
    for name, options in PINNED.items():
        cycle = KFAC_CYCLE.get(name, 1)
        out[f"{name}-pinned"] = Method(
            f"ngvi.{REGISTRY[name].cls}, {_options(options)} (recorded runs' settings)",
            ngvi_method(name, **options),
            requires=name,
            amortised=cycle > 1,
            cycle=cycle,
        )
    out["ivon-opt"] = Method("ivon-opt IVON (reference)", _ivon_opt, requires="package:ivon")
    out["backpack"] = Method(
        "BackPACK SumGradSquared + Adam (reference)", _backpack_sgs_adam, requires="package:backpack"
    )
    if noise_variants:
        for name in ("vadam", "ivon"):
            out[f"{name}-antithetic"] = Method(
                f"ngvi.{REGISTRY[name].cls}, noise='antithetic'", ngvi_method(name, noise="antithetic")
            )
    return out


def availability(method: Method) -> str | None:
    """None if the method can run here, else why not."""
    if not method.requires:
        return None
    package = method.requires.removeprefix("package:")
    if package == method.requires:  # "ivon" is a registry method too: packages are named as such
        return None if REGISTRY[method.requires].available() else "not available in this build"
    try:
        importlib.import_module(package)
    except Exception as err:  # an installed package that fails with this torch says so here
        return f"`{package}` not importable ({type(err).__name__}: {err})"[:160]
    return None
