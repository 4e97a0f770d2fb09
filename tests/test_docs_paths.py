"""No tracked file names an absolute path of the machine that built it (issue 33).

Commands and results in this repository were produced on build machines whose scratch, home and shared-data
folders a user does not have; a README that says ``--out`` into one of them, or a script that reads data from
one, works nowhere else. Data is found through ``$NGVI_DATA`` (e.g. ``../shared/data``), scratch output goes
to ``runs/...`` or ``$(mktemp -d)``.

The pattern: an absolute path whose first component is one of the roots that hold per-machine state (the
scratch and work folders, root's and users' home folders, macOS's ``Users``), starting at a word boundary so
that a URL's path (``https://host/<root>/...``) or a relative path (``runs/tmp/...``) does not fire. System
folders that code legitimately reads (``/usr/share/datasets``, ``/proc/<pid>``), placeholder paths
(``/path/to/data``) and example cluster paths in docs/PROTOCOLS.md (``/shared/...``) are not machine state
and do not match.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# a path start: line start, whitespace or one of the characters that open a path in prose, code or shell
_START = r"(?:^|(?<=[\s\"'`(\[{<=:,|>]))"
_MACHINE_ROOTS = r"/(?:work|tmp|root|scratch|home/[^/\s]+|Users/[^/\s]+)/"
MACHINE_PATH = re.compile(_START + _MACHINE_ROOTS, re.MULTILINE)

# Files outside this pass's reach, each with its reason; the list shrinks, it does not grow.
KNOWN: dict[str, str] = {}


def machine_paths(text: str) -> list[str]:
    """The lines of ``text`` that name an absolute path of a build machine."""
    return [line.strip() for line in text.splitlines() if MACHINE_PATH.search(line)]


def _tracked() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout (git ls-files failed): nothing to scan")
    return [p for p in out.decode().split("\0") if p]


# the offending examples are spelt in pieces so that this file does not name the paths it forbids
_W, _T, _H, _R = "/" + "work/", "/" + "tmp/", "/" + "home/", "/" + "root/"


@pytest.mark.parametrize(
    "line",
    [
        f"export NGVI_DATA={_W}shared/data",
        f"ngvi logreg --out {_T}vogn-154k",
        f'KJV = Path("{_W}shared/data/text/kjv.txt")',
        f"`{_W}heavy ngvi rl`",
        f'"{_T}i14/uci/fullA": {{',
        f"see {_H}alice/runs/x",
        f"cp x {_R}.cache/y",
    ],
)
def test_pattern_fires_on_machine_paths(line: str) -> None:
    assert machine_paths(line) == [line]


@pytest.mark.parametrize(
    "line",
    [
        "DEBIAN_DIR = Path('/usr/share/datasets/fashion-mnist')",
        "Path(f'/proc/{pid}/stat')",
        "export NGVI_DATA=/path/to/data",
        "NGVI_DATA=/shared/ngvi-data ngvi uci-nng --backend ray",
        "https://example.org/" + "work/tmp/page.html",  # split: this file must not name the path itself
        "--out runs/tmp/x and docs/results/uci",
        "export NGVI_DATA=../shared/data",
        'before=$(mktemp -d) && tar -x -C "$before"',
    ],
)
def test_pattern_spares_legitimate_paths(line: str) -> None:
    assert machine_paths(line) == []


def test_no_tracked_file_names_a_build_machine_path() -> None:
    offenders = []
    for rel in _tracked():
        if rel in KNOWN:
            continue
        path = ROOT / rel
        if not path.is_file():  # deleted in the work tree, or a submodule
            continue
        data = path.read_bytes()
        if b"\0" in data:  # binary (figures)
            continue
        offenders += [f"{rel}: {line[:120]}" for line in machine_paths(data.decode("utf-8", "replace"))]
    assert not offenders, (
        "absolute paths of a build machine in tracked files (use $NGVI_DATA, ../shared/data, runs/... or "
        "$(mktemp -d)):\n" + "\n".join(offenders)
    )
