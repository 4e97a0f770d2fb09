"""A results folder (``--out``): checked before any work starts, written atomically as results arrive.

Every ordinary mistake gets one line that names the path and the fix, and an existing file is never
touched: a path that is a file, a folder that cannot be created or written, and a results file that is not
JSON or not of the expected shape.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any


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
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{file} is not valid JSON ({err}); {fix}") from None
        except OSError as err:
            raise ValueError(f"{file} cannot be read ({err.strerror or err}); {fix}") from None
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
        fix = "remove it or choose another --out (the file is left as it is)"
        missing = [k for k in ("config", "runs") if k not in data]
        if missing:
            raise ValueError(
                f"{file} is not an ngvi results file (no {' or '.join(map(repr, missing))}); {fix}"
            )
        for key, result in data["runs"].items():
            if not isinstance(result, dict) or not result:
                shown = json.dumps(result)
                shown = shown if len(shown) <= 40 else shown[:37] + "..."
                raise ValueError(
                    f"{file} is not an ngvi results file (job {key!r} holds {shown}, not a result); {fix}"
                )
        return data

    def save(self, name: str, data: dict[str, Any]) -> None:
        """Write atomically, so a run killed mid-write leaves the previous file intact."""
        file = self.path / name
        tmp = file.with_suffix(file.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        tmp.replace(file)


def show_progress() -> bool:
    """Progress bars on an interactive terminal; off in CI logs unless NGVI_PROGRESS=1."""
    flag = os.environ.get("NGVI_PROGRESS")
    return flag == "1" if flag is not None else sys.stderr.isatty()
