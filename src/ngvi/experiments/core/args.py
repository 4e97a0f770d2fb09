"""Command-line arguments checked the way the Python API checks its arguments, with one-line errors."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterable
from typing import NoReturn


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
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = int(_number(int, text, "a positive integer"))
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(_number(int, text, "an integer ≥ 0"))
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer ≥ 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = _number(float, text, "a positive number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


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


def add_subset(parser: argparse.ArgumentParser, flag: str, choices: Iterable[str]) -> None:
    """``flag``: a comma-separated subset of ``choices``, all of them by default."""
    known = list(choices)
    parser.add_argument(
        flag,
        type=names(known),
        default=known,
        help=f"comma-separated subset of: {', '.join(known)} (default: all)",
    )
