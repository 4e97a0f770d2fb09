"""Small helpers shared by experiments: results folders, JSON, Markdown tables."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def results_dir(path: str | os.PathLike) -> Path:
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def load_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def save_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically, so a run killed mid-write leaves the previous results intact."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def show_progress() -> bool:
    """Progress bars on an interactive terminal; off in CI logs unless NGVI_PROGRESS=1."""
    flag = os.environ.get("NGVI_PROGRESS")
    return flag == "1" if flag is not None else sys.stderr.isatty()
