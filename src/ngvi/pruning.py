r"""Pruning by signal-to-noise ratio or by magnitude (BADAM §4; Blundell et al. 2015, §5.2).

A posterior q = N(μ, σ²) ranks the weights by how sure it is that they are not zero: the signal-to-noise
ratio |μ|/σ. Pruning sets the fraction p of weights with the lowest score to zero and keeps μ elsewhere;
the baseline ranks by |μ| alone (BADAM's "Σ = 1")::

    post = opt.posterior()
    masks = ngvi.prune_masks(post.snr(), fraction=0.9)              # or post.prune_masks(0.9)
    with ngvi.pruned(model.parameters(), masks):                      # the weights are zeroed in here
        accuracy = evaluate(model)
    ngvi.apply_masks(model.parameters(), masks)                       # or for good

**How many and which.** Of n weights, k = ⌊p·n + ½⌋ are pruned (p·n rounded half up, so that p = 0.9 of
10 weights is 9 even though 0.9·10 is 9.000000000000002 in floating point). They are the k lowest scores
of a *stable* sort of all scores flattened in parameter order (tensor by tensor, each row-major): among
equal scores the one that comes first is pruned first. So exactly k weights are pruned and the mask is a
deterministic function of the scores. ``scope="global"`` ranks all weights together (BADAM, Blundell et
al.); ``scope="per_tensor"`` prunes the fraction p of every tensor on its own (a layer's weight matrix and
its bias are separate tensors: pass only the tensors you want pruned).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Literal, Protocol

import torch
from torch import Tensor

__all__ = ["CRITERIA", "SCOPES", "apply_masks", "prune_masks", "prune_scores", "pruned"]

Criterion = Literal["snr", "magnitude"]
Scope = Literal["global", "per_tensor"]
#: the values of ``criterion``: |μ|/σ (BADAM's signal-to-noise ratio) or |μ|
CRITERIA: tuple[str, ...] = ("snr", "magnitude")
#: the values of ``scope``: rank all weights together, or each parameter tensor on its own
SCOPES: tuple[str, ...] = ("global", "per_tensor")


class Scored(Protocol):
    """What :func:`prune_scores` reads of a posterior; every :class:`ngvi.GaussianPosterior` has it.

    A protocol, so that this module need not import :mod:`ngvi.posterior` (which imports it)."""

    @property
    def mean(self) -> Sequence[Tensor]: ...

    def snr(self) -> list[Tensor]: ...


def prune_scores(posterior: Scored, criterion: Criterion = "snr") -> list[Tensor]:
    """Per-weight scores of ``posterior`` (lowest are pruned first): ``"snr"`` |μ|/σ, ``"magnitude"`` |μ|.

    Args:
        posterior: a Gaussian posterior (anything with ``mean`` and ``snr()``).
        criterion: ``"snr"`` or ``"magnitude"``.

    Returns:
        One score tensor per parameter tensor.

    Raises:
        ValueError: an unknown ``criterion``.
    """
    if criterion == "snr":
        return posterior.snr()
    if criterion == "magnitude":
        return [m.abs() for m in posterior.mean]
    raise ValueError(f"criterion must be one of {', '.join(CRITERIA)}, got {criterion!r}")


def _pruned_count(fraction: float, n: int) -> int:
    return min(n, math.floor(fraction * n + 0.5))


def _check_fraction(fraction: float) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 <= fraction <= 1:
        raise ValueError(
            f"fraction must be a number in [0, 1] (the share of weights to prune), got {fraction!r}"
        )
    return float(fraction)


def _lowest(flat: Tensor, k: int) -> Tensor:
    """Keep-mask of a 1-d score vector with its k lowest entries (ties: the earlier first) set False."""
    keep = torch.ones(flat.shape, dtype=torch.bool, device=flat.device)
    if k:
        order = torch.sort(flat, stable=True).indices
        keep[order[:k]] = False
    return keep


def prune_masks(scores: Sequence[Tensor], fraction: float, scope: Scope = "global") -> list[Tensor]:
    """Boolean keep-masks (True: kept) shaped like ``scores`` that prune the ``fraction`` lowest scores.

    Exactly ⌊fraction·n + ½⌋ weights are pruned, n counted over all tensors (``scope="global"``) or per
    tensor (``"per_tensor"``); ties go to the weight that comes first in parameter order (see the module
    docstring). Scores must be finite or +inf (a weight with σ = 0 is certain: it is pruned last).
    """
    fraction = _check_fraction(fraction)
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    scores = [s.detach() for s in scores]
    if not scores:
        raise ValueError("scores is empty: pass one score tensor per parameter tensor")
    for i, s in enumerate(scores):
        if bool(torch.isnan(s).any()) or bool((s == -math.inf).any()):
            raise ValueError(f"scores[{i}] has NaN or -inf entries; scores must be finite or +inf")
    if scope == "per_tensor":
        return [_lowest(s.reshape(-1), _pruned_count(fraction, s.numel())).reshape(s.shape) for s in scores]
    devices = {s.device for s in scores}
    if len(devices) > 1:
        raise ValueError(f"scores are on several devices ({sorted(map(str, devices))}); move them to one")
    dtype = functools.reduce(torch.promote_types, [s.dtype for s in scores], torch.float32)
    flat = torch.cat([s.reshape(-1).to(dtype) for s in scores])  # exact: no score changes its rank
    keep = _lowest(flat, _pruned_count(fraction, flat.numel()))
    return [k.reshape(s.shape) for k, s in zip(keep.split([s.numel() for s in scores]), scores, strict=True)]


def _pairs(params: Iterable[Tensor], masks: Sequence[Tensor]) -> list[tuple[Tensor, Tensor]]:
    params = list(params)
    if len(params) != len(masks):
        raise ValueError(f"got {len(params)} parameter tensors but {len(masks)} masks (one mask per tensor)")
    for i, (p, m) in enumerate(zip(params, masks, strict=True)):
        if p.shape != m.shape:
            raise ValueError(f"mask {i} has shape {tuple(m.shape)} but parameter {i} has {tuple(p.shape)}")
        if m.dtype != torch.bool:
            raise ValueError(
                f"mask {i} has dtype {m.dtype}; masks are boolean (True: kept), from prune_masks"
            )
    return list(zip(params, masks, strict=True))


@torch.no_grad()
def apply_masks(params: Iterable[Tensor], masks: Sequence[Tensor]) -> None:
    """Zero, in place, the entries of each parameter where its mask is False (for good).

    Args:
        params: the parameter tensors, in the order of the masks.
        masks: one boolean keep-mask per parameter, of its shape (True = kept), as :func:`prune_masks` gives.

    Raises:
        ValueError: as many masks as parameters are needed, each of its parameter's shape and boolean.
    """
    for p, m in _pairs(params, masks):
        p.masked_fill_(~m.to(p.device), 0.0)


@contextlib.contextmanager
def pruned(params: Iterable[Tensor], masks: Sequence[Tensor]) -> Iterator[None]:
    """Within the block the parameters are pruned by ``masks``; on exit (also on error) they are restored.

    Call it between optimizer steps: inside ``sampled_params()`` the parameters hold a sample, not μ.

    Args:
        params: the parameter tensors, in the order of the masks.
        masks: one boolean keep-mask per parameter (True = kept).

    Raises:
        ValueError: as for :func:`apply_masks`.
    """
    pairs = _pairs(params, masks)
    with torch.no_grad():
        saved = [p.detach().clone() for p, _ in pairs]
    try:
        apply_masks([p for p, _ in pairs], [m for _, m in pairs])
        yield
    finally:
        with torch.no_grad():
            for (p, _), old in zip(pairs, saved, strict=True):
                p.copy_(old)
