"""A trained posterior as an artefact: saved with its names, loaded against a model, used to predict.

* :func:`posterior_of` ``(model, opt)``: ``opt.posterior()`` with the model's parameter names (in the
  optimizer's order, the order of the posterior), the rule (the optimizer's class name), its
  hyperparameters and the model's persistent buffers attached; ``.save(path)`` then writes all of them.
* :func:`save_posterior` ``(model, opt, path)``: the same in one call.
* :func:`ngvi.load_posterior` ``(path, model=None)`` (:mod:`ngvi.posterior.io`): the posterior back, checked
  against ``model``'s parameters and persistent buffers when one is given.
* :class:`PosteriorSampler` ``(model, posterior)``: a loaded posterior in the trainer protocol that
  :func:`ngvi.predict`, :func:`ngvi.evaluate_classifier` and :func:`ngvi.uncertainty_report` take: it puts
  the posterior mean and the saved buffers into the model and holds a draw in its weights inside
  ``sampled_params()``.

Why buffers travel with the posterior: a prediction uses the model's persistent buffers (batch norm's
running statistics) beside its weights, and the model a file is loaded into is usually freshly built, with
the defaults (running mean 0, variance 1). Without them a net with batch norm trained to 0.988 accuracy
predicts at chance from the file (issue 43). So the file carries them, and a posterior that carries none is
refused against a model that has some, rather than predicting with the fresh model's.

Why names come from the model: an optimizer is built from ``model.parameters()`` (or a list of groups) and
never sees names, so neither does ``opt.posterior()``. The names of a ``state_dict`` are what a PyTorch user
checks a file against; they are taken at save time from ``model.named_parameters()``, matched to the
optimizer's parameters by identity, so param groups in any order get the right names.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .posterior.base import GaussianPosterior
from .posterior.io import (
    check_against_model,
    check_buffers,
    load_posterior,
    persistent_buffers,
    plain_hyperparameters,
)
from .predict import _param_keys
from .protocol import unwrap

__all__ = ["PosteriorSampler", "load_posterior", "posterior_of", "save_posterior"]


def posterior_of(model: nn.Module, opt: Any) -> GaussianPosterior:
    """``opt.posterior()`` annotated with the model's names of its parameters, the rule, its
    hyperparameters (the param groups' plain values) and a copy of the model's persistent buffers
    (batch-norm statistics, ...), ready for ``.save(path)``."""
    inner = unwrap(opt)
    post = inner.posterior()
    return post.annotate(
        names=_param_keys(model, inner),
        rule=type(inner).__name__,
        hyperparameters=plain_hyperparameters(inner.param_groups),
        buffers={k: b.detach().clone() for k, b in persistent_buffers(model).items()},
    )


def save_posterior(model: nn.Module, opt: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``opt``'s posterior over ``model`` to a safetensors file (see :func:`posterior_of`).

    Args:
        model: the trained model: its parameter names go into the file.
        opt: the ngvi optimizer (or a wrapper of one) that holds the posterior.
        path: the file to write (conventionally ``posterior.safetensors``).

    Returns:
        The path written.

    Raises:
        TypeError: ``opt`` is not an ngvi optimizer and wraps none.
        NotImplementedError: ``opt`` is a point estimate or MC dropout, which have no Gaussian posterior.
        ValueError: a parameter of the optimizer is not one of ``model``'s.
    """
    return posterior_of(model, opt).save(path)


class PosteriorSampler:
    """A fixed posterior over a model's parameters, for prediction (not for training).

    On construction the posterior is checked against the model (names and shapes of its parameters; the
    posterior needs names: a loaded one has them; and its buffers against the model's persistent buffers,
    :func:`ngvi.posterior.io.check_buffers`), and its mean and buffers are copied into the model.
    ``sampled_params()`` holds one draw θ ~ q in the weights for a block and puts the previous weights
    back afterwards; draws come from ``generator`` (or a fresh one seeded with ``seed``), so a run
    is reproducible. ``ngvi.predict(model, sampler, x, samples=S)`` and ``vectorize=True`` both work.
    """

    deterministic = False
    #: its posterior covers the parameters it was given, frozen ones too (a model frozen for inference)
    covers_frozen = True

    def __init__(self, model: nn.Module, posterior: GaussianPosterior, seed: int | None = None):
        if not isinstance(posterior, GaussianPosterior):
            raise TypeError(f"posterior must be a GaussianPosterior, got {type(posterior).__name__}")
        if not posterior.names:
            raise ValueError(
                "the posterior has no parameter names: load it with ngvi.load_posterior, or annotate it "
                "(ngvi.posterior_of(model, opt))"
            )
        check_against_model(posterior.names, [tuple(m.shape) for m in posterior.mean], model)
        check_buffers(posterior.buffers, model)
        named = dict(model.named_parameters())
        self.model = model
        self._posterior = posterior
        self._params = [named[n] for n in posterior.names]
        self.param_groups = [{"params": self._params}]
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)
        self._write(posterior.mean)
        own = persistent_buffers(model)
        with torch.no_grad():
            for name, value in (posterior.buffers or {}).items():
                own[name].copy_(value)

    def _write(self, values: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, v in zip(self._params, values, strict=True):
                p.copy_(v)

    def posterior(self) -> GaussianPosterior:
        return self._posterior

    @contextlib.contextmanager
    def sampled_params(self, train: bool = False) -> Iterator[None]:
        """One posterior draw in the model's weights for the block (``train`` accepted for the protocol)."""
        if train:
            raise ValueError("a PosteriorSampler is for prediction: it does not train (train=True)")
        saved = [p.detach().clone() for p in self._params]
        self._write(self._posterior.sample(generator=self.generator))
        try:
            yield
        finally:
            self._write(saved)

    def __repr__(self) -> str:
        return f"PosteriorSampler({self._posterior!r}, rule={self._posterior.rule!r})"
