"""Ctrl-C and SIGTERM end `ngvi uci --jobs 2` cleanly: no process is left behind, every finished fit is kept
in a valid results.json, and one line says how to resume. Run as a user would: a subprocess, with the
process table checked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import data_dir


def _children(pid: int) -> set[int]:
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


def _alive(pid: int) -> bool:
    try:
        return "Z" not in (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0])
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_interrupt_ends_every_worker_and_keeps_the_results(tmp_path, how):
    if not (data_dir() / "uci").is_dir():
        pytest.skip(f"no UCI data under {data_dir()}")
    out = tmp_path / "out"
    argv = ["uci", "--datasets", "yacht", "--methods", "vadam", "--splits", "20", "--tune", "none"]
    argv += ["--jobs", "2", "--out", str(out), "--data-dir", str(data_dir())]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ngvi.experiments.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        env={**os.environ, "NGVI_PROGRESS": "0"},
    )
    deadline = time.monotonic() + 60
    results = out / "results.json"
    while time.monotonic() < deadline:  # wait until the workers run and a fit has finished
        if results.exists() and json.loads(results.read_text()).get("runs"):
            break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("no fit finished within 60 s")
    workers = _children(proc.pid)
    assert workers, "the run has no worker processes"
    if how == "SIGTERM":
        proc.send_signal(signal.SIGTERM)
    else:  # a terminal sends SIGINT to the whole foreground process group
        os.killpg(proc.pid, signal.SIGINT)
    started = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - started < 10
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "rerun the same command to resume" in err
    time.sleep(0.5)
    assert not [p for p in workers if _alive(p)], "worker processes outlived the run"
    kept = json.loads(results.read_text())["runs"]
    assert 1 <= len(kept) < 20
    assert all(r["rmse"] > 0 for r in kept.values())
