"""The tuning study's key (issue 31, item 6): a study resumes only where everything its result depends on
matches (the seed, the objective's config such as the data split, the search box, the budget, the protocol);
any other run gets a study of its own in the same storage, and a study whose recorded config differs from
its name's is refused."""

from __future__ import annotations

import json
import math
import re
import sys

import optuna
import pytest

from ngvi.experiments import cli
from ngvi.experiments.core.tuning import CONFIG_ATTR, LogUniform, maximise, storage

SPACE = {"a": LogUniform(-2.0, 2.0)}


class Counted:
    """-(log a - seed)²: an objective whose optimum depends on the seed, counting its evaluations."""

    def __init__(self, seed: int = 0):
        self.seed, self.calls = seed, 0

    def __call__(self, hp):
        self.calls += 1
        return -((math.log(hp["a"]) - 0.5 * self.seed) ** 2)


def run(journal, *, trials=3, seed=0, space=SPACE, config=None, **kwargs):
    objective = Counted(seed)
    kwargs.setdefault("startup_trials", trials)  # random trials only: fast, and enough to tell studies apart
    if config is not None:
        kwargs["config"] = config
    best = maximise(objective, space, trials, journal, "t", seed=seed, **kwargs)
    return best, objective.calls


def test_another_seed_sharing_the_storage_runs_its_own_trials(tmp_path):
    journal = tmp_path / "j.log"
    zero, calls = run(journal, seed=0)
    assert calls == 3
    again, calls = run(journal, seed=0)  # the same config: resumed, nothing to do
    assert calls == 0 and again["a"] == zero["a"] and again["value"] == zero["value"]
    one, calls = run(journal, seed=1)  # before: no trials, and seed 0's optimum reported as seed 1's
    assert calls == 3 and one["value"] != zero["value"]
    assert len(optuna.get_all_study_names(storage(journal))) == 2


@pytest.mark.parametrize(
    "change",
    [
        {"trials": 2},  # the budget
        {"space": {"a": LogUniform(-1.0, 2.0)}},  # the search box
        {"config": {"split": 1}},  # the caller's objective: the data split, folds, epochs, the jobs' seed
        {"fixed": {"b": 1.0}},
        {"starts": [{"a": 1.0}]},
    ],
    ids=["budget", "box", "objective", "fixed", "starts"],
)
def test_each_part_of_the_config_keys_its_own_study(tmp_path, change):
    journal = tmp_path / "j.log"
    run(journal, config={"split": 0})
    _, calls = run(journal, **{"config": {"split": 0}, **change})
    assert calls == change.get("trials", 3)
    assert len(optuna.get_all_study_names(storage(journal))) == 2


def test_a_study_whose_recorded_config_differs_is_refused(tmp_path):
    journal = tmp_path / "j.log"
    run(journal)
    (name,) = optuna.get_all_study_names(storage(journal))
    study = optuna.load_study(study_name=name, storage=storage(journal))
    assert study.user_attrs[CONFIG_ATTR]["seed"] == 0 and study.user_attrs[CONFIG_ATTR]["trials"] == 3
    study.set_user_attr(CONFIG_ATTR, {**study.user_attrs[CONFIG_ATTR], "seed": 7})  # hand-edited
    with pytest.raises(ValueError, match=r"made with another config \(seed differ\); use another --tune"):
        run(journal)


def test_uci_with_another_seed_in_one_storage_tunes_its_own(tmp_path, data_dir):
    """The issue's case: `ngvi uci --seed 1` beside a `--seed 0` run in one --tune-storage ran no trials
    and recorded seed 0's λ, τ and CV log-likelihood as its own."""
    journal = tmp_path / "shared.log"
    argv = ["uci", "--datasets", "yacht", "--methods", "vadam", "--splits", "1", "--epochs", "1"]
    argv += ["--tune", "bo", "--trials", "2", "--folds", "2", "--jobs", "1", "--tune-storage", str(journal)]
    tuned = {}
    for seed in (0, 1):
        out = tmp_path / f"seed{seed}"
        assert cli.main([*argv, "--seed", str(seed), "--out", str(out)]) == 0
        tuned[seed] = json.loads((out / "tuned.json").read_text())["yacht/vadam"]
    study = storage(journal)
    names = optuna.get_all_study_names(study)
    assert len(names) == 2 and all(n.startswith("yacht/vadam/") for n in names)
    for name in names:
        assert len(optuna.load_study(study_name=name, storage=study).trials) == 2
    assert tuned[1]["cv_loglik"] != tuned[0]["cv_loglik"]


# -- item 7: a bad --tune-storage is one line that names the option and the path -------------------------
UCI = ["uci", "--datasets", "yacht", "--methods", "vadam", "--splits", "1", "--epochs", "1", "--tune", "bo"]
UCI += ["--trials", "1", "--folds", "2", "--jobs", "1"]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("foo://bar", "unknown database kind 'foo'"),
        ("sqlite:///{tmp}/missing/x.db", "the folder {tmp}/missing of {tmp}/missing/x.db does not exist"),
        ("postgresql://me:secret@localhost/db", "the postgresql driver is not installed (missing module: "),
        ("{tmp}/missing/j.log", "the folder {tmp}/missing of {tmp}/missing/j.log does not exist"),
        ("sqlite:///{tmp}", "is a folder; give an sqlite database file in it"),
        ("://x", "not a database URL"),
    ],
    ids=["unknown-kind", "sqlite-missing-folder", "no-driver", "journal-missing-folder", "folder", "garbage"],
)
def test_a_bad_tune_storage_is_one_line_before_any_fit(url, says, tmp_path, data_dir, capsys, monkeypatch):
    for driver in ("psycopg", "psycopg2"):  # missing even where one is installed
        monkeypatch.setitem(sys.modules, driver, None)
    url, says = url.format(tmp=tmp_path), says.format(tmp=tmp_path)
    assert cli.main([*UCI, "--tune-storage", url, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ngvi uci: error: argument --tune-storage: ") and err.count("\n") == 1, err
    assert says in err and "secret" not in err
    assert not (tmp_path / "out" / "results.json").exists()
    with pytest.raises(ValueError, match=re.escape(says)):  # the Python API says the same
        storage(url)


def test_a_database_that_cannot_be_opened_is_one_line(tmp_path, data_dir, capsys):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not an sqlite file" * 100)
    assert cli.main([*UCI, "--tune-storage", f"sqlite:///{junk}", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"ngvi uci: error: --tune-storage sqlite:///{junk}: cannot open the database (file is not a "
        "database); check the URL (and that its server runs)\n"
    )


def test_an_os_error_names_its_path_and_the_option_it_came_from(tmp_path, data_dir, capsys):
    journal = tmp_path / "j.log"
    journal.symlink_to(tmp_path / "gone" / "j.log")  # its folder exists; opening it does not work
    assert cli.main([*UCI, "--tune-storage", str(journal), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == f"ngvi uci: error: --tune-storage {journal}: No such file or directory\n"


def test_os_error_message_names_the_most_specific_option(tmp_path, monkeypatch):
    monkeypatch.setenv("NGVI_DATA", str(tmp_path / "data"))
    options = {"command": "uci", "out": str(tmp_path / "out"), "merge_from": [str(tmp_path / "o2")]}
    options["out_sub"] = str(tmp_path / "out" / "sub")

    def text(path, errno=2, strerror="No such file or directory"):
        return cli.os_error_message(OSError(errno, strerror, str(path)), options)

    assert text(tmp_path / "out" / "sub" / "x.json") == (
        f"--out-sub {tmp_path}/out/sub: No such file or directory: {tmp_path}/out/sub/x.json"
    )
    assert text(tmp_path / "out" / "x.json").startswith(f"--out {tmp_path}/out: No such file")
    assert text(tmp_path / "o2") == f"--merge-from {tmp_path}/o2: No such file or directory"
    assert text(tmp_path / "data" / "uci") == (
        f"$NGVI_DATA {tmp_path}/data: No such file or directory: {tmp_path}/data/uci"
    )
    assert text("/elsewhere/f", 13, "Permission denied") == "Permission denied: /elsewhere/f"
    assert cli.os_error_message(OSError("disk on fire"), options) == "disk on fire"
    assert (
        cli.os_error_message(OSError(9, "Bad file descriptor", 3), options)
        == "[Errno 9] Bad file descriptor: 3"
    )
    moved = OSError(18, "Invalid cross-device link", f"{tmp_path}/out/a", None, "/mnt/b")
    assert cli.os_error_message(moved, options) == (
        f"--out {tmp_path}/out: Invalid cross-device link: {tmp_path}/out/a -> /mnt/b"
    )
