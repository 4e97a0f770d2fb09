"""The process table from /proc, for the tests that check no process of ours outlives a run."""

from __future__ import annotations

import signal
from pathlib import Path


def descendants(pid: int) -> set[int]:
    """All descendants of ``pid`` (from /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found.update(kids)
        todo += kids
    return found


def alive(pid: int) -> bool:
    try:
        return "Z" not in (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0])
    except OSError:
        return False


def foreground_sigint() -> None:
    """``preexec_fn`` of a child that must take Ctrl-C as a terminal's foreground job does. A shell starts
    background commands (and so a CI runner started with ``&``) with SIGINT ignored; the child would inherit
    that, and Python installs no KeyboardInterrupt handler for an ignored SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
