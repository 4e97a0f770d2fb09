"""Command-line arguments checked the way the Python API checks its arguments, with one-line errors.

Every number is finite and within a stated range (an integer at most ``MAX_INT``), so a typo fails at
parse time with exit 2 instead of as a traceback after minutes of work."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

#: the largest integer any count or seed accepts: far above every real run, far below what overflows
MAX_INT = 10**9
#: the most worker processes ``--jobs`` starts
MAX_JOBS = 1024
#: ``add_subset``'s default default: every choice
_ALL = object()


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line naming the command, the problem and where to look."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


def _number(kind: Callable[[str], float], text: str, what: str) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def int_range(low: int, high: int = MAX_INT) -> Callable[[str], int]:
    """An integer in [low, high]."""
    what = {0: "an integer ≥ 0", 1: "a positive integer"}.get(low, f"an integer ≥ {low}")

    def parse(text: str) -> int:
        value = int(_number(int, text, what))
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        if value > high:
            raise argparse.ArgumentTypeError(f"expected {what} up to {high:,}, got {text}")
        return value

    return parse


positive_int = int_range(1)
non_negative_int = int_range(0)
jobs = int_range(1, MAX_JOBS)


def float_range(low: float, high: float) -> Callable[[str], float]:
    """A finite number in [low, high]."""
    what = f"a number from {low:g} to {high:g}"

    def parse(text: str) -> float:
        value = _number(float, text, what)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return value

    return parse


def float_list(low: float, high: float) -> Callable[[str], list[float]]:
    """A comma-separated list (at least one) of finite numbers in [low, high]."""
    one = float_range(low, high)

    def parse(text: str) -> list[float]:
        values = [one(t.strip()) for t in text.split(",") if t.strip()]
        if not values:
            raise argparse.ArgumentTypeError("expected at least one number")
        return values

    return parse


def positive_float(text: str) -> float:
    value = _number(float, text, "a positive number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def out_folder(text: str) -> str:
    """A results folder: a non-empty path (``''`` would mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder name, got an empty one (use --out . for here)")
    return text


def device(text: str) -> str:
    """A torch device that exists on this machine: cpu, or an available accelerator (cuda, cuda:1, mps)."""
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"unknown device {text!r}; use cpu, cuda, cuda:1, mps, ..."
        ) from None
    kinds = {"cpu"}
    if torch.cuda.is_available():
        kinds.add("cuda")
    if torch.accelerator.is_available() and (accelerator := torch.accelerator.current_accelerator()):
        kinds.add(accelerator.type)
    if dev.type not in kinds:  # 'meta' included: it holds no values to time or train
        raise argparse.ArgumentTypeError(
            f"device {text!r} is not available here; use {' or '.join(sorted(kinds))}"
        )
    count = torch.accelerator.device_count() if dev.type != "cpu" else 1
    if dev.index is not None and dev.index >= count:
        raise argparse.ArgumentTypeError(
            f"device {text!r} is not available here: {count} {dev.type} device(s)"
        )
    return str(dev)


def names(choices: Iterable[str] | None = None, aliases: Callable[[str], str] | None = None) -> Callable:
    """A comma-separated list of names (at least one), each in ``choices`` after ``aliases``."""
    known = None if choices is None else list(choices)

    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected at least one name")
        if aliases is not None:
            try:
                items = [aliases(t) for t in items]
            except ValueError as err:
                raise argparse.ArgumentTypeError(str(err)) from None
        unknown = [t for t in items if known is not None and t not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose from {', '.join(known)}")
        return list(dict.fromkeys(items))

    return parse


def add_subset(
    parser: argparse.ArgumentParser,
    flag: str,
    choices: Iterable[str],
    help: str | None = None,
    default: Any = _ALL,
) -> None:
    """``flag``: a comma-separated subset of ``choices``, ``default`` (all of them unless given) when left
    out."""
    known = list(choices)
    help = help or f"comma-separated subset of: {', '.join(known)} (default: all)"
    parser.add_argument(flag, type=names(known), default=known if default is _ALL else default, help=help)


def add_count(
    parser: argparse.ArgumentParser, flag: str, default: int | None, help: str, low: int = 1
) -> None:
    """``flag``: an integer ≥ ``low`` (a count, a size, a number of steps)."""
    parser.add_argument(flag, type=int_range(low), default=default, help=help)


def add_quick(parser: argparse.ArgumentParser, help: str) -> None:
    """``--quick``: the experiment's smoke run, ``help`` saying what it shrinks."""
    parser.add_argument("--quick", action="store_true", help=help)


def add_data_dir(parser: argparse.ArgumentParser, what: str = "data folder") -> None:
    """``--data-dir``: where the data sets are, $NGVI_DATA when left out."""
    parser.add_argument("--data-dir", default=None, help=f"{what} (default: $NGVI_DATA)")


def add_merge_from(parser: argparse.ArgumentParser, help: str) -> None:
    """``--merge-from``: results folders of the same protocol whose records are copied in first."""
    parser.add_argument("--merge-from", type=names(), default=[], help=help)


def add_uci_datasets(parser: argparse.ArgumentParser, default: Iterable[str], which: str) -> None:
    """``--datasets``: UCI sets by name or alias, ``default`` (described as ``which``) when left out."""
    from ..data.uci import uci_name

    parser.add_argument(
        "--datasets",
        type=names(aliases=uci_name),
        default=list(default),
        help=f"comma-separated UCI sets (aliases: boston, naval, power, wine, protein); default: {which}",
    )


def with_quick(args: argparse.Namespace, defaults: dict[str, Any], quick: dict[str, Any]) -> dict[str, Any]:
    """The values of the options named in ``defaults`` (their argparse defaults are None, so a given option
    is told apart from one left out): an option given on the command line wins; one left out takes its
    ``quick`` value under ``--quick``, else its default. So ``--quick --angles 30`` rotates by 30 degrees."""
    values = {}
    for key, default in defaults.items():
        given = getattr(args, key)
        values[key] = given if given is not None else quick.get(key, default) if args.quick else default
    return values
