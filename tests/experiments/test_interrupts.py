"""Ctrl-C and SIGTERM end `ngvi uci --jobs 2` cleanly: no process is left behind, every finished fit is kept
in a valid results.json, and one line says how to resume. Run as a user would: a subprocess, with the
process table checked."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from procs import alive, descendants, foreground_sigint

from ngvi.experiments.core import runner
from ngvi.experiments.core.runner import Experiment, Workers


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_interrupt_ends_every_worker_and_keeps_the_results(tmp_path, how, data_dir):
    if not (data_dir / "uci").is_dir():
        pytest.skip(f"no UCI data under {data_dir}")
    out = tmp_path / "out"
    argv = ["uci", "--datasets", "yacht", "--methods", "vadam", "--splits", "20", "--tune", "none"]
    argv += ["--jobs", "2", "--out", str(out), "--data-dir", str(data_dir)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ngvi.experiments.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=foreground_sigint,  # ... with Ctrl-C at its default, even where this runner ignores it
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
    workers = descendants(proc.pid)
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
    assert not [p for p in workers if alive(p)], "worker processes outlived the run"
    kept = json.loads(results.read_text())["runs"]
    assert 1 <= len(kept) < 20
    assert all(r["rmse"] > 0 for r in kept.values())


class Sleep(Experiment):
    """Each job sleeps ``seconds`` (after writing its pid to ``dir``, if given)."""

    name = "sleep"

    def run_job(self, spec: dict) -> dict:
        if spec.get("dir"):
            Path(spec["dir"], str(os.getpid())).touch()
        time.sleep(spec["seconds"])
        return {"slept": spec["seconds"]}


def test_an_interrupted_pool_ends_without_a_thread_traceback(monkeypatch):
    """Interrupted while jobs are pending, then the workers end: before, the generator of pool.map
    cancelled the pending futures while the pool's thread failed each of them, and that thread printed an
    InvalidStateError traceback (when it saw the dead workers before the shutdown)."""
    errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    workers = Workers(2)
    results = workers.map(Sleep(), [{"seconds": 0.0}] + [{"seconds": 30.0}] * 10)
    assert next(results) == {"slept": 0.0}
    results.close()  # what an interrupt raised at the yield does
    for process in list(workers.pool._processes.values()):
        process.kill()
    time.sleep(1.0)  # the pool's thread finds its workers dead and fails every pending future
    workers.close(terminate=True)
    assert errors == []


DRIVER = """
import sys
sys.path[:0] = {paths!r}
from ngvi.experiments.core.runner import Workers
from test_interrupts import Sleep
if __name__ == "__main__":  # the workers import this file again
    next(Workers(2).map(Sleep(), [{{"seconds": 60.0, "dir": {dir!r}}}] * 2))
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_workers_exit_when_the_main_process_is_killed(tmp_path):
    """SIGKILL leaves no handler to run: each worker must notice by itself that its parent died."""
    pids = tmp_path / "pids"
    pids.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(
        DRIVER.format(paths=[str(Path(__file__).parent), str(Path(__file__).parents[1])], dir=str(pids))
    )
    proc = subprocess.Popen([sys.executable, str(driver)], start_new_session=True)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            workers = [int(p.name) for p in pids.iterdir()]
        assert len(workers) == 2, "the jobs did not start within 30 s"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in workers if alive(p)], "workers kept running after their parent was killed"
    finally:
        proc.kill()
        for pid in workers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("pidfd", [True, False])
def test_the_main_watch_fires_once_the_process_is_gone(monkeypatch, pidfd):
    """The watch each worker runs, on a pidfd (Linux) and by polling (elsewhere): it fires once the watched
    process exits, and at once for a process already gone."""
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    elif not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfd on this platform")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    fired = []
    watch = threading.Thread(target=runner._watch_main, args=(proc.pid, lambda: fired.append(1), 0.05))
    watch.start()
    time.sleep(0.1)
    assert not fired  # still running
    proc.wait()
    watch.join(timeout=5)
    assert fired == [1]
    runner._watch_main(proc.pid, lambda: fired.append(2), 0.05)  # gone before the watch starts
    assert fired == [1, 2]
