"""Where the runner's jobs run: :class:`LocalBackend` (worker processes on this machine) or
:class:`RayBackend` (Ray tasks, on a local Ray instance or a cluster).

Both give the same two calls: ``completed`` (each job's outcome as it finishes, with its index) and ``map``
(results in order, for work inside ``prepare`` such as tuning), and ``close``. A job runs with one torch
thread on either backend, and is seeded from its spec alone, so the two backends give bitwise-equal
results. Ray is imported only by :class:`RayBackend`.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol

import torch


class Experiment(Protocol):
    """What a backend needs of an experiment (:class:`.runner.Experiment`): how to run one job, and what a
    job needs of a machine."""

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]: ...

    def resources(self, spec: dict[str, Any]) -> dict[str, float]: ...


#: how many times Ray reruns a job whose worker process died before recording it as failed
MAX_RETRIES = 3
#: seconds that ``--ray-address`` has to accept a connection before the run gives up (see probe_ray_address)
CONNECT_TIMEOUT = 10.0
#: the port of a Ray Client server (``ray://host``) when the address names none
RAY_CLIENT_PORT = 10001
BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class Failed:
    """A job that did not finish: its worker died more than ``MAX_RETRIES`` times, or it raised (Ray)."""

    error: str


Outcome = dict[str, Any] | Failed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def _watch_main(pid: int, on_exit: Callable[[], None], interval: float = 1.0) -> None:
    """Call ``on_exit`` once process ``pid`` has ended: waits on a pidfd where the OS has them (Linux), else
    polls every ``interval`` seconds."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        fd = None
        interval = 0.0
    except (AttributeError, OSError):  # not Linux, or a kernel before 5.3
        fd = None
    if fd is not None:
        select.select([fd], [], [])  # readable once the process has exited
        os.close(fd)
    else:
        while interval and _alive(pid):
            time.sleep(interval)
    on_exit()


def _worker_init(main_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    # A SIGKILLed run runs no cleanup: each worker ends itself when the main process is gone. (A parent-death
    # signal would not do: a worker's parent is the fork server, which lives on while workers hold its pipe.)
    threading.Thread(
        target=_watch_main,
        args=(main_pid, lambda: os.kill(os.getpid(), signal.SIGTERM)),
        daemon=True,
        name="ngvi-main-watch",
    ).start()
    torch.set_num_threads(1)


def _call(task: tuple[Experiment, dict[str, Any]]) -> dict[str, Any]:
    experiment, spec = task
    return experiment.run_job(spec)


class LocalBackend:
    """``jobs`` worker processes (one torch thread each), or this process for ``jobs == 1``.

    Workers start from a fork server, not by forking this process: a fork inherits the locks held by this
    process's other threads (torch's thread pools, progress bars) and can hang on them. A worker that dies
    fails the run (BrokenProcessPool) instead of hanging it; a job that raises stops the run."""

    name = "local"

    def __init__(self, jobs: int):
        self.pool = None
        if jobs > 1:
            context = multiprocessing.get_context("forkserver")
            self.pool = ProcessPoolExecutor(
                jobs, mp_context=context, initializer=_worker_init, initargs=(os.getpid(),)
            )

    def completed(
        self, experiment: Experiment, specs: Sequence[dict[str, Any]]
    ) -> Iterator[tuple[int, Outcome]]:
        """(index, result) of each spec, as the jobs finish."""
        if self.pool is None:
            yield from enumerate(self.map(experiment, specs))
            return
        # Only the pool's thread ever cancels or fails these futures (an interrupt closes this generator):
        # cancelling them here as well raced it into InvalidStateError tracebacks.
        pending = {self.pool.submit(_call, (experiment, s)): i for i, s in enumerate(specs)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=pending.__getitem__):
                yield pending.pop(future), future.result()

    def map(self, experiment: Experiment, specs: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The results of ``experiment.run_job`` on ``specs``, in order, as they finish."""
        if self.pool is not None:
            futures = [self.pool.submit(_call, (experiment, s)) for s in specs]
            for future in futures:
                yield future.result()
            return
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for spec in specs:
                yield experiment.run_job(spec)
        finally:
            torch.set_num_threads(threads)

    def close(self, terminate: bool = False) -> None:
        if self.pool is None:
            return
        if terminate:  # end the running jobs now (the executor would wait for them)
            for process in list(getattr(self.pool, "_processes", {}).values()):
                process.terminate()
        self.pool.shutdown(wait=True, cancel_futures=terminate)


def _ray_job(experiment: Experiment, spec: dict[str, Any], threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)  # as in a local worker: results equal bitwise only at equal thread counts
    return experiment.run_job(spec)


def import_ray() -> Any:
    """Ray, or the one-line error that names the ``cluster`` extra."""
    try:
        import ray
    except ModuleNotFoundError as err:
        if (err.name or "").partition(".")[0] != "ray":
            raise
        raise ModuleNotFoundError(
            '--backend ray needs the cluster extra: pip install "ngvi[cluster]" (missing: ray)', name="ray"
        ) from None
    return ray


def probe_ray_address(address: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Raise a one-line ValueError unless something at ``address`` accepts a TCP connection within
    ``timeout`` seconds.

    Ray itself, given an address where nothing answers, retries in C++ for minutes, where Ctrl-C is acted
    on only between its waits (3–60 s later). So we connect first, from Python: a refused or silent port
    fails in one line, and Ctrl-C ends the wait at once. ``auto`` is resolved as Ray resolves it (its
    environment, then the last ``ray start`` here); a loopback host is also tried at the node's own address,
    which is the one Ray connects to. That something answers does not prove it is Ray's GCS: only that the
    address is not a typo, or a cluster that is down."""
    targets = _ray_targets(address)
    deadline = time.monotonic() + timeout
    reasons = []
    for host, port in targets:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic())):
                return
        except TimeoutError:
            reasons.append(f"no answer within {timeout:g} s")
        except OSError as err:  # refused, unreachable, an unknown host
            reasons.append(err.strerror or str(err))
    where = " or ".join(f"{h}:{p}" for h, p in targets)
    raise ValueError(
        f"--ray-address {address}: no Ray cluster answers at {where} ({'; '.join(dict.fromkeys(reasons))}); "
        "start one with `ray start --head`, or check the address"
    )


def _ray_targets(address: str) -> list[tuple[str, int]]:
    """The (host, port) pairs that ``address`` names: ``host:port``, ``ray://host[:port]`` or ``auto``."""
    text = address.strip()
    client = text.startswith("ray://")
    if client:
        text = text.removeprefix("ray://")
    elif text == "auto":
        from ray._private import services  # Ray's own lookup: RAY_ADDRESS, then the last `ray start` here

        try:
            text = services.get_ray_address_from_environment("auto", None)
        except ConnectionError:
            raise ValueError(
                "--ray-address auto: no running Ray cluster found on this machine; start one with "
                "`ray start --head`, or give its address as host:port"
            ) from None
    host, colon, port_text = text.rpartition(":")
    if not colon and client:
        host, port_text = text, str(RAY_CLIENT_PORT)
    host = host.strip("[]")  # [::1]:6379
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(
            f"--ray-address {address}: expected host:port (e.g. 10.0.0.5:6379), ray://host:port, or auto"
        )
    targets = [(host, int(port_text))]
    if not client and host in ("localhost", "127.0.0.1", "::1"):
        with contextlib.suppress(Exception):  # Ray's helper, private: without it, the loopback alone
            from ray._private.services import resolve_ip_for_localhost

            node = resolve_ip_for_localhost(host)
            if node != host:
                targets.append((node, int(port_text)))
    return targets


class RayBackend:
    """Each job a Ray task with the CPUs (and GPUs) that ``experiment.resources(spec)`` asks for.

    ``address`` None starts a local Ray instance with ``jobs`` CPUs, shut down by :meth:`close`; ``"auto"``
    (or ``ray://...``, ``host:port``) joins a running cluster, which :meth:`close` leaves running. Where Ray
    is already initialised in this process (a test), that instance is used and left alone. A worker that
    dies is rerun up to ``max_retries`` times; a job that still fails, or raises, comes back as
    :class:`Failed` and the others go on."""

    name = "ray"

    def __init__(self, jobs: int, address: str | None = None, max_retries: int | None = None):
        ray = self.ray = import_ray()
        self.max_retries = MAX_RETRIES if max_retries is None else max_retries
        self.pending: set[Any] = set()
        self.connected = not ray.is_initialized()
        self.owns_instance = self.connected and address is None  # shut down with every task and worker
        if self.connected:
            env = {k: os.environ[k] for k in ("NGVI_DATA",) if k in os.environ}
            options: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,  # a job's output stays in the session's logs, as the bar needs
                "logging_level": logging.ERROR,
                "runtime_env": {"env_vars": env} if env else None,
            }
            if address is None:  # "local": a new instance, even where ray.init() would find a running one
                options["num_cpus"] = jobs
            else:  # fail in one line, and at once on Ctrl-C, where nothing answers (ray.init would hang)
                probe_ray_address(address)
            ray.init(address=address or "local", **options)
        self.task = ray.remote(_ray_job)

    def _submit(self, experiment_ref: Any, experiment: Experiment, spec: dict[str, Any]) -> Any:
        resources = experiment.resources(spec)
        threads = max(1, int(resources.get("num_cpus", 1)))
        task = self.task.options(max_retries=self.max_retries, retry_exceptions=False, **resources)
        ref = task.remote(experiment_ref, spec, threads)
        self.pending.add(ref)
        return ref

    def completed(
        self, experiment: Experiment, specs: Sequence[dict[str, Any]]
    ) -> Iterator[tuple[int, Outcome]]:
        """(index, result or :class:`Failed`) of each spec, as the jobs finish."""
        ray = self.ray
        experiment_ref = ray.put(experiment)  # shipped once, not with every task
        index = {self._submit(experiment_ref, experiment, s): i for i, s in enumerate(specs)}
        waiting = list(index)
        while waiting:
            # a short timeout keeps the main thread in Python, where Ctrl-C and SIGTERM are delivered
            done, waiting = ray.wait(waiting, num_returns=1, timeout=0.5)
            for ref in done:
                self.pending.discard(ref)
                try:
                    outcome: Outcome = ray.get(ref)
                except ray.exceptions.RayTaskError as err:  # the job raised
                    cause = err.cause if err.cause is not None else err
                    outcome = Failed(f"{type(cause).__name__}: {cause}".strip().splitlines()[0])
                except ray.exceptions.RayError as err:  # its worker died more than max_retries times
                    outcome = Failed(f"{type(err).__name__}: {err}".strip().splitlines()[0])
                yield index[ref], outcome

    def map(self, experiment: Experiment, specs: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The results in order; a failed job raises RuntimeError."""
        results: dict[int, Outcome] = {}
        for i, outcome in self.completed(experiment, specs):
            if isinstance(outcome, Failed):
                raise RuntimeError(f"a job failed on Ray: {outcome.error}")
            results[i] = outcome
        for i in range(len(specs)):
            yield results[i]  # type: ignore[misc]

    def close(self, terminate: bool = False) -> None:
        ray = self.ray
        if terminate and not self.owns_instance:  # (shutting down our own instance ends its tasks: a
            # forced cancel racing a task's completion can abort the driver inside Ray, seen with 2.60)
            for ref in list(self.pending):
                with contextlib.suppress(Exception):  # already finished or gone: nothing to cancel
                    ray.cancel(ref, force=True)
        self.pending.clear()
        if self.connected:  # stops the instance we started; only disconnects from a cluster we joined
            ray.shutdown()
            self.connected = False


def make_backend(name: str, jobs: int, address: str | None = None) -> LocalBackend | RayBackend:
    if name == "ray":
        return RayBackend(jobs, address)
    if address is not None:
        raise ValueError("--ray-address needs --backend ray")
    return LocalBackend(jobs)
