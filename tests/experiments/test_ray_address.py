"""An unreachable ``--ray-address`` (issue 31, item 8): Ray, given an address where nothing answers,
retried for minutes and took Ctrl-C 3–60 s late. The backend now connects first, with a timeout: one line
and exit 2 where nothing answers, and Ctrl-C ends the wait at once. No Ray is started here; every address is
a loopback one (a refused port, or a listener whose backlog is full, where a connect waits unanswered)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from procs import foreground_sigint

from ngvi.experiments.core.backends import probe_ray_address

ARGV = ["uci", "--datasets", "yacht", "--methods", "vadam", "--tune", "none", "--splits", "1"]
ARGV += ["--backend", "ray", "--jobs", "1"]
ENV = {**os.environ, "NGVI_PROGRESS": "0", "RAY_DISABLE_IMPORT_WARNING": "1"}


def refused_port() -> int:
    """A loopback port where nothing listens (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def silent_port():
    """A loopback port whose listener never accepts and whose backlog is full: a connect there waits."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # fills the backlog
            yield port


def test_a_silent_address_times_out_in_one_line():
    with silent_port() as port:
        start = time.monotonic()
        with pytest.raises(
            ValueError, match=rf"^--ray-address 127.0.0.1:{port}: no Ray cluster answers at "
        ) as err:
            probe_ray_address(f"127.0.0.1:{port}", timeout=0.5)
        assert time.monotonic() - start < 3
    assert "no answer within 0.5 s" in str(err.value) and "start one with `ray start --head`" in str(
        err.value
    )


def test_an_address_that_answers_passes(monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = server.getsockname()[1]
        for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}", f"localhost:{port}"):
            assert probe_ray_address(address, timeout=5) is None
        pytest.importorskip("ray")
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # `auto` takes it, as ray.init does
        assert probe_ray_address("auto", timeout=5) is None
    refused = refused_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{refused}")
    with pytest.raises(
        ValueError, match=rf"^--ray-address auto: no Ray cluster answers at 127.0.0.1:{refused}"
    ):
        probe_ray_address("auto", timeout=5)


@pytest.mark.parametrize("address", ["foo", "127.0.0.1:99999", "127.0.0.1:", ":6379", "127.0.0.1:x"])
def test_a_malformed_address_is_one_line(address):
    with pytest.raises(
        ValueError, match=r"expected host:port \(e.g. 10.0.0.5:6379\), ray://host:port, or auto"
    ):
        probe_ray_address(address)


def test_an_unreachable_address_exits_2_in_one_line(tmp_path):
    pytest.importorskip("ray")
    port = refused_port()
    argv = [*ARGV, "--ray-address", f"127.0.0.1:{port}", "--out", str(tmp_path / "out")]
    start = time.monotonic()
    try:  # before the fix Ray retried for minutes: the timeout is the failure
        done = subprocess.run(
            [sys.executable, "-m", "ngvi.experiments.cli", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            env=ENV,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("ngvi uci --ray-address <a refused port> was still running after 60 s")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        f"ngvi uci: error: --ray-address 127.0.0.1:{port}: no Ray cluster answers at 127.0.0.1:{port}"
    ), done.stderr
    assert done.stderr.count("\n") == 1 and "Connection refused" in done.stderr
    assert time.monotonic() - start < 60


# imports done before "ready", so that Ctrl-C comes while the run waits for the address
CTRL_C = textwrap.dedent(
    """
    import sys
    import ray
    from ngvi.experiments import cli, command
    command("uci")
    print("ready", flush=True)
    sys.exit(cli.main(sys.argv[1:]))
    """
)


def test_ctrl_c_while_waiting_for_the_address_acts_at_once(tmp_path):
    pytest.importorskip("ray")
    with silent_port() as port:
        argv = [*ARGV, "--ray-address", f"127.0.0.1:{port}", "--out", str(tmp_path / "out")]
        proc = subprocess.Popen(
            [sys.executable, "-c", CTRL_C, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=foreground_sigint,  # Ctrl-C at its default, even where this runner ignores it
            env=ENV,
        )
        try:
            assert proc.stdout.readline() == "ready\n"
            time.sleep(1.0)  # into the wait (it lasts CONNECT_TIMEOUT, 10 s)
            os.killpg(proc.pid, signal.SIGINT)
            sent = time.monotonic()
            _, err = proc.communicate(timeout=60)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130, err
    assert err.startswith("ngvi uci: interrupted; 0 finished job(s)") and err.count("\n") == 1, err
    assert took < 3, f"Ctrl-C took {took:.1f} s"  # about 0.1 s; before, 3-60 s
