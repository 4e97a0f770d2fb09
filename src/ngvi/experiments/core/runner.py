"""Experiments as objects, and the runner that carries every one of them.

An :class:`Experiment` says its arguments, its jobs, how to run one job (``run_job``, in a worker process)
and how to report. The runner does the rest once: it checks the results folder before any work, keeps a
per-job result cache in ``results.json`` (a rerun resumes from the jobs that finished; a different
configuration is refused), runs the jobs on a backend (``--backend local``: ``--jobs`` worker processes;
``--backend ray``: Ray tasks, see :mod:`.backends`) with a progress bar, and ends cleanly on Ctrl-C or
SIGTERM: the workers are terminated, every finished result is kept, and one line says how to resume. The
results do not depend on the backend, so a run started on one resumes on the other.

Issue 31: a run holds its folder's lock from start to end (:meth:`.ResultsFolder.lock`: a second run on the
same ``--out`` is refused), every cached entry is checked against what the experiment writes
(:attr:`Experiment.result_fields`) before any work, and **the report sees only this command's jobs**
(:meth:`Run.own`): the folder may cache more (a ``--splits 4`` run before this ``--splits 2`` one, other
data sets or methods), but a table averages exactly the jobs its command names, and a metric that is NaN or
infinite marks its fit as diverged instead of entering a mean or a bold mark.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .backends import Failed, LocalBackend, RayBackend, _watch_main, make_backend
from .results import ResultsFolder, check_fields, show_progress

Workers = LocalBackend  # its old name
__all__ = ["Experiment", "Incomplete", "Interrupted", "Job", "Run", "Workers", "_watch_main", "run"]

RESULTS = "results.json"


class Interrupted(Exception):
    """Ctrl-C or SIGTERM ended a run; the message says what was kept and how to resume."""


class Incomplete(Exception):
    """A run ended, and reported, with failed jobs; the message says where they are listed."""


@dataclass(frozen=True)
class Job:
    """One unit of work: ``key`` names its entry in ``results.json["runs"]``; ``spec`` is picklable."""

    key: str
    spec: dict[str, Any] = field(default_factory=dict)


def job_key(*parts: Any) -> str:
    """A job's key in ``results.json``: its parts joined by ``/`` (``uci/yacht/vadam/split03``)."""
    return "/".join(str(p) for p in parts)


class Experiment:
    """Subclass and set ``name`` and ``help`` (``default_out`` too where ``runs/<name>`` will not do);
    override the methods below."""

    name: str = ""
    help: str = ""
    #: jobs may run in worker processes (False: in this process, one after another, e.g. timings)
    parallel: bool = True
    #: the packages of the ``experiments`` extra that the command imports (checked before any work)
    requires: tuple[str, ...] = ("tqdm", "matplotlib")
    #: example command lines (with a comment each) for the end of ``ngvi <name> --help``
    examples: tuple[str, ...] = ()

    @property
    def default_out(self) -> str:
        """The results folder when ``--out`` is not given."""
        return f"runs/{self.name}" if self.name else ""

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

    #: the fields of one job's result that the report reads (name → kind of :func:`.check_fields`; a name
    #: ending in ``?`` is optional); a cached result without them is refused before any work. None: no check
    #: beyond the runner's. A result ``{"diverged": str, ...}`` (a fit that diverged) needs only that string.
    result_fields: ClassVar[dict[str, str] | None] = None

    def check_result(self, key: str, result: dict[str, Any]) -> str | None:
        """What is wrong with the cached ``result`` of job ``key`` (None: nothing); see ``result_fields``."""
        if "diverged" in result:
            return check_fields(result, {"diverged": "str"})
        return None if self.result_fields is None else check_fields(result, self.result_fields)

    def report_keys(self, args: argparse.Namespace, jobs: Sequence[Job]) -> list[str]:
        """The jobs whose results the report reads: this command's jobs (override where the report reads
        cached jobs without running any, e.g. a report-only mode)."""
        return [j.key for j in jobs]

    def resources(self, spec: dict[str, Any]) -> dict[str, float]:
        """What one job needs on Ray: a CPU (it runs one torch thread), and a GPU if its spec names a CUDA
        ``device``."""
        gpu = str(spec.get("device", "cpu")).startswith("cuda")
        return {"num_cpus": 1, "num_gpus": 1 if gpu else 0}


@dataclass
class Run:
    """A run in progress: its experiment, folder, cached results and workers."""

    experiment: Experiment
    out: ResultsFolder
    results: dict[str, Any]
    workers: LocalBackend | RayBackend
    #: for a view (:meth:`own`): the whole results, whose ``runs`` and ``failed`` a save writes unchanged
    whole: dict[str, Any] | None = None

    def save(self) -> None:
        data = self.results
        if self.whole is not None:  # a view: its other sections, and the jobs as they are, not as marked
            data = {k: v for k, v in data.items() if k not in ("runs", "failed")}
            data |= {k: self.whole[k] for k in ("runs", "failed") if k in self.whole}
        self.out.save(RESULTS, data)  # merges with the file: no entry on disk is lost

    def own(self, keys: Sequence[str]) -> Run:
        """This run seen through the jobs ``keys`` only: ``runs`` and ``failed`` hold just those (the other
        sections, e.g. tuned values, are shared), and a result whose metric (a ``number`` field of
        :attr:`Experiment.result_fields`) is NaN or infinite is marked ``diverged``, so no report averages
        or bolds it. Saving the view saves the jobs as they are, and what the report added to the results."""
        numbers = [k.rstrip("?") for k, v in (self.experiment.result_fields or {}).items() if v == "number"]
        runs, failed = self.results["runs"], self.results.get("failed", {})
        own_runs = {}
        for key in keys:
            if key not in runs:
                continue
            result = runs[key]
            bad = [n for n in numbers if isinstance(result.get(n), float) and not math.isfinite(result[n])]
            if bad and "diverged" not in result:
                what = ", ".join(f"{n} = {result[n]}" for n in bad)
                result = {**result, "diverged": f"non-finite {what} in {RESULTS}"}
            own_runs[key] = result
        view = {**self.results, "runs": own_runs}
        view.pop("failed", None)
        own_failed = {k: failed[k] for k in keys if k in failed}
        if own_failed:
            view["failed"] = own_failed
        return Run(self.experiment, self.out, view, self.workers, whole=self.results)

    def map(self, specs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(self.workers.map(self.experiment, specs))

    def run_jobs(self, jobs: Sequence[Job]) -> None:
        """Run the jobs not yet in ``results["runs"]``, saving each result as it arrives. A job that fails
        (on Ray: its worker died more than the retries allow, or it raised) is listed under
        ``results["failed"]`` with its error, and left out of ``runs``: the report shows its cell as missing
        and a rerun retries it."""
        from tqdm import tqdm

        runs = self.results["runs"]
        failed = self.results.setdefault("failed", {})
        todo = [j for j in jobs if j.key not in runs]
        start = time.perf_counter()
        bar = tqdm(
            total=len(todo), desc=f"ngvi {self.experiment.name}", unit="job", disable=not show_progress()
        )
        with bar:
            for index, outcome in self.workers.completed(self.experiment, [j.spec for j in todo]):
                key = todo[index].key
                if isinstance(outcome, Failed):
                    failed[key] = {"error": outcome.error, "backend": self.workers.name}
                else:
                    runs[key] = outcome
                    failed.pop(key, None)
                self.save()
                bar.set_postfix_str(key)
                bar.update()
        if not failed:
            del self.results["failed"]
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
    """Check the folder, hold it for this run, resume from its results, prepare, run the missing jobs, and
    report on this command's jobs only."""
    out = ResultsFolder(args.out)
    with out.lock():
        return _run_locked(experiment, args, out)


def _run_locked(experiment: Experiment, args: argparse.Namespace, out: ResultsFolder) -> Run:
    results = out.load_results(RESULTS)
    for key, result in results.get("runs", {}).items():
        problem = experiment.check_result(key, result)
        if problem is not None:
            raise out.refuse_entry(RESULTS, key, problem)
    config = json.loads(json.dumps(experiment.config(args)))  # as read back (tuples become lists)
    if results.get("config", config) != config:
        raise ValueError(
            f"{out.path} holds results of another configuration ({results['config']}, now {config}); "
            "use a new --out folder or the same arguments"
        )
    results.setdefault("config", config)
    results.setdefault("runs", {})
    with _sigterm_as_interrupt():
        jobs = getattr(args, "jobs", 1) if experiment.parallel else 1
        backend = getattr(args, "backend", "local") if experiment.parallel else "local"
        workers = None
        try:
            workers = make_backend(backend, jobs, getattr(args, "ray_address", None))
            current = Run(experiment, out, results, workers)
            experiment.prepare(args, current)
            command_jobs = experiment.jobs(args, current)
            current.run_jobs(command_jobs)
        except KeyboardInterrupt:
            with _signals_ignored():  # a second Ctrl-C or SIGTERM must not cut the cleanup short
                if workers is not None:
                    workers.close(terminate=True)
                elif backend == "ray":  # interrupted while Ray started: stop what it had started
                    _shutdown_ray()
            done = len(results["runs"])
            raise Interrupted(
                f"interrupted; {done} finished job(s) are kept in {out / RESULTS}: rerun the same command to "
                "resume"
            ) from None
        except BaseException:
            if workers is not None:
                workers.close(terminate=True)
            raise
        workers.close()
    own = current.own(experiment.report_keys(args, command_jobs))
    experiment.report(args, own)
    failed = own.results.get("failed", {})
    if failed:
        _note_failed(own)
        raise Incomplete(
            f"{len(failed)} job(s) failed and are missing from the table (listed under 'failed' in "
            f"{out / RESULTS} and in table.md): rerun the same command to retry them"
        )
    return current


def _shutdown_ray() -> None:
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def _note_failed(run: Run) -> None:
    """Say in table.md which jobs failed, and so which cells are missing."""
    failed = run.results["failed"]
    table = run.out / "table.md"
    if not table.exists():
        return
    lines = [f"- `{key}`: {entry['error']}" for key, entry in sorted(failed.items())]
    table.write_text(
        table.read_text().rstrip("\n")
        + f"\n\n## Missing: {len(failed)} failed job(s)\n\nTheir cells are missing or average fewer runs; "
        "rerun the same command to retry them.\n\n" + "\n".join(lines) + "\n"
    )
