r"""Posteriors as files: one safetensors file per posterior, never a pickle.

A file holds the tensors that rebuild the posterior exactly and, in the safetensors header's string→string
metadata, what they mean:

=====================  ===================================================================================
``format``             ``"ngvi.posterior"`` (what marks a file as ours)
``format_version``     ``"1"``; a file of a newer version is refused (upgrade ngvi)
``ngvi_version``       the ngvi that wrote it
``family``             ``DiagonalGaussian``, ``KroneckerGaussian``, ``FullGaussian`` or
                       ``BlockTridiagonalGaussian``
``names``              JSON list: the parameter names, in the posterior's (= the optimizer's) order
``shapes``, ``dtypes`` JSON lists, one entry per parameter
``point``              JSON list: indices of point-estimate parameters
``structure``          JSON: what the family needs beyond tensors (blocks, layers, scale)
``rule``               the optimizer's class name (``""`` if unknown)
``hyperparameters``    JSON list, one dict per param group: its plain values (numbers, strings, bools,
                       None, lists of them); tensors and other objects are left out
=====================  ===================================================================================

Tensors: ``mean.<i>`` for parameter i and, by family, ``variance.<i>`` (diagonal), ``block.<k>.row_cov``
and ``block.<k>.col_cov`` (Kronecker), ``covariance`` (full), ``chain.<k>.<field>`` (block tridiagonal:
the :class:`~ngvi.curvature.tridiagonal.ChainLayer` tensors). They are stored as the posterior holds them
(the covariances in float64), so the rebuilt posterior's mean, variance, samples (same generator),
``log_prob``, ``kl`` and ``snr`` equal the saved one's bitwise.

Keys are positional (``mean.0``) rather than the parameter names so that any name (dots, slashes) is safe;
the names live in ``names``. Each family writes its own tensors (``_file_tensors``) and rebuilds itself from
them (``_from_file``); :meth:`GaussianPosterior.save` writes the file, :func:`load_posterior` reads it.

safetensors is imported inside those functions: ``import ngvi`` needs only torch and numpy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from ._format import FORMAT, FORMAT_VERSION, safetensors
from .base import GaussianPosterior
from .blktri import BlockTridiagonalGaussian
from .diagonal import DiagonalGaussian
from .full import FullGaussian
from .kronecker import KroneckerGaussian

__all__ = [
    "FAMILIES",
    "FORMAT",
    "FORMAT_VERSION",
    "check_against_model",
    "load_posterior",
    "plain_hyperparameters",
]

#: the families a file may name, by class name
FAMILIES: dict[str, type[GaussianPosterior]] = {
    cls.__name__: cls for cls in (DiagonalGaussian, KroneckerGaussian, FullGaussian, BlockTridiagonalGaussian)
}


def _plain(value: Any) -> Any:
    """A JSON-able copy of a param group's value, or ``_SKIP`` (tensors of more than one value, objects)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, list | tuple):
        items = [_plain(v) for v in value]
        return _SKIP if any(v is _SKIP for v in items) else items
    return _SKIP


_SKIP = object()


def plain_hyperparameters(param_groups: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plain values of each param group (``params`` and non-plain values left out)."""
    out = []
    for group in param_groups:
        kept = {k: _plain(v) for k, v in group.items() if k != "params"}
        out.append({k: v for k, v in kept.items() if v is not _SKIP})
    return out


def _read(path: Path) -> tuple[dict[str, str], dict[str, Tensor]]:
    st = safetensors()
    if not path.is_file():
        raise FileNotFoundError(f"no posterior file at {path}")
    try:
        with st.safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except Exception as err:
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"{path} is not a readable safetensors file ({detail})") from None
    return metadata, tensors


def _json(metadata: dict[str, str], key: str, path: Path) -> Any:
    try:
        return json.loads(metadata[key])
    except (KeyError, json.JSONDecodeError):
        raise ValueError(
            f"{path}: the ngvi metadata is corrupt ({key!r} is missing or not JSON); write it again with "
            "post.save"
        ) from None


def load_posterior(path: str | os.PathLike[str], model: nn.Module | None = None) -> GaussianPosterior:
    """Read a posterior written by :meth:`GaussianPosterior.save` / :func:`ngvi.save_posterior`.

    With ``model`` the file's parameter names and shapes are checked against the model's trainable
    parameters (:func:`check_against_model`) and a mismatch is refused with a ValueError. Tensors are
    loaded on the CPU (move what you need with ``.to``). Every refusal is one line: a missing file, a file
    that is not safetensors, a safetensors file that is not an ngvi posterior, corrupt metadata, an unknown
    family or a newer format version."""
    path = Path(path)
    metadata, tensors = _read(path)
    if metadata.get("format") != FORMAT:
        raise ValueError(
            f"{path} is a safetensors file but not an ngvi posterior (no format={FORMAT!r} in its "
            "metadata); write posteriors with post.save or ngvi.save_posterior"
        )
    version = metadata.get("format_version", "")
    if not version.isdigit():
        raise ValueError(f"{path}: the ngvi metadata is corrupt (format_version {version!r})")
    if int(version) > FORMAT_VERSION:
        raise ValueError(
            f"{path} has posterior format version {version}, this ngvi reads up to {FORMAT_VERSION}: "
            "upgrade ngvi"
        )
    names, shapes = _json(metadata, "names", path), _json(metadata, "shapes", path)
    point, structure = _json(metadata, "point", path), _json(metadata, "structure", path)
    hyper = _json(metadata, "hyperparameters", path)
    if not (isinstance(names, list) and isinstance(shapes, list) and len(names) == len(shapes)):
        raise ValueError(f"{path}: the ngvi metadata is corrupt (names and shapes do not pair up)")
    if model is not None:
        check_against_model(names, [tuple(s) for s in shapes], model, str(path))
    try:
        mean = [tensors[f"mean.{i}"] for i in range(len(names))]
        bad = next((i for i, (m, s) in enumerate(zip(mean, shapes, strict=True)) if list(m.shape) != s), None)
        if bad is not None:
            raise ValueError(f"mean.{bad} has shape {list(mean[bad].shape)}, the metadata says {shapes[bad]}")
        post = _build(metadata.get("family", ""), mean, tensors, point, structure)
    except KeyError as err:
        raise ValueError(f"{path}: tensor {err.args[0]!r} is missing; the file is corrupt") from None
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path}: {str(err).splitlines()[0]}") from None
    return post.annotate(names=names, rule=metadata.get("rule") or None, hyperparameters=hyper)


def _build(
    family: str, mean: list[Tensor], tensors: dict[str, Tensor], point: list[int], structure: dict[str, Any]
) -> GaussianPosterior:
    if family not in FAMILIES:
        raise ValueError(
            f"unknown posterior family {family!r}; this ngvi reads {', '.join(FAMILIES)} (upgrade ngvi?)"
        )
    return FAMILIES[family]._from_file(mean, tensors, point, structure)


def trainable_named(model: nn.Module) -> list[tuple[str, Tensor]]:
    """The model's trainable parameters with their names, in ``named_parameters()`` order."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def check_against_model(
    names: Sequence[str], shapes: Sequence[tuple[int, ...]], model: nn.Module, what: str = "the posterior"
) -> None:
    """Refuse (one-line ValueError naming the first difference) unless ``names`` and ``shapes`` are exactly
    the model's trainable parameters: every name a trainable parameter of that shape, none left out."""
    params = dict(trainable_named(model))
    for name, shape in zip(names, shapes, strict=True):
        if name not in params:
            raise ValueError(
                f"{what} does not match the model: its parameter {name!r} is not a trainable parameter of "
                f"the model (a different architecture, or a wrapper that renames parameters?)"
            )
        if tuple(params[name].shape) != tuple(shape):
            raise ValueError(
                f"{what} does not match the model: parameter {name!r} has shape {list(shape)} in the "
                f"posterior but {list(params[name].shape)} in the model"
            )
    extra = [n for n in params if n not in set(names)]
    if extra:
        raise ValueError(
            f"{what} does not match the model: the model's trainable parameter {extra[0]!r} is not in the "
            "posterior (freeze it, or save the posterior of an optimizer over all of them)"
        )
