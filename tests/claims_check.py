"""Recompute the numbers a results README states from the results.json beside it (issue 33).

A claim (one ``[[claim]]`` table of ``docs/results/claims.toml``) names a README (``readme``), the exact text
that must appear in it (``text``, with ``{0}``, ``{1}``, ... where the recomputed values go) and, per
placeholder, how to recompute the value from a results.json (``values = [{expr = ..., fmt = ...}]``):

* ``expr``: a small expression over the results, e.g. ``mean(sel('runs', 'vadam/yacht/*', 'rmse'))``.
  ``sel(seg, ...)`` walks the JSON one segment at a time; a segment is a glob pattern over a dict's keys
  (``*`` matches ``/`` too, as the results' keys contain it) or, on a list, ``*``, an index or a slice
  (``-6:``). It returns the
  matches in natural key order (so ``.../2`` before ``.../10``, and two selections that differ only in a
  fixed part pair up), as a numpy array when all are numbers. Arithmetic and comparisons act element-wise;
  the functions are in ``FUNCTIONS``. Nothing else is evaluated (no names, attributes or keywords), so a
  claims file cannot run code.
* ``each`` / ``over`` (optional): evaluate ``expr`` once per item of ``each``, with ``{e}`` replaced by the
  item, and aggregate the results with the function ``over`` (e.g. ``sum`` of booleans: "on 6 of 8 sets"),
  or with an expression in which ``items()`` is the per-item values (e.g. the per-seed differences:
  ``stagewise_p(array(4, 14, 34), items())``, ``holm(items())[2]``).
* Issue 48's adjusted numbers (``ngvi.experiments.significance``): ``holm``, ``inverse_normal(p, w)``,
  ``one_sided_p``, ``tost_p(x, margin)``, ``sequential_rate(looks, alpha)``, ``stagewise_p(looks, x)``.
* ``fmt``: a format spec (``.2f``, ``d``, ``,.0f``); ``minus = "−"`` prints a negative sign as U+2212, as
  the READMEs do.
* ``results`` (claim level, optional): the results.json, relative to the README's folder; default
  ``results.json``.
* ``other`` (claim level, optional): a second results.json (relative to the README's folder), walked by
  ``osel(...)`` as ``sel`` walks the first: a README that compares a run with an earlier one (kept beside
  it) has both sides, and tests across them (``paired_p(sel(...), osel(...))``), recomputed.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import json
import math
import operator
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ngvi.experiments.significance import (
    holm,
    inverse_normal,
    one_sided_p,
    sequential_rejection_rate,
    stagewise_p,
    t_test_p,
    tost_p,
)

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = ROOT / "docs" / "results" / "claims.toml"


def _natural(key: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key)]


def _as_array(values: list[Any]) -> Any:
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return np.asarray(values, dtype=float)
    return values


def select(data: Any, *segments: str) -> Any:
    """The values of ``data`` under the glob ``segments`` (see the module docstring)."""
    nodes = [data]
    for seg in segments:
        nxt: list[Any] = []
        for node in nodes:
            if isinstance(node, dict):
                keys = sorted((k for k in node if fnmatch.fnmatchcase(k, seg)), key=_natural)
                nxt += [node[k] for k in keys]
            elif isinstance(node, list) and ":" in seg:
                nxt += node[slice(*(int(s) if s else None for s in seg.split(":")))]
            elif isinstance(node, list):
                nxt += node if seg == "*" else [node[int(seg)]]
        nodes = nxt
    if not nodes:
        raise LookupError(f"sel{segments} matches nothing")
    return _as_array(nodes)


def _sem(x: Any) -> float:
    x = np.asarray(x, dtype=float)
    return float(np.std(x, ddof=1) / math.sqrt(len(x)))


def _paired_p(a: Any, b: Any) -> float:
    return t_test_p(np.asarray(a, float) - np.asarray(b, float))


def _trapezoid_mean(y: Any, x: Any) -> float:
    """The mean height of the curve y(x) by the trapezoid rule (``ngvi rl``'s area under the test curve)."""
    x = np.asarray(x, dtype=float)
    return float(np.trapezoid(np.asarray(y, dtype=float), x) / (x[-1] - x[0]))


def _one(x: Any) -> Any:
    if len(x) != 1:
        raise LookupError(f"one() needs exactly one match, got {len(x)}")
    return x[0]


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sel": None,  # type: ignore[dict-item]  # bound to the claim's results in evaluate()
    "mean": lambda x: float(np.mean(x)),
    "median": lambda x: float(np.median(x)),
    "p25": lambda x: float(np.percentile(x, 25)),
    "p75": lambda x: float(np.percentile(x, 75)),
    "std": lambda x: float(np.std(np.asarray(x, float), ddof=1)),
    "sem": _sem,
    "min": lambda x: float(np.min(x)),
    "max": lambda x: float(np.max(x)),
    "argmin": lambda x: int(np.argmin(x)),  # the index of the smallest (the epoch of the lowest loss)
    "sum": lambda x: float(np.sum(x)),
    "count": len,
    "abs": lambda x: np.abs(x),
    "log": lambda x: np.log(x),
    "sqrt": lambda x: np.sqrt(x),
    "array": lambda *x: np.asarray(x, dtype=float),
    "cat": lambda *xs: np.concatenate([np.asarray(x, dtype=float) for x in xs]),
    "one": _one,
    "last": lambda x: x[-1],
    "row_min": lambda rows: np.asarray([np.min(r) for r in rows], dtype=float),  # each run's lowest
    "percentile": lambda x, q: float(np.percentile(x, q)),
    "trapezoid_mean": _trapezoid_mean,
    "count_equal": lambda a, b: sum(x == y for x, y in zip(a, b, strict=True)),  # e.g. the same chosen points
    "pearson": lambda a, b: float(np.corrcoef(np.asarray(a, float), np.asarray(b, float))[0, 1]),
    "row_pearson": lambda a, b: np.asarray(  # one Pearson r per row: each trial's, in natural key order
        [np.corrcoef(np.asarray(x, float), np.asarray(y, float))[0, 1] for x, y in zip(a, b, strict=True)]
    ),
    "paired_p": _paired_p,
    "one_sample_p": t_test_p,
    # issue 48's rule for sequential and multiple tests (ngvi.experiments.significance)
    "one_sided_p": one_sided_p,  # P(T ≥ t): the stage p an inverse-normal combination takes
    "holm": holm,  # Holm's adjusted p of a family, in its order
    "inverse_normal": lambda p, w: inverse_normal(p, w),  # one-sided combined p of stages p with weights w
    "tost_p": tost_p,  # TOST p of differences x within ±margin
    "sequential_rate": lambda looks, alpha: sequential_rejection_rate([int(n) for n in looks], alpha),
    "stagewise_p": lambda looks, x: stagewise_p([int(n) for n in looks], x),
    "items": None,  # type: ignore[dict-item]  # bound to the per-item values of ``each`` in value()
}

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_CMPOPS = {ast.Lt: operator.lt, ast.Gt: operator.gt, ast.LtE: operator.le, ast.GtE: operator.ge}


def _eval(node: ast.AST, funcs: dict[str, Callable[..., Any]]) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body, funcs)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
        return node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        if node.func.id not in funcs:
            raise ValueError(f"unknown function {node.func.id!r}; known: {', '.join(sorted(funcs))}")
        return funcs[node.func.id](*(_eval(a, funcs) for a in node.args))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval(node.left, funcs), _eval(node.right, funcs))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, funcs)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMPOPS:
        return _CMPOPS[type(node.ops[0])](_eval(node.left, funcs), _eval(node.comparators[0], funcs))
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return _eval(node.value, funcs)[node.slice.value]
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.UnaryOp):
        return _eval(node.value, funcs)[_eval(node.slice, funcs)]
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice) and node.slice.step is None:
        lo, hi = (None if b is None else int(_eval(b, funcs)) for b in (node.slice.lower, node.slice.upper))
        return _eval(node.value, funcs)[lo:hi]  # a stage of the per-seed values: items()[14:34]
    raise ValueError(f"not allowed in a claim's expression: {ast.unparse(node)!r}")


def evaluate(expr: str, results: Any, other: Any = None) -> Any:
    """The value of one claim expression over ``results`` (a loaded results.json) and, through ``osel``,
    ``other`` (the claim's second results.json, if it names one)."""
    funcs = {**FUNCTIONS, "sel": lambda *segs: select(results, *segs)}
    if other is not None:
        funcs["osel"] = lambda *segs: select(other, *segs)
    return _eval(ast.parse(expr.strip(), mode="eval"), funcs)


def value(spec: dict[str, Any], results: Any, other: Any = None) -> Any:
    """One placeholder's value: ``expr``, or ``over`` of ``expr`` evaluated for every item of ``each``."""
    if "each" not in spec:
        return evaluate(spec["expr"], results, other)
    per_item = np.asarray(
        [evaluate(spec["expr"].replace("{e}", item), results, other) for item in spec["each"]], dtype=float
    )
    over = spec.get("over", "sum")
    if over in FUNCTIONS:
        return FUNCTIONS[over](per_item)
    # an expression over the per-item values, e.g. "stagewise_p(array(4, 14, 34), items())"
    funcs = {**FUNCTIONS, "items": lambda: per_item}
    return _eval(ast.parse(over.strip(), mode="eval"), funcs)


def render(spec: dict[str, Any], x: Any) -> str:
    if isinstance(x, (np.bool_, bool)):
        x = int(x)
    if isinstance(x, np.generic):
        x = x.item()
    fmt = spec.get("fmt", "")
    if fmt.endswith("d"):
        x = int(np.rint(x))
    out = format(x, fmt)
    return out.replace("-", spec["minus"]) if "minus" in spec else out


_KEYS = {"readme", "text", "values", "results", "other", "note"}
_VALUE_KEYS = {"expr", "fmt", "each", "over", "minus"}


def load_claims(path: Path = CLAIMS) -> list[dict[str, Any]]:
    """The claims of ``path``, each checked for its keys (a misspelt key would silently check less)."""
    claims = tomllib.loads(path.read_text(encoding="utf-8")).get("claim", [])
    for i, c in enumerate(claims):
        where = f"{path.name}, claim {i + 1} ({c.get('text', '?')[:40]!r})"
        if not {"readme", "text", "values"} <= c.keys() or c.keys() - _KEYS:
            raise ValueError(
                f"{where}: needs readme, text, values (optional results, other, note); got {sorted(c)}"
            )
        for v in c["values"]:
            if "expr" not in v or v.keys() - _VALUE_KEYS:
                raise ValueError(f"{where}: a value needs expr (optional {sorted(_VALUE_KEYS - {'expr'})})")
        if len(set(re.findall(r"\{\d\}", c["text"]))) != len(c["values"]):
            raise ValueError(
                f"{where}: text has {{0}}..{{n}} placeholders for each of its {len(c['values'])} values"
            )
    return claims


def results_path(claim: dict[str, Any], root: Path = ROOT) -> Path:
    return (root / claim["readme"]).parent / claim.get("results", "results.json")


def other_path(claim: dict[str, Any], root: Path = ROOT) -> Path | None:
    return (root / claim["readme"]).parent / claim["other"] if "other" in claim else None


@functools.lru_cache(maxsize=8)
def _load(path: Path) -> Any:  # several claims share a results.json of a few MB
    return json.loads(path.read_text(encoding="utf-8"))


def check(claim: dict[str, Any], root: Path = ROOT) -> str | None:
    """None when the README holds the claim's text with every value recomputed; else what differs."""
    results = _load(results_path(claim, root))
    second = other_path(claim, root)
    other = None if second is None else _load(second)
    text = " ".join(claim["text"].split())  # the README is compared with its line breaks as spaces
    for i, spec in enumerate(claim["values"]):
        text = text.replace("{" + str(i) + "}", render(spec, value(spec, results, other)))
    readme = (root / claim["readme"]).read_text(encoding="utf-8")
    if text in " ".join(readme.split()):
        return None
    return (
        f"{claim['readme']} does not contain the recomputed text {text!r} (claim {claim['text']!r}): "
        "either the prose changed or the number no longer matches its results.json"
    )
