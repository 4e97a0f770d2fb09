"""`--backend ray` on a real local Ray instance (2 CPUs; no mocks): the same results as the local pool,
bitwise; a run resumes across backends; a killed worker's job reruns; failed jobs are recorded and
retried; Ctrl-C exits 130, keeps the finished jobs and leaves no Ray process behind.

Ray starts slowly (5-10 s on two busy cores): this module starts one instance for its in-process tests, and
one subprocess run starts its own. Run them alone with ``pytest -m ray``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from procs import alive, descendants, foreground_sigint

from ngvi.experiments import cli
from ngvi.experiments.core import backends, runner
from ngvi.experiments.core.runner import Experiment, Job

ray = pytest.importorskip("ray")
# one xdist worker runs the whole module (make test: --dist loadgroup), so one Ray instance runs at a time
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

QUIET = {"RAY_DISABLE_IMPORT_WARNING": "1", "RAY_DEDUP_LOGS": "0", "NGVI_PROGRESS": "0"}
OBJECT_STORE = 78_643_200  # the least Ray accepts (75 MiB)
#: a line of Ray's C++ log: "[2026-11-28 00:41:11,374 E 4449 4604] task_manager.cc:1545: ..."
RAY_LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+ [DIWEF] \d+ \d+\] ")


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module; the backend finds it initialised, uses it and leaves it."""
    here = str(Path(__file__).parent)  # the workers import this module's experiments by name
    saved = {k: os.environ.get(k) for k in [*QUIET, "PYTHONPATH"]}
    os.environ.update(QUIET)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    before = descendants(os.getpid())  # e.g. an earlier test's multiprocessing fork server: not Ray's
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=OBJECT_STORE,
    )
    ours = {p for p in descendants(os.getpid()) - before if b"ray" in _cmdline(p)}  # raylet, gcs, workers
    try:
        yield
    finally:
        ray.shutdown()
        deadline = time.monotonic() + 30  # a loaded 2-core machine: raylet takes its time to go
        while any(alive(p) for p in ours) and time.monotonic() < deadline:
            time.sleep(0.1)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    left = {p: _cmdline(p).replace(b"\0", b" ")[:120] for p in ours if alive(p)}
    assert ours and not left, f"the module's Ray processes outlived ray.shutdown(): {left}"


class Marks(Experiment):
    """Job ``i`` leaves a file ``<i>-<pid>`` in ``dir`` when it starts, then sleeps; ``die`` jobs kill their
    worker, ``fail`` jobs raise."""

    name = "marks"
    default_out = "runs/marks"

    def jobs(self, args, run):
        return [Job(f"j{i}", {"i": i, "dir": args.dir, **args.spec.get(i, {})}) for i in range(args.n)]

    def run_job(self, spec):
        Path(spec["dir"], f"{spec['i']}-{os.getpid()}").touch()
        if spec.get("die"):
            os.kill(os.getpid(), signal.SIGKILL)
        if spec.get("fail"):
            raise ValueError("a bad spec")
        time.sleep(spec.get("seconds", 0.0))
        return {"i": spec["i"]}

    def report(self, args, run):
        (run.out / "table.md").write_text("# marks\n")


def _args(tmp_path, **kw) -> argparse.Namespace:
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    base = {"out": str(tmp_path / "out"), "jobs": 2, "backend": "ray", "ray_address": None}
    return argparse.Namespace(**{**base, "dir": str(marks), "spec": {}, **kw})


def _marks(args) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for f in Path(args.dir).iterdir():
        i, pid = map(int, f.name.split("-"))
        found.setdefault(i, []).append(pid)
    return found


def test_a_job_whose_worker_is_killed_reruns_and_nothing_is_lost(local_ray, tmp_path):
    args = _args(tmp_path, n=4, spec={i: {"seconds": 2.0} for i in range(4)})
    killed = []

    def kill_job_0():
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            pids = _marks(args).get(0)
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
            time.sleep(0.05)

    killer = threading.Thread(target=kill_job_0)
    killer.start()
    done = runner.run(Marks(), args)
    killer.join()
    assert killed, "job 0 never started"
    assert done.results["runs"] == {f"j{i}": {"i": i} for i in range(4)}
    assert "failed" not in done.results
    assert len(_marks(args)[0]) == 2  # it ran again, in a new worker
    assert json.loads((tmp_path / "out" / "results.json").read_text())["runs"] == done.results["runs"]


def test_failed_jobs_are_listed_the_others_kept_and_a_rerun_retries_them(local_ray, tmp_path, monkeypatch):
    monkeypatch.setattr(backends, "MAX_RETRIES", 1)
    args = _args(tmp_path, n=3, spec={0: {"die": True}, 2: {"fail": True}})
    with pytest.raises(runner.Incomplete, match=r"^2 job\(s\) failed and are missing from the table"):
        runner.run(Marks(), args)
    done = json.loads((tmp_path / "out" / "results.json").read_text())
    assert done["runs"] == {"j1": {"i": 1}}
    failed = done["failed"]
    assert sorted(failed) == ["j0", "j2"]
    assert failed["j2"] == {"error": "ValueError: a bad spec", "backend": "ray"}
    assert "Worker" in failed["j0"]["error"]  # WorkerCrashedError, after 1 retry
    assert len(_marks(args)[0]) == 2  # ran once, and retried once
    table = (tmp_path / "out" / "table.md").read_text()
    assert "## Missing: 2 failed job(s)" in table and "`j2`: ValueError: a bad spec" in table
    again = runner.run(Marks(), _args(tmp_path, n=3))  # the same config: the rerun retries only the failed
    assert again.results["runs"] == {f"j{i}": {"i": i} for i in range(3)}
    assert "failed" not in again.results
    assert len(_marks(args)[1]) == 1  # j1 was not rerun
    assert "Missing" not in (tmp_path / "out" / "table.md").read_text()


def _uci(out: Path, data_dir: Path, backend: str, splits: int) -> list[str]:
    argv = ["uci", "--datasets", "yacht", "--methods", "vadam", "--tune", "none", "--epochs", "1"]
    argv += ["--splits", str(splits), "--out", str(out), "--data-dir", str(data_dir)]
    return [*argv, "--backend", backend]


def _runs(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["runs"]


@pytest.mark.data("uci")
def test_ray_and_local_give_bitwise_equal_fits_and_resume_each_other(local_ray, tmp_path, data_dir):
    """Split 0 on one backend, then split 1 by resuming on the other: both orders give the same numbers."""
    first = {}
    for name, order in {"a": ("local", "ray"), "b": ("ray", "local")}.items():
        out = tmp_path / name
        assert cli.main(_uci(out, data_dir, order[0], 1)) == 0
        first[name] = _runs(out)
        assert cli.main(_uci(out, data_dir, order[1], 2)) == 0
        assert _runs(out)["yacht/vadam/0"] == first[name]["yacht/vadam/0"]  # resumed: kept, not refitted
    a, b = _runs(tmp_path / "a"), _runs(tmp_path / "b")
    assert sorted(a) == sorted(b) == ["yacht/vadam/0", "yacht/vadam/1"]
    timings = ("seconds", "train_seconds")
    for key in a:
        assert {k: v for k, v in a[key].items() if k not in timings} == {
            k: v for k, v in b[key].items() if k not in timings
        }


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.data("uci")
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_ctrl_c_exits_130_keeps_the_fits_leaves_no_ray_process_and_resumes(local_ray, tmp_path, data_dir):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ngvi.experiments.cli", *_uci(out, data_dir, "ray", 20)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=foreground_sigint,  # ... with Ctrl-C at its default, even where this runner ignores it
        env={**os.environ, **QUIET},
    )
    ours: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until a fit has finished; Ray's processes noted as they start
            ours |= descendants(proc.pid)
            if (out / "results.json").exists() and _runs(out):
                break
            time.sleep(0.1)
        else:
            pytest.fail("no fit finished within 120 s")
        ours |= descendants(proc.pid)
        assert any(b"raylet" in _cmdline(p) for p in ours), "the run started no Ray instance"
        os.killpg(proc.pid, signal.SIGINT)  # a terminal sends SIGINT to the whole foreground group
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    # Ray's own C++ log lines ("[2026-… E 4449 4604] task_manager.cc:…: Failed to push error to driver")
    # can reach stderr while its workers are stopped; what ngvi prints is one line
    ours_err = [line for line in err.strip().splitlines() if not RAY_LOG_LINE.match(line)]
    assert len(ours_err) == 1 and "rerun the same command to resume" in ours_err[0], err
    deadline = time.monotonic() + 30
    while any(alive(p) for p in ours) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in ours if alive(p)], "Ray processes outlived the run"
    kept = _runs(out)
    assert 1 <= len(kept) < 20
    splits = max(int(k.rsplit("/", 1)[1]) for k in kept) + 2
    assert cli.main(_uci(out, data_dir, "ray", splits)) == 0  # the rerun resumes
    resumed = _runs(out)
    assert sorted(resumed) == sorted(f"yacht/vadam/{k}" for k in range(splits))
    assert all(resumed[k] == kept[k] for k in kept)


class Square(Experiment):
    """-(x - 1)² for a job ``{"x": x}``: the objective of a tuning test, evaluated on the workers."""

    name = "square"

    def run_job(self, spec):
        return {"value": -((spec["x"] - 1.0) ** 2)}


def test_parallel_trials_share_one_study_in_a_database_and_sequential_ones_repeat(local_ray, tmp_path):
    from ngvi.experiments.core.tuning import LogUniform, maximise, storage

    workers = backends.RayBackend(2)
    assert not workers.connected  # the module's instance, left to it
    space = {"x": LogUniform(-2.0, 2.0)}

    def objective(hp):
        return next(workers.map(Square(), [{"x": hp["x"]}]))["value"]

    url = f"sqlite:///{tmp_path / 'study.db'}"
    best = maximise(objective, space, 6, url, "square", parallel=2, startup_trials=3)
    assert best["trials"] == 6 and abs(best["x"] - 1.0) < 0.8
    import optuna

    (name,) = optuna.get_all_study_names(url)  # "square/" and the digest of its config
    study = optuna.load_study(study_name=name, storage=url)
    trials = study.trials
    assert 6 <= len(trials) <= 7  # the budget, and at most the one trial still running when it was met
    overlap = any(
        a.number < b.number and b.datetime_start < a.datetime_complete for a in trials for b in trials
    )
    assert overlap, "no two trials ran at once"

    def sequential(name):
        maximise(objective, space, 4, tmp_path / f"{name}.log", "square", startup_trials=2)
        journal = storage(tmp_path / f"{name}.log")
        (study,) = optuna.get_all_study_names(journal)
        trials = optuna.load_study(study_name=study, storage=journal).trials
        return [t.params for t in trials]

    assert sequential("one") == sequential("two")


def test_ray_missing_or_an_address_without_it_is_one_line(tmp_path, monkeypatch, capsys):
    argv = ["uci", "--datasets", "yacht", "--tune", "none", "--out", str(tmp_path / "out")]
    assert cli.main([*argv, "--ray-address", "auto"]) == 2
    assert capsys.readouterr().err == "ngvi uci: error: --ray-address needs --backend ray\n"
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    assert cli.main([*argv, "--backend", "ray"]) == 2
    assert capsys.readouterr().err == (
        'ngvi uci: error: --backend ray needs the cluster extra: pip install "ngvi[cluster]" (missing: ray)\n'
    )
