"""Experiments as objects, and the runner that carries every one of them.

An :class:`Experiment` says its arguments, its jobs, how to run one job (``run_job``, in a worker process)
and how to report. The runner does the rest once: it checks the results folder before any work, keeps a
per-job result cache in ``results.json`` (a rerun resumes from the jobs that finished; a different
configuration is refused), runs the jobs on ``--jobs`` worker processes with a progress bar, and ends
cleanly on Ctrl-C or SIGTERM: the workers are terminated, every finished result is kept, and one line says
how to resume.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from .results import ResultsFolder, show_progress

RESULTS = "results.json"


class Interrupted(Exception):
    """Ctrl-C or SIGTERM ended a run; the message says what was kept and how to resume."""


@dataclass(frozen=True)
class Job:
    """One unit of work: ``key`` names its entry in ``results.json["runs"]``; ``spec`` is picklable."""

    key: str
    spec: dict[str, Any] = field(default_factory=dict)


class Experiment:
    """Subclass and set ``name``, ``help`` and ``default_out``; override the methods below."""

    name: str = ""
    help: str = ""
    default_out: str = ""
    #: jobs may run in worker processes (False: in this process, one after another, e.g. timings)
    parallel: bool = True
    #: the packages of the ``experiments`` extra that the command imports (checked before any work)
    requires: tuple[str, ...] = ("tqdm", "matplotlib")
    #: example command lines (with a comment each) for the end of ``ngvi <name> --help``
    examples: tuple[str, ...] = ()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The experiment's own arguments (``--out`` and, if parallel, ``--jobs`` are added for it)."""

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        """What the cached results depend on: a rerun with another config is refused."""
        return {}

    def prepare(self, args: argparse.Namespace, run: Run) -> None:
        """Work before the jobs (tuning), with the run's results, files and workers."""

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        raise NotImplementedError

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        """One job's result (JSON-serialisable), computed in a worker process."""
        raise NotImplementedError

    def report(self, args: argparse.Namespace, run: Run) -> None:
        """Tables and figures from ``run.results``, into ``run.out``."""


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


class Workers:
    """``jobs`` worker processes (one torch thread each), or this process for ``jobs == 1``.

    Workers start from a fork server, not by forking this process: a fork inherits the locks held by this
    process's other threads (torch's thread pools, progress bars) and can hang on them. A worker that dies
    fails the run (BrokenProcessPool) instead of hanging it."""

    def __init__(self, jobs: int):
        self.pool = None
        if jobs > 1:
            context = multiprocessing.get_context("forkserver")
            self.pool = ProcessPoolExecutor(
                jobs, mp_context=context, initializer=_worker_init, initargs=(os.getpid(),)
            )

    def map(self, experiment: Experiment, specs: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The results of ``experiment.run_job`` on ``specs``, in order, as they finish."""
        if self.pool is not None:
            # Not pool.map: on an interrupt its generator cancels the pending futures from this thread while
            # the pool's thread, seeing the terminated workers, sets an exception on each of them
            # (InvalidStateError, printed as a traceback). Here only the pool's thread ever touches them.
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


@dataclass
class Run:
    """A run in progress: its experiment, folder, cached results and workers."""

    experiment: Experiment
    out: ResultsFolder
    results: dict[str, Any]
    workers: Workers

    def save(self) -> None:
        self.out.save(RESULTS, self.results)

    def map(self, specs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(self.workers.map(self.experiment, specs))

    def run_jobs(self, jobs: Sequence[Job]) -> None:
        """Run the jobs not yet in ``results["runs"]``, saving each result as it arrives."""
        from tqdm import tqdm

        runs = self.results["runs"]
        todo = [j for j in jobs if j.key not in runs]
        start = time.perf_counter()
        bar = tqdm(
            total=len(todo), desc=f"ngvi {self.experiment.name}", unit="job", disable=not show_progress()
        )
        with bar:
            for job, result in zip(
                todo, self.workers.map(self.experiment, [j.spec for j in todo]), strict=True
            ):
                runs[job.key] = result
                self.save()
                bar.set_postfix_str(job.key)
                bar.update()
        if todo:
            self.results["wall_seconds"] = self.results.get("wall_seconds", 0.0) + time.perf_counter() - start
            self.save()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    signals = (signal.SIGINT, signal.SIGTERM)
    try:
        previous = [signal.signal(s, signal.SIG_IGN) for s in signals]
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, handler in zip(signals, previous, strict=True):
            signal.signal(s, handler)


def run(experiment: Experiment, args: argparse.Namespace) -> Run:
    """Check the folder, resume from its results, prepare, run the missing jobs, and report."""
    out = ResultsFolder(args.out)
    results = out.load_results(RESULTS)
    config = json.loads(json.dumps(experiment.config(args)))  # as read back (tuples become lists)
    if results.get("config", config) != config:
        raise ValueError(
            f"{out.path} holds results of another configuration ({results['config']}, now {config}); "
            "use a new --out folder or the same arguments"
        )
    results.setdefault("config", config)
    results.setdefault("runs", {})
    with _sigterm_as_interrupt():
        workers = Workers(getattr(args, "jobs", 1) if experiment.parallel else 1)
        current = Run(experiment, out, results, workers)
        try:
            experiment.prepare(args, current)
            current.run_jobs(experiment.jobs(args, current))
        except KeyboardInterrupt:
            with _signals_ignored():  # a second Ctrl-C or SIGTERM must not cut the cleanup short
                workers.close(terminate=True)
            done = len(results["runs"])
            raise Interrupted(
                f"interrupted; {done} finished job(s) are kept in {out / RESULTS}: rerun the same command to "
                "resume"
            ) from None
        except BaseException:
            workers.close(terminate=True)
            raise
        workers.close()
    experiment.report(args, current)
    return current
