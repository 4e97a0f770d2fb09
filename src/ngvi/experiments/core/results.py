"""A results folder (``--out``): checked before any work starts, written atomically as results arrive.

Every ordinary mistake gets one line that names the path and the fix, and an existing file is never
touched: a path that is a file, a folder that cannot be created or written, and a results file that is not
JSON or not of the expected shape.

**One run per folder** (issue 31). :meth:`ResultsFolder.lock` holds an exclusive ``flock`` on the folder
itself (no lock file is left behind; the kernel drops it when the process ends, however it ends) for the
whole run, and a second run on the same ``--out`` is *refused* at once with one line, rather than made to
wait: it would redo the jobs the first one is running, and a wait of hours would look like a hang. Each
write goes to a temporary file of its own (``.results.json.<pid>.<random>.tmp``) and replaces the file
atomically, and it *merges*: the entries already on disk that the writer does not hold are kept, so no
finished fit is lost to a writer that read the file earlier (a report's view of its own jobs, or a writer
that bypassed the lock).

**Every entry is checked** on reading (:meth:`ResultsFolder.load_results`): the shapes the runner writes
(``config``, ``runs``, ``failed`` with its ``error``, ``wall_seconds``), nesting at most :data:`MAX_DEPTH`
deep, every number one a float can hold; each experiment adds the fields its report reads
(:func:`check_fields`). A bad entry is refused in one line naming the file and the entry, never adopted.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: deepest nesting of a results file (the runner writes about 6 levels)
MAX_DEPTH = 32
_FIX = "remove it or choose another --out (the file is left as it is)"


class ResultsFolder:
    """The folder ``path``, created if missing; refused (ValueError) if it cannot hold results. With
    ``writable=False`` (a folder only read from) it must exist."""

    def __init__(self, path: str | os.PathLike, *, writable: bool = True):
        self.path = Path(path)
        fix = "choose another --out"
        if not writable:
            if not self.path.is_dir():
                raise ValueError(f"{self.path} is not a folder of results")
            return
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(
                f"--out {self.path} is a file, not a folder; {fix} (a folder is created if missing)"
            )
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.path):
                pass
        except OSError as err:
            raise ValueError(f"--out {self.path} is not writable ({err.strerror or err}); {fix}") from None

    def __str__(self) -> str:
        return str(self.path)

    def __fspath__(self) -> str:
        return str(self.path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def load(self, name: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
        """The JSON object in ``name`` ({} if absent); each key in ``required`` must hold an object."""
        file = self.path / name
        if not file.exists():
            return {}
        fix = "move it away or choose another --out (the file is left as it is)"
        try:
            data = json.loads(file.read_bytes())
        except RecursionError:
            raise ValueError(f"{file} is not an ngvi results file (nested too deep to read); {fix}") from None
        except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
            raise ValueError(f"{file} is not valid JSON ({str(err).splitlines()[0][:200]}); {fix}") from None
        except OSError as err:
            raise ValueError(f"{file} cannot be read ({err.strerror or err}); {fix}") from None
        problem = _json_problem(data, (), 0)
        if problem is not None:
            raise ValueError(f"{file} is not an ngvi results file ({problem}); {fix}")
        if not isinstance(data, dict) or any(not isinstance(data.get(k, {}), dict) for k in required):
            shape = "a JSON object" + (
                f" whose {', '.join(map(repr, required))} are objects" if required else ""
            )
            raise ValueError(f"{file} is not an ngvi results file (expected {shape}); {fix}")
        return data

    def load_results(self, name: str = "results.json") -> dict[str, Any]:
        """The runner's results in ``name`` ({} if absent): an object with a ``config`` object and ``runs``,
        an object of job results (each a non-empty object). Anything else (another program's
        ``results.json``, a hand-edited entry) is refused, never adopted or rewritten."""
        data = self.load(name, required=("runs", "config"))
        if not data:
            return data
        file = self.path / name
        missing = [k for k in ("config", "runs") if k not in data]
        if missing:
            raise ValueError(
                f"{file} is not an ngvi results file (no {' or '.join(map(repr, missing))}); {_FIX}"
            )
        for key, result in data["runs"].items():
            if not isinstance(result, dict) or not result:
                raise ValueError(
                    f"{file} is not an ngvi results file (job {key!r} holds {_shown(result)}, not a result); "
                    f"{_FIX}"
                )
        problem = _runner_problem(data)
        if problem is not None:
            raise ValueError(f"{file} is not an ngvi results file ({problem}); {_FIX}")
        return data

    def refuse_entry(self, name: str, key: str, problem: str) -> ValueError:
        """The one-line error for job ``key`` of ``name`` whose result is not what its experiment writes."""
        return ValueError(f"{self.path / name} is not an ngvi results file (job {key!r}: {problem}); {_FIX}")

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the folder for one run: an exclusive ``flock`` on the folder, released on exit (or when the
        process ends). Another holder is refused at once (see the module docstring for why not wait).

        Raises:
            ValueError: another run holds the folder, or it cannot be locked.
        """
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)  # not inherited by the workers (O_CLOEXEC)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ValueError(
                    f"--out {self.path} is in use by another ngvi run: wait for it to end (then rerun this "
                    "command to resume from its results) or choose another --out"
                ) from None
            except OSError as err:
                raise ValueError(
                    f"--out {self.path} cannot be locked for this run ({err.strerror or err}); choose an "
                    "--out on a local file system"
                ) from None
            yield
        finally:
            os.close(fd)  # releases the lock

    def save(self, name: str, data: dict[str, Any]) -> None:
        """Write atomically, so a run killed mid-write leaves the previous file intact, through a temporary
        file of this writer's own, merging what is on disk (a results file by :func:`merged`, any other JSON
        object entry by entry, the writer's winning): no finished entry is lost."""
        file = self.path / name
        try:
            on_disk = json.loads(file.read_bytes())
        except (OSError, ValueError, RecursionError):  # absent, or unreadable: nothing to keep
            on_disk = None
        if isinstance(on_disk, dict):  # a results file merges by section; another (tuned.json) by entry
            data = merged(on_disk, data) if "runs" in data else {**on_disk, **data}
        text = json.dumps(data, indent=2, sort_keys=True)
        tmp = file.with_name(f".{file.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            with open(tmp, "x", encoding="utf-8") as f:  # "x": never another writer's file
                f.write(text)
            os.replace(tmp, file)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def merged(on_disk: dict[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    """``mine`` with the entries of ``on_disk`` it lacks: each object-valued section other than ``config``
    (``runs``, ``hparams``, ...) is the union, ``mine`` winning per key; other values are ``mine``'s where
    it has them. A ``failed`` entry whose job has since finished (it is in the merged ``runs``) is dropped,
    and an empty ``failed`` is left out, as the runner writes it."""
    out = {**on_disk, **mine}
    for key, value in on_disk.items():
        if key != "config" and isinstance(value, dict) and isinstance(mine.get(key), dict):
            out[key] = {**value, **mine[key]}
    runs = out.get("runs")
    if isinstance(out.get("failed"), dict) and isinstance(runs, dict):
        out["failed"] = {k: v for k, v in out["failed"].items() if k not in runs}
        if not out["failed"] and "failed" not in mine:
            del out["failed"]
    return out


def _shown(value: Any) -> str:
    shown = json.dumps(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _where(path: tuple[Any, ...]) -> str:
    return "".join(f"[{p!r}]" for p in path) or "the top level"


def _json_problem(value: Any, path: tuple[Any, ...], depth: int) -> str | None:
    """What makes ``value`` more than plain JSON data the runner could have written, or None."""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} at {_where(path[:3])}..."
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        if type(value) is int and abs(value) > sys.float_info.max:
            return f"{_where(path)} holds an integer of {len(str(abs(value)))} digits, beyond a float"
        return None
    for key, item in items:
        problem = _json_problem(item, (*path, key), depth + 1)
        if problem is not None:
            return problem
    return None


def _runner_problem(data: dict[str, Any]) -> str | None:
    """What in ``data`` the runner never writes: ``failed`` must map job keys to ``{"error": str, ...}``,
    ``wall_seconds`` must be a finite number ≥ 0."""
    failed = data.get("failed", {})
    if not isinstance(failed, dict):
        return f"'failed' holds {_shown(failed)}, not an object of failed jobs"
    for key, entry in failed.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("error"), str)):
            return f"failed job {key!r} holds {_shown(entry)}, not an object with an 'error' string"
        if not isinstance(entry.get("backend", ""), str):
            return f"failed job {key!r} has 'backend' {_shown(entry['backend'])}, not a string"
    if "wall_seconds" in data:
        problem = check_fields(data, {"wall_seconds": "seconds"})
        if problem is not None:
            return problem
    return None


#: the kinds of :func:`check_fields`: what each accepts
KINDS = {
    "number": "a number",
    "seconds": "a finite number ≥ 0",
    "str": "a string",
    "numbers": "a list of numbers",
    "int": "an integer",
}


def _is_number(x: Any) -> bool:
    return type(x) in (int, float)  # not bool


def _fits(kind: str, x: Any) -> bool:
    if kind == "number":
        return _is_number(x)
    if kind == "seconds":
        return _is_number(x) and math.isfinite(x) and x >= 0
    if kind == "str":
        return isinstance(x, str)
    if kind == "numbers":
        return isinstance(x, list) and all(_is_number(v) for v in x)
    if kind == "int":
        return type(x) is int
    raise KeyError(f"unknown field kind {kind!r}; one of {', '.join(KINDS)}")


def check_fields(entry: dict[str, Any], fields: dict[str, str]) -> str | None:
    """What is wrong with ``entry`` against ``fields`` (name → kind, see :data:`KINDS`; a name ending in
    ``?`` is optional), or None. A number may be NaN or infinite (a fit can end so; reports mark it as
    diverged), except a ``seconds``."""
    for name, kind in fields.items():
        optional, name = name.endswith("?"), name.rstrip("?")
        if name not in entry:
            if optional:
                continue
            return f"no {name!r}"
        if not _fits(kind, entry[name]):
            return f"{name!r} is {_shown(entry[name])}, not {KINDS[kind]}"
    return None


def show_progress() -> bool:
    """Progress bars on an interactive terminal; off in CI logs unless NGVI_PROGRESS=1."""
    flag = os.environ.get("NGVI_PROGRESS")
    return flag == "1" if flag is not None else sys.stderr.isatty()
