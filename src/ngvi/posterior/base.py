"""The protocol every posterior family implements, and what the families share.

:class:`GaussianPosterior` names the interface (``mean``, ``variance``, ``std``, ``sample``, ``log_prob``,
``entropy``, ``kl``) and implements ``snr``, ``prune_masks`` and ``numel`` on top of it. Every optimizer's
``posterior()`` returns a snapshot (cloned tensors) in parameter order, so it stays valid while training
goes on. Scalar results (``log_prob``, ``kl``, ``entropy``) are reduced in float64.

**Point estimates.** Parameters listed in ``point`` (the batch-norm parameters under VOGN and noisy K-FAC,
see :mod:`ngvi.curvature.layers`) are held at their mean: variance 0, every sample equals the mean, and
``log_prob``, ``entropy`` and ``kl`` are those of the random parameters alone (the density of q conditional
on the point estimates, which enter as hyperparameters).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .. import pruning
from .._version import __version__
from . import _format

__all__ = ["GaussianPosterior", "symmetric_kl"]

LOG_2PI = math.log(2.0 * math.pi)


class GaussianPosterior:
    """Interface shared by the posterior families (mean, marginal variance, sampling, densities)."""

    mean: list[Tensor]
    variance: list[Tensor]
    #: indices of point-estimate parameters (variance 0, samples = the mean)
    point: tuple[int, ...] = ()
    #: what a saved file records beside the tensors (:meth:`annotate`; None where unknown)
    names: list[str] | None = None
    rule: str | None = None
    hyperparameters: list[dict[str, Any]] | None = None
    #: the model's persistent buffers by name (batch-norm statistics, ...); None where unknown
    buffers: dict[str, Tensor] | None = None

    # -- what every family implements -------------------------------------------------------------------
    def sample(self, n: int | None = None, generator: torch.Generator | None = None) -> list[Tensor]:
        """θ ~ q, shaped like the parameters; with ``n`` each tensor gets a leading dimension of size n."""
        raise NotImplementedError(f"{type(self).__name__} does not implement sample")

    def log_prob(self, sample: Sequence[Tensor]) -> Tensor:
        """log q(θ) in float64: a scalar, or a vector of n values for a batch of n samples."""
        raise NotImplementedError(f"{type(self).__name__} does not implement log_prob")

    def entropy(self) -> Tensor:
        """H[q] in float64."""
        raise NotImplementedError(f"{type(self).__name__} does not implement entropy")

    def kl(self, other: GaussianPosterior) -> Tensor:
        """KL(self ‖ other) in float64."""
        raise NotImplementedError(f"{type(self).__name__} does not implement kl")

    # -- what follows from the mean and the marginal variances --------------------------------------------
    @property
    def std(self) -> list[Tensor]:
        return [v.sqrt() for v in self.variance]

    def snr(self) -> list[Tensor]:
        """Signal-to-noise ratio |μ|/σ per weight (BADAM's pruning criterion)."""
        return [m.abs() / s for m, s in zip(self.mean, self.std, strict=True)]

    def prune_masks(
        self, fraction: float, criterion: pruning.Criterion = "snr", scope: pruning.Scope = "global"
    ) -> list[Tensor]:
        """Keep-masks that prune the ``fraction`` of weights with the lowest |μ|/σ (``criterion="snr"``)
        or |μ| (``"magnitude"``), over all weights or ``scope="per_tensor"``: see :mod:`ngvi.pruning`."""
        return pruning.prune_masks(pruning.prune_scores(self, criterion), fraction, scope)

    def numel(self) -> int:
        return sum(m.numel() for m in self.mean)

    # -- as a file ---------------------------------------------------------------------------------------
    def annotate(
        self,
        names: Sequence[str] | None = None,
        rule: str | None = None,
        hyperparameters: Sequence[dict[str, Any]] | None = None,
        buffers: Mapping[str, Tensor] | None = None,
    ) -> GaussianPosterior:
        """Attach the parameter names (in the posterior's order), the rule (the optimizer's class name), its
        hyperparameters and the model's persistent buffers (``{name: tensor}``, what a prediction uses
        beside the weights: batch-norm statistics), which :meth:`save` writes; returns ``self``. An
        optimizer's ``posterior()`` knows none of them: :func:`ngvi.posterior_of` (or
        :func:`ngvi.save_posterior`) takes them from the model and the optimizer."""
        if names is not None:
            names = [str(n) for n in names]
            if len(names) != len(self.mean):
                raise ValueError(f"got {len(names)} names for a posterior over {len(self.mean)} tensors")
            if len(set(names)) != len(names):
                raise ValueError("names must be unique: each parameter is named once")
            self.names = names
        if rule is not None:
            if not _format.is_rule_name(rule):
                got = repr(rule[:60]) if isinstance(rule, str) else f"a {type(rule).__name__}"
                raise ValueError(
                    "rule must be a class name (letters, digits, underscores: the optimizer's, e.g. 'IVON'), "
                    f"got {got}"
                )
            self.rule = rule
        if hyperparameters is not None:
            self.hyperparameters = [dict(g) for g in hyperparameters]
        if buffers is not None:
            if not isinstance(buffers, Mapping) or not all(
                isinstance(k, str) and isinstance(v, Tensor) for k, v in buffers.items()
            ):
                raise TypeError(
                    "buffers must map buffer names (str) to tensors, as dict(model.named_buffers())"
                )
            self.buffers = {k: v.detach() for k, v in buffers.items()}
        return self

    def save(self, path: str | os.PathLike[str], names: Sequence[str] | None = None) -> Path:
        """Write the posterior to a safetensors file (never a pickle; the format: :mod:`ngvi.posterior.io`):
        its tensors and the model's buffers where known (:meth:`annotate`), and as metadata the family,
        parameter names, shapes, dtypes, rule and hyperparameters.
        ``names`` defaults to the names attached by :meth:`annotate`; without either it is refused. Read
        it back with :func:`ngvi.load_posterior`. Needs the safetensors package. Returns the path."""
        st = _format.safetensors()
        names = list(self.names or []) if names is None else list(names)
        if not names:
            raise ValueError(
                "this posterior does not know its parameter names: pass names= (the model's names of the "
                "optimizer's parameters, in order) or save with ngvi.save_posterior(model, opt, path)"
            )
        if len(names) != len(self.mean) or not all(isinstance(n, str) for n in names):
            raise ValueError(
                f"names must be {len(self.mean)} strings, one per posterior tensor, got {names!r}"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"names must be unique, got {names!r}")
        family, structure = self._file_tensors()
        tensors = {f"mean.{i}": m for i, m in enumerate(self.mean)} | family
        buffers = self.buffers
        if buffers is not None:
            tensors |= {f"buffer.{j}": b for j, b in enumerate(buffers.values())}
        metadata = {
            "format": _format.FORMAT,
            "format_version": str(_format.FORMAT_VERSION),
            "ngvi_version": __version__,
            "family": type(self).__name__,
            "names": json.dumps(names),
            "shapes": json.dumps([list(m.shape) for m in self.mean]),
            "dtypes": json.dumps([str(m.dtype).removeprefix("torch.") for m in self.mean]),
            "point": json.dumps(list(self.point)),
            "structure": json.dumps(structure),
            "rule": self.rule or "",
            "hyperparameters": json.dumps(list(self.hyperparameters or [])),
        }
        if buffers is not None:
            metadata["buffers"] = json.dumps(list(buffers))
        path = Path(path)
        st.torch.save_file({k: _format.cpu_copy(t) for k, t in tensors.items()}, str(path), metadata=metadata)
        return path

    def _file_tensors(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """The family's tensors beyond the means (keys as in :mod:`ngvi.posterior.io`) and its JSON
        structure: what :meth:`_from_file` rebuilds the posterior from."""
        raise NotImplementedError(f"{type(self).__name__} cannot be saved")

    @classmethod
    def _from_file(
        cls, mean: list[Tensor], tensors: dict[str, Tensor], point: list[int], structure: dict[str, Any]
    ) -> GaussianPosterior:
        raise NotImplementedError(f"{cls.__name__} cannot be loaded")

    def _leading_dim(self, sample: Sequence[Tensor]) -> int | None:
        """None when ``sample`` is shaped like the parameters, n when it carries a leading dim n."""
        if len(sample) != len(self.mean):
            raise ValueError(f"sample has {len(sample)} tensors, the posterior has {len(self.mean)}")
        batched = sample[0].dim() == self.mean[0].dim() + 1
        n = sample[0].shape[0] if batched else None
        for i, (x, m) in enumerate(zip(sample, self.mean, strict=True)):
            expected = (n, *m.shape) if batched else tuple(m.shape)
            if tuple(x.shape) != expected:
                raise ValueError(
                    f"sample[{i}] has shape {tuple(x.shape)}, expected {expected} "
                    "(shaped like the parameter, optionally with one leading sample dimension)"
                )
        return n


def symmetric_kl(p: GaussianPosterior, q: GaussianPosterior) -> Tensor:
    r"""½ [KL(p ‖ q) + KL(q ‖ p)], in float64: the symmetric KL divergence that Khan et al. 2018 (§6.1,
    Fig. 2; ``make_fig_two_b.m`` of their code) use to compare an approximation with MF-Exact.

    For diagonal Gaussians it is, summed over weights,

    .. math::
        \tfrac14 \textstyle\sum_j \big[\sigma_{p,j}^2/\sigma_{q,j}^2 + \sigma_{q,j}^2/\sigma_{p,j}^2 - 2
        + (\mu_{p,j} - \mu_{q,j})^2 (1/\sigma_{p,j}^2 + 1/\sigma_{q,j}^2)\big]

    (the log-determinants cancel). The Jeffreys divergence is twice this. Both arguments must cover
    parameters of the same shapes, and each must implement ``kl`` against the other (two
    :class:`DiagonalGaussian`\ s, or two :class:`KroneckerGaussian`\ s with the same blocks).
    """
    for name, value in (("p", p), ("q", q)):
        if not isinstance(value, GaussianPosterior):
            raise TypeError(
                f"{name} must be a GaussianPosterior (e.g. opt.posterior()), got {type(value).__name__}"
            )
    return 0.5 * (p.kl(q) + q.kl(p))


def point_indices(point: Sequence[int], count: int) -> tuple[int, ...]:
    out = tuple(sorted({int(i) for i in point}))
    if any(i < 0 or i >= count for i in out):
        raise ValueError(f"point indices must lie in [0, {count}), got {list(point)}")
    return out
