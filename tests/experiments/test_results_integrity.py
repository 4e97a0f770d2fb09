"""A results folder under misuse (issue 31, items 3–5): two runs on one ``--out``, a hand-edited or damaged
``results.json``, and a folder that caches more jobs than the command asks for."""

from __future__ import annotations

import argparse
import json
import math
import threading
from dataclasses import asdict
from typing import Any, ClassVar

import pytest

from ngvi.experiments.cli import main
from ngvi.experiments.core import runner
from ngvi.experiments.core.report import bold_set
from ngvi.experiments.core.results import ResultsFolder
from ngvi.experiments.core.runner import Experiment, Job
from ngvi.experiments.uci.protocol import Protocol


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- a toy experiment: job i's result is {"value": values[i]}; its report records what it was shown


class Toy(Experiment):
    name = "toy"
    parallel = False  # its jobs run in this process, so a test can hold one open
    result_fields: ClassVar[dict[str, str]] = {"value": "number"}

    def __init__(self, values: list[float], gate: threading.Event | None = None) -> None:
        self.values, self.gate, self.started = values, gate, threading.Event()
        self.seen: dict[str, Any] = {}
        self.saves = False  # the report adds a note to the results and saves them, as `ngvi bench` does

    def jobs(self, args: argparse.Namespace, run: runner.Run) -> list[Job]:
        return [Job(f"job{i}", {"i": i}) for i in range(args.n)]

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(30), "the test never opened the gate"
        return {"value": self.values[spec["i"]]}

    def report(self, args: argparse.Namespace, run: runner.Run) -> None:
        self.seen = run.results["runs"]
        if self.saves:
            run.results["note"] = 1
            run.save()


def _args(out, n: int) -> argparse.Namespace:
    return argparse.Namespace(out=str(out), n=n, jobs=1)


# -- item 3: two runs on one folder


def test_a_second_run_on_a_folder_in_use_is_refused_and_no_fit_is_lost(tmp_path):
    first = Toy([1.0, 2.0, 3.0], gate=threading.Event())
    thread = threading.Thread(target=runner.run, args=(first, _args(tmp_path, 3)))
    thread.start()
    try:
        assert first.started.wait(30)  # the first run is inside its first job, holding the folder
        second = Toy([10.0, 20.0, 30.0, 40.0])
        with pytest.raises(ValueError, match=f"^--out {tmp_path} is in use by another ngvi run: wait for it"):
            runner.run(second, _args(tmp_path, 4))
        assert second.seen == {}
    finally:
        first.gate.set()
        thread.join(30)
    assert first.seen == {"job0": {"value": 1.0}, "job1": {"value": 2.0}, "job2": {"value": 3.0}}
    # once the first has ended, the second resumes from its fits and adds its own fourth
    second = Toy([10.0, 20.0, 30.0, 40.0])
    runner.run(second, _args(tmp_path, 4))
    assert second.seen == {**first.seen, "job3": {"value": 40.0}}


def test_a_save_keeps_the_entries_on_disk_that_the_writer_does_not_hold(tmp_path):
    folder = ResultsFolder(tmp_path)
    folder.save("results.json", {"config": {}, "runs": {"a": {"x": 1}, "b": {"x": 2}}, "failed": {"c": {}}})
    mine = {"config": {}, "runs": {"c": {"x": 3}, "a": {"x": 9}}}  # read before b was written; c finished
    folder.save("results.json", mine)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk == {"config": {}, "runs": {"a": {"x": 9}, "b": {"x": 2}, "c": {"x": 3}}}


def test_a_save_of_another_file_keeps_its_other_entries_whole(tmp_path):
    folder = ResultsFolder(tmp_path)
    folder.save("tuned.json", {"yacht/vadam": {"a": 1, "old": 2}, "yacht/bbvi": {"a": 3}})
    folder.save("tuned.json", {"yacht/vadam": {"a": 5}})
    assert folder.load("tuned.json") == {"yacht/vadam": {"a": 5}, "yacht/bbvi": {"a": 3}}


def test_each_write_has_a_temporary_file_of_its_own(tmp_path):
    (tmp_path / "results.json.tmp").mkdir()  # the name every writer used to share, taken
    ResultsFolder(tmp_path).save("results.json", {"config": {}, "runs": {"a": {"x": 1}}})
    assert json.loads((tmp_path / "results.json").read_text())["runs"] == {"a": {"x": 1}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.json.tmp"]


# -- item 4: every entry of a hand-edited or damaged results.json is checked

CONFIG = {"protocol": asdict(Protocol(epochs=40)), "seed": 0}


def _fit(rmse: float) -> dict[str, Any]:
    return {"rmse": rmse, "loglik": -rmse, "seconds": 1.0, "curve": [rmse, rmse]}


def _uci(out, data_dir, splits: int, methods: str = "vadam") -> list[str]:
    return ["uci", "--datasets", "yacht", "--methods", methods, "--splits", str(splits), "--out", str(out),
            "--data-dir", str(data_dir), "--jobs", "1"]  # fmt: skip


def _cached(runs: dict[str, Any], **extra: Any) -> str:
    return json.dumps({"config": CONFIG, "runs": runs, **extra})


GOOD = {"yacht/vadam/0": _fit(1.0), "yacht/vadam/1": _fit(1.2)}
DAMAGED = {
    "deep nesting": (
        _cached(GOOD).replace('"seed"', '"deep": ' + "[" * 100_000 + "]" * 100_000 + ', "seed"'),
        "nested too deep to read",
    ),
    "nested past the bound": (
        _cached({**GOOD, "yacht/vadam/1": {**_fit(1.2), "x": json.loads("[" * 40 + "]" * 40)}}),
        "nested deeper than 32 at ['runs']['yacht/vadam/1']['x']",
    ),
    "failed as a string": (_cached(GOOD, failed="oops"), "'failed' holds \"oops\", not an object"),
    "failed without error": (
        _cached(GOOD, failed={"yacht/vadam/1": {"backend": "local"}}),
        "failed job 'yacht/vadam/1' holds {\"backend\": \"local\"}, not an object with an 'error' string",
    ),
    "seconds as a string": (
        _cached({**GOOD, "yacht/vadam/1": {**_fit(1.2), "seconds": "5"}}),
        "job 'yacht/vadam/1': 'seconds' is \"5\", not a finite number ≥ 0",
    ),
    "missing rmse": (
        _cached({**GOOD, "yacht/vadam/1": {"loglik": -1.0, "seconds": 1.0}}),
        "job 'yacht/vadam/1': no 'rmse'",
    ),
    "rmse of 10**400": (
        _cached(GOOD).replace('"rmse": 1.2', '"rmse": 1' + "0" * 400),
        "['runs']['yacht/vadam/1']['rmse'] holds an integer of 401 digits, beyond a float",
    ),
}


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_entry_is_refused_in_one_line_naming_file_and_entry(case, tmp_path, capsys, data_dir):
    text, why = DAMAGED[case]
    file = tmp_path / "results.json"
    file.write_text(text)
    assert main(_uci(tmp_path, data_dir, 2)) == 2
    line = _one_line_error(capsys)
    assert f"{file} is not an ngvi results file (" in line and why in line, line
    assert line.endswith("or choose another --out (the file is left as it is)")
    assert file.read_text() == text


# -- item 5: a report reads its own command's jobs, and never averages or bolds a NaN


def _rmse_row(table: str) -> str:
    rmse = table.split("## Test RMSE")[1]
    return next(line for line in rmse.splitlines() if line.startswith("| yacht |"))


def test_a_damaged_entry_of_a_merged_folder_is_refused_naming_that_folder(tmp_path, capsys, data_dir):
    piece = tmp_path / "piece"
    piece.mkdir()
    bad = {**GOOD, "yacht/vadam/1": {**_fit(1.2), "rmse": "1.2"}}
    (piece / "results.json").write_text(_cached(bad, hparams={}))
    assert main([*_uci(tmp_path / "out", data_dir, 2), "--merge-from", str(piece)]) == 2
    line = _one_line_error(capsys)
    assert f"{piece / 'results.json'} is not an ngvi results file (job 'yacht/vadam/1': 'rmse' is" in line


def test_the_table_averages_only_the_splits_the_command_asks_for(tmp_path, capsys, data_dir):
    runs = {f"yacht/vadam/{s}": _fit(v) for s, v in enumerate([1.0, 1.2, 5.0, 7.0])}  # a --splits 4 run
    (tmp_path / "results.json").write_text(_cached(runs))
    assert main(_uci(tmp_path, data_dir, 2)) == 0
    cell = _rmse_row((tmp_path / "table.md").read_text()).split(" | ")[1]
    assert cell == "**1.10 ± 0.10 (2)**"  # splits 0 and 1; bold: the only method
    assert len(json.loads((tmp_path / "results.json").read_text())["runs"]) == 4  # the cache keeps all


def test_a_nan_metric_is_a_diverged_fit_never_a_mean_or_bold(tmp_path, capsys, data_dir):
    runs = {f"yacht/vadam/{s}": _fit(v) for s, v in enumerate([1.0, 1.2, 0.9])}
    runs |= {f"yacht/bbvi/{s}": _fit(v) for s, v in enumerate([2.0, 2.2, 1.9])}
    (tmp_path / "results.json").write_text(_cached(runs).replace('"rmse": 1.0', '"rmse": NaN', 1))
    assert main(_uci(tmp_path, data_dir, 3, "vadam,bbvi")) == 0
    table = (tmp_path / "table.md").read_text()
    row = _rmse_row(table)
    assert "nan" not in row.lower(), row
    assert row.split(" | ")[1] == "**1.05 ± 0.15 (2)**"  # vadam: its 2 finite splits, still the best
    assert "Vadam on yacht: 1" in table.split("Diverged fits")[1]


def test_bold_is_never_a_nan():
    values = {"a": {0: math.nan, 1: math.nan}, "b": {0: 1.0, 1: 2.0}, "c": {0: 1.0, 1: math.inf}}
    assert bold_set(values, -1) == {"b"}
    assert bold_set(values, +1) == {"b"}


def test_every_report_sees_only_its_commands_jobs(tmp_path):
    """The runner's view, under every experiment: a folder that caches 4 jobs, a command that asks for 2."""
    runner.run(Toy([1.0, 2.0, 3.0, 4.0]), _args(tmp_path, 4))
    second = Toy([1.0, 2.0])
    runner.run(second, _args(tmp_path, 2))
    assert second.seen == {"job0": {"value": 1.0}, "job1": {"value": 2.0}}
    third = Toy([math.nan])
    third.saves = True
    runner.run(third, _args(tmp_path / "nan", 1))
    assert third.seen["job0"]["diverged"] == "non-finite value = nan in results.json"
    saved = json.loads((tmp_path / "nan" / "results.json").read_text())  # a report that saves its view
    assert saved["note"] == 1 and list(saved["runs"]) == ["job0"] and "diverged" not in saved["runs"]["job0"]
