r"""Posteriors as files: one safetensors file per posterior, never a pickle.

A file holds the tensors that rebuild the posterior exactly and, in the safetensors header's string→string
metadata, what they mean:

=====================  ===================================================================================
``format``             ``"ngvi.posterior"`` (what marks a file as ours)
``format_version``     ``"2"``; a file of a newer version is refused (upgrade ngvi); version 1 files (no
                       buffers) are read
``ngvi_version``       the ngvi that wrote it
``family``             ``DiagonalGaussian``, ``KroneckerGaussian``, ``FullGaussian`` or
                       ``BlockTridiagonalGaussian``
``names``              JSON list: the parameter names, in the posterior's (= the optimizer's) order
``shapes``, ``dtypes`` JSON lists, one entry per parameter
``point``              JSON list: indices of point-estimate parameters
``structure``          JSON: what the family needs beyond tensors (blocks, layers, scale)
``rule``               the optimizer's class name (``""`` if unknown); a Python class name, nothing else
                       (what a file says reaches model cards and logs: no markup, links or line breaks)
``hyperparameters``    JSON list, one dict per param group: its plain values (numbers, strings, bools,
                       None, lists of them); tensors and other objects are left out
``buffers``            JSON list: the names of the model's persistent buffers (batch-norm running
                       statistics, ...) that the file carries; absent where the posterior knows none
=====================  ===================================================================================

Tensors: ``mean.<i>`` for parameter i and, by family, ``variance.<i>`` (diagonal), ``block.<k>.row_cov``
and ``block.<k>.col_cov`` (Kronecker), ``covariance`` (full), ``chain.<k>.<field>`` (block tridiagonal:
the :class:`~ngvi.curvature.tridiagonal.ChainLayer` tensors), and ``buffer.<j>`` for the j-th buffer. They are
stored as the posterior holds them
(the covariances in float64), so the rebuilt posterior's mean, variance, samples (same generator),
``log_prob``, ``kl`` and ``snr`` equal the saved one's bitwise.

Keys are positional (``mean.0``) rather than the parameter names so that any name (dots, slashes) is safe;
the names live in ``names``. Each family writes its own tensors (``_file_tensors``) and rebuilds itself from
them (``_from_file``); :meth:`GaussianPosterior.save` writes the file, :func:`load_posterior` reads it.

**Buffers.** A prediction uses the model's persistent buffers beside its weights (batch norm's running
statistics), and a freshly built model has the defaults, so a file carries them: :func:`ngvi.save_posterior`
records the model's persistent buffers, :class:`ngvi.PosteriorSampler` writes them into the model, and a
posterior that carries none (a version 1 file, or one saved without them) is refused against a model that
has persistent buffers (:func:`check_buffers`).

**Untrusted files.** A file may come from anywhere, so :func:`load_posterior` checks every metadata value
for its type, every tensor for its dtype, shape and finiteness, and reports whatever a family's constructor
raises on malformed tensors as one ValueError naming the file. Strings from a file reach messages only
through :func:`quoted` (``repr``, cut short), and the rule only when it is a class name.

safetensors is imported inside those functions: ``import ngvi`` needs only torch and numpy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ._format import FORMAT, FORMAT_VERSION, is_rule_name, safetensors
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
    "check_buffers",
    "is_rule_name",
    "load_posterior",
    "persistent_buffers",
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
        raise ValueError(f"{path} is not a readable safetensors file ({quoted(detail, 120)})") from None
    return metadata, tensors


class _Corrupt(ValueError):
    """A file that does not hold what its metadata says (the message is prefixed with the path)."""


def quoted(text: str, limit: int = 60) -> str:
    """``repr`` of a string read from a file, cut to ``limit`` characters: safe in a one-line message or a
    log (quotes, newlines, control characters escaped) whatever the file holds."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _json(metadata: dict[str, str], key: str) -> Any:
    try:
        return json.loads(metadata[key])
    except (KeyError, ValueError, RecursionError):  # RecursionError: a value nested too deep to parse
        raise _Corrupt(
            f"the ngvi metadata is corrupt ({key!r} is missing or not JSON); write it again with post.save"
        ) from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _strings(value: Any, key: str, count: int | None = None) -> list[str]:
    """A JSON list of unique strings (names)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Corrupt(f"the ngvi metadata is corrupt ({key!r} must be a list of strings)")
    if count is not None and len(value) != count:
        raise _Corrupt(f"the ngvi metadata is corrupt ({key!r} has {len(value)} entries for {count} tensors)")
    seen: set[str] = set()
    for v in value:
        if v in seen:
            raise _Corrupt(f"{key!r} lists {quoted(v)} twice; each parameter or buffer is named once")
        seen.add(v)
    return value


def _metadata(metadata: dict[str, str]) -> dict[str, Any]:
    """The ngvi metadata, each entry checked for its type (the values of a file are data from anywhere)."""
    version = metadata.get("format_version", "")
    if not (version.isascii() and version.isdigit()):  # "²".isdigit() is True; int("²") fails
        raise _Corrupt(f"the ngvi metadata is corrupt (format_version {quoted(version)})")
    if int(version) > FORMAT_VERSION:
        raise _Corrupt(
            f"has posterior format version {int(version)}, this ngvi reads up to {FORMAT_VERSION}: "
            "upgrade ngvi"
        )
    family = metadata.get("family", "")
    if family not in FAMILIES:
        raise _Corrupt(
            f"unknown posterior family {quoted(family)}; this ngvi reads {', '.join(FAMILIES)} "
            "(upgrade ngvi?)"
        )
    names = _json(metadata, "names")
    shapes = _json(metadata, "shapes")
    if not (isinstance(names, list) and isinstance(shapes, list) and len(names) == len(shapes)):
        raise _Corrupt("the ngvi metadata is corrupt (names and shapes do not pair up)")
    names = _strings(names, "names")
    if not all(isinstance(s, list) and all(_is_int(d) and d >= 0 for d in s) for s in shapes):
        raise _Corrupt("the ngvi metadata is corrupt ('shapes' must be lists of sizes >= 0)")
    dtypes = _json(metadata, "dtypes") if "dtypes" in metadata else None
    if dtypes is not None and not (
        isinstance(dtypes, list) and len(dtypes) == len(names) and all(isinstance(d, str) for d in dtypes)
    ):
        raise _Corrupt("the ngvi metadata is corrupt ('dtypes' must name one dtype per parameter)")
    point = _json(metadata, "point")
    if not (isinstance(point, list) and all(_is_int(i) and 0 <= i < len(names) for i in point)):
        raise _Corrupt(
            f"the ngvi metadata is corrupt ('point' must list parameter indices below {len(names)})"
        )
    structure = _json(metadata, "structure")
    if not isinstance(structure, dict):
        raise _Corrupt("the ngvi metadata is corrupt ('structure' must be a JSON object)")
    hyper = _json(metadata, "hyperparameters")
    if not (isinstance(hyper, list) and all(isinstance(g, dict) for g in hyper)):
        raise _Corrupt("the ngvi metadata is corrupt ('hyperparameters' must be a list of JSON objects)")
    rule = metadata.get("rule", "")
    if rule and not is_rule_name(rule):
        raise _Corrupt(
            f"the ngvi metadata is corrupt (rule {quoted(rule)} is not an optimizer's class name); a "
            "posterior file names its rule as ngvi.save_posterior writes it (e.g. 'IVON')"
        )
    buffers = _strings(_json(metadata, "buffers"), "buffers") if "buffers" in metadata else None
    return {
        "family": family, "names": names, "shapes": shapes, "dtypes": dtypes, "point": point,
        "structure": structure, "hyperparameters": hyper, "rule": rule or None, "buffers": buffers,
    }  # fmt: skip


#: the dtypes a posterior's means may have (what a draw θ = μ + σε is formed in)
MEAN_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _checked_tensors(
    meta: dict[str, Any], tensors: dict[str, Tensor]
) -> tuple[list[Tensor], dict[str, Tensor]]:
    """The means and the buffers, after checking every tensor's dtype, shape and finiteness."""
    names, shapes, dtypes = meta["names"], meta["shapes"], meta["dtypes"]
    mean = []
    for i in range(len(names)):
        key = f"mean.{i}"
        if key not in tensors:
            raise _Corrupt(f"tensor {key!r} is missing; the file is corrupt")
        m = tensors[key]
        if m.dtype not in MEAN_DTYPES:
            raise _Corrupt(
                f"{key} has dtype {_dtype_name(m.dtype)}; a posterior's means are float16, bfloat16, "
                "float32 or float64 (the file is corrupt, or not written by ngvi)"
            )
        if dtypes is not None and dtypes[i] != _dtype_name(m.dtype):
            raise _Corrupt(f"{key} has dtype {_dtype_name(m.dtype)}, the metadata says {quoted(dtypes[i])}")
        if list(m.shape) != shapes[i]:
            raise _Corrupt(f"{key} has shape {list(m.shape)}, the metadata says {shapes[i]}")
        mean.append(m)
    for key, t in tensors.items():  # the means and the family's tensors: finite floating point
        if key.startswith("buffer."):
            continue
        if t.dtype not in MEAN_DTYPES:
            raise _Corrupt(
                f"tensor {quoted(key)} has dtype {_dtype_name(t.dtype)}; a posterior's are floating point"
            )
        if not bool(torch.isfinite(t).all()):
            raise _Corrupt(f"tensor {quoted(key)} holds NaN or inf values; a posterior's tensors are finite")
    buffers = {}
    for i, name in enumerate(meta["buffers"] or []):
        key = f"buffer.{i}"
        if key not in tensors:
            raise _Corrupt(f"tensor {key!r} is missing; the file is corrupt")
        b = tensors[key]
        if b.is_floating_point() and bool(torch.isnan(b).any()):  # ±inf is allowed: attention masks hold it
            raise _Corrupt(f"buffer {quoted(name)} ({key}) holds NaN values")
        buffers[name] = b
    return mean, buffers


#: what a family's constructor may raise on tensors that are not what they should be (a factor that is not
#: square or not invertible, a missing link): all reported as a corrupt file
_BUILD_ERRORS = (ValueError, TypeError, RuntimeError, AttributeError, IndexError, KeyError, ArithmeticError)


def load_posterior(path: str | os.PathLike[str], model: nn.Module | None = None) -> GaussianPosterior:
    """Read a posterior written by :meth:`GaussianPosterior.save` / :func:`ngvi.save_posterior`.

    With ``model`` the file's parameter names and shapes are checked against the model's parameters
    (:func:`check_against_model`) and its buffers against the model's persistent buffers
    (:func:`check_buffers`); a mismatch is refused with a ValueError. Tensors are loaded on the CPU (move
    what you need with ``.to``). Every refusal is a one-line ValueError naming the file (or a
    FileNotFoundError): a file that is not safetensors, a safetensors file that is not an ngvi posterior,
    corrupt metadata (of the wrong type, a name given twice, a rule that is not a class name), an unknown
    family or a newer format version, means that are not floating point, any tensor of the posterior that
    is not finite, a family's tensors of the wrong shapes, a NaN buffer. What loads has finite means and
    variances shaped as its metadata says."""
    path = Path(path)
    metadata, tensors = _read(path)
    if metadata.get("format") != FORMAT:
        raise ValueError(
            f"{path} is a safetensors file but not an ngvi posterior (no format={FORMAT!r} in its "
            "metadata); write posteriors with post.save or ngvi.save_posterior"
        )
    try:
        meta = _metadata(metadata)
        if model is not None:
            check_against_model(meta["names"], [tuple(s) for s in meta["shapes"]], model, str(path))
        mean, buffers = _checked_tensors(meta, tensors)
        try:
            post = FAMILIES[meta["family"]]._from_file(mean, tensors, meta["point"], meta["structure"])
        except _Corrupt:
            raise
        except KeyError as err:
            raise _Corrupt(f"tensor {quoted(str(err.args[0]))} is missing; the file is corrupt") from None
        except _BUILD_ERRORS as err:
            detail = (str(err).splitlines() or [""])[0] or type(err).__name__
            raise _Corrupt(
                f"the {meta['family']} tensors do not make a posterior ({quoted(detail, 160)})"
            ) from None
        bad = next((i for i, v in enumerate(post.variance) if not bool(torch.isfinite(v).all())), None)
        if bad is not None:
            raise _Corrupt(f"the variance of parameter {bad} is not finite; the file is corrupt")
    except _Corrupt as err:
        raise ValueError(f"{path}: {err}") from None
    post.annotate(
        names=meta["names"], rule=meta["rule"], hyperparameters=meta["hyperparameters"],
        buffers=None if meta["buffers"] is None else buffers,
    )  # fmt: skip
    if model is not None:
        check_buffers(post.buffers, model, str(path))
    return post


def trainable_named(model: nn.Module) -> list[tuple[str, Tensor]]:
    """The model's trainable parameters with their names, in ``named_parameters()`` order."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def check_against_model(
    names: Sequence[str], shapes: Sequence[tuple[int, ...]], model: nn.Module, what: str = "the posterior"
) -> None:
    """Refuse (one-line ValueError naming the first difference) unless ``names`` and ``shapes`` are
    parameters of the model, each named once and of its shape, and every trainable parameter of the model
    is among them. Frozen parameters may be in the posterior (a model frozen for inference,
    ``model.requires_grad_(False)``) or not (frozen while training: the optimizer never saw them)."""
    params = dict(model.named_parameters())
    seen: set[str] = set()
    for name, shape in zip(names, shapes, strict=True):
        if name in seen:
            raise ValueError(
                f"{what} names the parameter {quoted(name)} twice; each parameter is named once (write the "
                "file again with ngvi.save_posterior)"
            )
        seen.add(name)
        if name not in params:
            raise ValueError(
                f"{what} does not match the model: its parameter {quoted(name)} is not a parameter of the "
                f"model (a different architecture, or a wrapper that renames parameters?)"
            )
        if tuple(params[name].shape) != tuple(shape):
            raise ValueError(
                f"{what} does not match the model: parameter {quoted(name)} has shape {list(shape)} in the "
                f"posterior but {list(params[name].shape)} in the model"
            )
    extra = [n for n, _ in trainable_named(model) if n not in seen]
    if extra:
        raise ValueError(
            f"{what} does not match the model: the model's trainable parameter {extra[0]!r} is not in the "
            "posterior (freeze it, or save the posterior of an optimizer over all of them)"
        )


def persistent_buffers(model: nn.Module) -> dict[str, Tensor]:
    """The model's buffers that its ``state_dict`` holds (batch-norm running statistics and counts, any
    buffer registered with ``persistent=True``), by name: the state a prediction uses beside the weights."""
    named = dict(model.named_buffers(remove_duplicate=False))
    return {k: named[k] for k in model.state_dict(keep_vars=True) if k in named}


def check_buffers(
    buffers: Mapping[str, Tensor] | None, model: nn.Module, what: str = "the posterior"
) -> None:
    """Refuse (one-line ValueError) a posterior whose buffers are not the model's persistent buffers, each
    of its shape (and floating point where the model's is), or, where the posterior carries none
    (``buffers`` None: a file of format version 1, or a posterior saved without them), a model that has
    persistent buffers: predictions with its own (a fresh model's batch-norm statistics) would be wrong."""
    expected = persistent_buffers(model)
    if buffers is None:
        if expected:
            first = next(iter(expected))
            raise ValueError(
                f"{what} carries no buffers, but the model has {len(expected)} persistent buffer(s) its "
                f"predictions use (e.g. {first!r}): save the posterior with ngvi.save_posterior(model, opt, "
                "path), which records them (or post.annotate(buffers=...) before post.save)"
            )
        return
    for name, value in buffers.items():
        if name not in expected:
            raise ValueError(
                f"{what} does not match the model: its buffer {quoted(name)} is not a persistent buffer of "
                "the model (a different architecture?)"
            )
        own = expected[name]
        if tuple(own.shape) != tuple(value.shape):
            raise ValueError(
                f"{what} does not match the model: buffer {quoted(name)} has shape {list(value.shape)} in "
                f"the posterior but {list(own.shape)} in the model"
            )
        if own.is_floating_point() != value.is_floating_point() or (
            not own.is_floating_point() and own.dtype != value.dtype
        ):
            raise ValueError(
                f"{what} does not match the model: buffer {quoted(name)} is {_dtype_name(value.dtype)} in "
                f"the posterior but {_dtype_name(own.dtype)} in the model"
            )
    missing = [n for n in expected if n not in buffers]
    if missing:
        raise ValueError(
            f"{what} does not match the model: the model's persistent buffer {missing[0]!r} is not in the "
            "posterior (a different architecture? save it again with ngvi.save_posterior(model, opt, path))"
        )
