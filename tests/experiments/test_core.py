"""The experiment harness: the method registry, the training loop, the results folder, the report helpers
and the CLI's one-line errors (with a fuzz test of every subcommand's arguments)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random

import pytest
import torch
from torch import nn

from ngvi.experiments import COMMANDS, cli, command
from ngvi.experiments.core import METHODS, models, training
from ngvi.experiments.core import args as arg_types
from ngvi.experiments.core.report import bold_set, fmt_mean_se, mean_se, verdict
from ngvi.experiments.core.results import ResultsFolder
from ngvi.experiments.core.tuning import Choice, LogUniform, maximise


# -- the registry and the loop ----------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_is_built_from_the_registry_and_trains(name):
    """One closure for all twelve trainers: a small regression's loss falls within 30 full-batch steps."""
    method = METHODS[name]
    torch.manual_seed(0)
    model = models.mlp(2, 16, 1, dropout=0.05 if method.dropout else None)
    task = {"likelihood": "gaussian"} if dict(method.fixed).get("curvature") == "fisher" else {}  # sampled y
    prior_prec = 0.0 if name == "vadagrad" else 1.0  # App. F
    trainer = method.build(model, 64, lr=0.01, prior_prec=prior_prec, **task)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 2, generator=gen)
    y = x.sum(1, keepdim=True).sin()
    losses = training.train(model, trainer, x, y, nn.functional.mse_loss, epochs=30)
    assert len(losses) == 30 and all(math.isfinite(v) for v in losses)
    assert sum(losses[-5:]) < sum(losses[:5]), (name, losses[:5], losses[-5:])


def test_minibatches_visit_every_row_once_per_epoch_and_copies_repeat_them():
    seen = []

    class Recorder:
        def zero_grad(self):
            pass

        def backward(self, loss, output):
            pass

        def step(self, closure):
            return closure()

    model = nn.Identity()
    x = torch.arange(10.0).unsqueeze(1)

    def loss_fn(out, y):
        seen.append(out[:, 0].tolist())
        return out.sum()

    training.train(
        model, Recorder(), x, x, loss_fn, epochs=2, batch_size=4, generator=torch.Generator(), copies=2
    )
    assert len(seen) == 6  # ⌈10/4⌉ batches per epoch
    for epoch in (seen[:3], seen[3:]):
        rows = [v for batch in epoch for v in batch[: len(batch) // 2]]
        assert sorted(rows) == list(range(10))
    assert all(b[: len(b) // 2] == b[len(b) // 2 :] for b in seen)  # each batch twice in one pass


def test_train_steps_takes_exactly_that_many_full_minibatches():
    """train_steps: whole epochs, then the first minibatches of one more permutation; with drop_last every
    step sees batch_size rows (the remainder of each epoch is dropped); before_step counts 1 … steps."""
    sizes, counted = [], []

    class Recorder:
        def zero_grad(self):
            pass

        def backward(self, loss, output):
            pass

        def step(self, closure):
            return closure()

    x = torch.arange(10.0).unsqueeze(1)

    def loss_fn(out, y):
        sizes.append(len(out))
        return out.sum()

    losses = training.train_steps(
        nn.Identity(),
        Recorder(),
        x,
        x,
        loss_fn,
        steps=7,
        batch_size=4,
        generator=torch.Generator(),
        drop_last=True,
        before_step=counted.append,
    )
    assert len(losses) == 7 and sizes == [4] * 7 and counted == list(range(1, 8))
    sizes.clear()
    training.train_steps(
        nn.Identity(), Recorder(), x, x, loss_fn, steps=4, batch_size=4, generator=torch.Generator()
    )
    assert sizes == [4, 4, 2, 4]  # without drop_last an epoch ends with its remainder
    sizes.clear()
    training.train_steps(nn.Identity(), Recorder(), x, x, loss_fn, steps=3, batch_size=4, copies=2)
    assert sizes == [8, 8, 4]  # copies repeat each minibatch in the same pass


def test_mlp_and_cnn_shapes():
    assert models.mlp(3, [8, 4], 2)(torch.zeros(5, 3)).shape == (5, 2)
    assert models.mlp(4, 8, 2, flatten=True)(torch.zeros(5, 2, 2)).shape == (5, 2)
    dropout = models.mlp(3, 8, 1, dropout=0.1)
    assert any(isinstance(m, nn.Dropout) for m in dropout)
    assert models.cnn(4, side=8, classes=3)(torch.zeros(2, 1, 8, 8)).shape == (2, 3)


# -- report helpers ---------------------------------------------------------------------------------
def test_no_standard_error_and_no_verdict_from_one_split():
    mean, se, n = mean_se([1.5])
    assert (mean, n) == (1.5, 1) and math.isnan(se)
    assert "nan" not in fmt_mean_se(mean, se)
    assert verdict(0.5, +1, se, 0.01)[1].startswith("no verdict")
    assert verdict(0.5, +1, 0.01, 0.01) == ("+35.4", "**better**")
    assert verdict(0.01, -1, 0.1, 0.1)[1] == "same within noise"
    assert bold_set({"a": {0: 1.0}, "b": {0: 2.0}}, +1) == set()  # one split: nothing is bold


def test_bo_finds_the_optimum_of_a_smooth_objective(tmp_path):
    def objective(hp):
        return -((math.log(hp["a"]) - 1.0) ** 2) - (0.0 if hp["kind"] == "x" else 1.0)

    space = {"a": LogUniform(-3.0, 3.0), "kind": Choice(("x", "y"))}
    starts = [{"a": 1.0, "kind": "y"}]
    best = maximise(objective, space, 25, tmp_path / "j.log", "t", seed=0, starts=starts)
    assert best["kind"] == "x" and abs(math.log(best["a"]) - 1.0) < 0.3 and best["value"] > -0.1
    # resumed (the same config): no new trials
    again = maximise(objective, space, 25, tmp_path / "j.log", "t", seed=0, starts=starts)
    assert again["a"] == best["a"]


# -- the results folder -----------------------------------------------------------------------------
def test_results_folder_refuses_a_file_and_an_unwritable_folder(tmp_path, monkeypatch):
    file = tmp_path / "f"
    file.write_text("keep")
    with pytest.raises(ValueError, match="is a file, not a folder; choose another --out"):
        ResultsFolder(file)
    assert file.read_text() == "keep"

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("tempfile.TemporaryFile", refuse)  # root ignores chmod, so refuse the probe itself
    with pytest.raises(ValueError, match="is not writable \\(Permission denied\\); choose another --out"):
        ResultsFolder(tmp_path / "ro")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to a read-only folder")
def test_results_folder_refuses_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(ValueError, match="not writable"):
            ResultsFolder(folder)
    finally:
        folder.chmod(0o755)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"[1, 2]", "not an ngvi results file"),
        (b'{"runs": []}', "not an ngvi results file"),
        (b"\x89\xff\x00garbage", "not valid JSON"),
        (b'{"runs": {', "not valid JSON"),
    ],
)
def test_a_results_file_of_the_wrong_shape_is_named_and_left_alone(tmp_path, content, match):
    (tmp_path / "results.json").write_bytes(content)
    with pytest.raises(ValueError, match=f"results.json is {match}.*move it away or choose another --out"):
        ResultsFolder(tmp_path).load("results.json", required=("runs",))
    assert (tmp_path / "results.json").read_bytes() == content


# -- the command line -------------------------------------------------------------------------------
def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["uci", "--splits", "0"], "--splits: expected a positive integer, got 0"),
        (["uci", "--splits", "-3"], "--splits: expected a positive integer, got -3"),
        (["uci", "--epochs", "ten"], "--epochs: expected a positive integer, got 'ten'"),
        (["uci", "--jobs", "0"], "--jobs: expected a positive integer"),
        (["uci", "--trials", "nan"], "--trials: expected a positive integer"),
        (["uci", "--datasets", ""], "--datasets: expected at least one name"),
        (["uci", "--datasets", "mnist"], "unknown UCI data set 'mnist'"),
        (["uci", "--methods", "vadam,sgd"], "--methods: unknown sgd"),
        (["uci", "--tune", "grid"], "--tune: invalid choice"),
        (["uci", "--bogus"], "unrecognized arguments: --bogus"),
        (["nope"], "invalid choice"),
        (["uci", "--jobs", "99999999999999"], "--jobs: expected a positive integer up to 1,024"),
        (["uci", "--splits", "1" + "0" * 30], "--splits: expected a positive integer up to 1,000,000,000"),
        (["uci", "--seed", "99999999999999"], "--seed: expected an integer ≥ 0 up to 1,000,000,000"),
        (["bench", "--device", "bogus"], "--device: unknown device 'bogus'"),
        (["bench", "--device", "meta"], "--device: device 'meta' is not available here"),
        (["classify", "--angles", "nan"], "--angles: expected a number from -360 to 360, got 'nan'"),
        (["classify", "--angles", "0,inf"], "--angles: expected a number from -360 to 360, got 'inf'"),
        (["classify", "--angles", "1e300"], "--angles: expected a number from -360 to 360, got 1e300"),
        (["prune", "--dropout", "nan"], "--dropout: expected a number from 0 to 0.99, got 'nan'"),
        (["uci", "--out", ""], "--out: expected a folder name, got an empty one"),
        (["uci", "--out", "  "], "--out: expected a folder name, got an empty one"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, expected, capsys):
    assert cli.main(argv) == 2
    line = _one_line_error(capsys)
    assert expected in line and line.startswith("ngvi")


def test_device_must_exist_on_this_machine(monkeypatch, capsys):
    """'cuda' without CUDA is refused at parse time (exit 2), not after the first model is built."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    for device in ("cuda", "cuda:0"):
        assert cli.main(["bench", "--device", device, "--help"]) == 2
        line = _one_line_error(capsys)
        assert f"--device: device '{device}' is not available here; use cpu" in line
    assert arg_types.device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 1)
    assert arg_types.device("cuda") == "cuda" and arg_types.device("cuda:0") == "cuda:0"
    with pytest.raises(argparse.ArgumentTypeError, match="'cuda:3' is not available here: 1 cuda device"):
        arg_types.device("cuda:3")


def _uci_argv(out) -> list[str]:
    """A valid `ngvi uci` command whose data folder is missing (so it never fits anything)."""
    return ["uci", "--datasets", "yacht", "--methods", "vadam", "--out", str(out), "--data-dir", "/nowhere"]


@pytest.mark.parametrize("content", [b"[]", b"\xff\xfe garbage"])
def test_out_mistakes_exit_2_with_one_line_naming_the_path(tmp_path, capsys, content):
    file = tmp_path / "results.json"
    file.write_bytes(content)
    argv = _uci_argv(tmp_path)
    assert cli.main(argv) == 2
    line = _one_line_error(capsys)
    assert str(file) in line and "choose another --out" in line
    assert file.read_bytes() == content
    assert cli.main([*argv[:-4], "--out", str(file), "--data-dir", "/nowhere"]) == 2
    assert "is a file, not a folder" in _one_line_error(capsys)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ({"accuracy": 0.9}, "no 'config' or 'runs'"),  # another program's results.json
        ({"runs": {}}, "no 'config'"),
        ({"config": {}, "runs": {"yacht/vadam/0": 5}}, "job 'yacht/vadam/0' holds 5, not a result"),
        ({"config": {}, "runs": {"yacht/vadam/0": {}}}, "job 'yacht/vadam/0' holds {}, not a result"),
        ({"config": {}, "runs": {"a": [1] * 50}}, "job 'a' holds [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ..."),
    ],
)
def test_a_foreign_or_malformed_results_json_is_refused_and_never_rewritten(tmp_path, capsys, content, why):
    file = tmp_path / "results.json"
    file.write_text(json.dumps(content))
    before = file.read_bytes()
    assert cli.main(_uci_argv(tmp_path)) == 2
    line = _one_line_error(capsys)
    assert f"{file} is not an ngvi results file ({why}" in line
    assert line.endswith("remove it or choose another --out (the file is left as it is)")
    assert file.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_missing_data_names_the_flag(tmp_path, capsys):
    argv = ["uci", "--datasets", "yacht", "--out", str(tmp_path), "--data-dir", str(tmp_path / "nope")]
    assert cli.main(argv) == 2
    line = _one_line_error(capsys)
    assert "--data-dir" in line and str(tmp_path / "nope") in line


FUZZ_VALUES = [
    "0",
    "-3",
    "1",
    "2",
    "3.5",
    "nan",
    "inf",
    "-inf",
    "1e9",
    "",
    ",",
    "x",
    "yacht",
    "vadam,,bbvi",
    "\x00",
]


def _valid(action: argparse.Action) -> str | None:
    if action.choices:
        return str(next(iter(action.choices)))
    if isinstance(action.default, list):
        return ",".join(map(str, action.default[:1])) or None
    if action.default is None or isinstance(action.default, int):
        return "2"
    return str(action.default)


def _fuzz_argv(name: str, parser: argparse.ArgumentParser, rng: random.Random, tmp_path) -> list[str]:
    """Every option either left out, given a plausible value, or (rarely) a random one."""
    argv = [name]
    for action in parser._actions:
        if not action.option_strings or action.option_strings[-1] in ("--help", "--data-dir", "--merge-from"):
            continue
        flag, roll = action.option_strings[-1], rng.random()
        if roll < 0.4:
            continue
        if action.nargs == 0:
            argv.append(flag)
        elif flag == "--out":
            argv += [flag, rng.choice([str(tmp_path / "out"), str(tmp_path / "file"), str(tmp_path)])]
        else:
            value = _valid(action) if roll < 0.9 else None
            argv += [flag, value if value is not None else rng.choice(FUZZ_VALUES)]
    return [*argv, "--data-dir", str(tmp_path / "data")] if name == "uci" else argv


def test_cli_fuzz_every_subcommand_runs_or_gives_one_line(tmp_path, capsys, monkeypatch):
    """Random values for every option of every subcommand: each call is dispatched to its command (stubbed
    here: the real runs are tested elsewhere) or exits 2 with one clear line, never with a traceback."""
    (tmp_path / "file").write_text("not a folder")
    dispatched = []
    monkeypatch.setattr("ngvi.experiments.core.runner.run", lambda exp, args: dispatched.append(exp.name))
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    rng = random.Random(0)
    outcomes = {0: 0, 2: 0}
    for _ in range(300):
        name = rng.choice(list(COMMANDS))
        if not hasattr(command(name), "run_job"):  # `list`
            continue
        argv = _fuzz_argv(name, subparsers[name], rng, tmp_path)
        code = cli.main(argv)
        assert code in outcomes, argv
        outcomes[code] += 1
        if code:
            line = _one_line_error(capsys)
            assert line.startswith(f"ngvi {name}: error: "), (argv, line)
        else:
            capsys.readouterr()
    assert outcomes[0] > 10 and outcomes[2] > 10, outcomes
    assert len(dispatched) == outcomes[0]


def test_each_command_checks_only_the_extra_packages_it_imports(tmp_path, monkeypatch, capsys):
    """Without gymnasium, `ngvi rl` stops at once with the one-line install hint; `ngvi bench` runs."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gymnasium" else find_spec(name, *a)
    )
    dispatched = []
    monkeypatch.setattr("ngvi.experiments.core.runner.run", lambda exp, args: dispatched.append(exp.name))
    assert cli.main(["bench", "--quick", "--out", str(tmp_path)]) == 0
    assert dispatched == ["bench"]
    assert cli.main(["rl", "--quick", "--out", str(tmp_path)]) == 2
    assert _one_line_error(capsys) == (
        'ngvi rl: error: this command needs the experiments extra: pip install "ngvi[experiments]" '
        "(missing: gymnasium)"
    )
    assert dispatched == ["bench"]
    for name in COMMANDS:
        assert set(getattr(command(name), "requires", ())) <= cli.EXPERIMENTS_EXTRA, name


def test_an_explicit_option_wins_over_quick():
    """--quick fills only the options not given: `--quick --env X` runs X; `--quick --angles 30`, 30°."""
    parser = cli.build_parser()
    rl, classify = command("rl"), command("classify")
    quick = {"env": "Pendulum-v1", "steps": 300, "eval_every": 150, "test_episodes": 1}
    assert rl.config(parser.parse_args(["rl", "--quick"])) == quick
    given = parser.parse_args(["rl", "--quick", "--env", "MountainCarContinuous-v0", "--test-episodes", "3"])
    assert rl.config(given) == {**quick, "env": "MountainCarContinuous-v0", "test_episodes": 3}
    paper = {"env": "HalfCheetah-v5", "steps": 3_000_000, "eval_every": 10_000, "test_episodes": 20}
    assert rl.config(parser.parse_args(["rl"])) == paper
    with pytest.raises(ValueError, match=r"--eval-every \(150\) is more than --steps \(100\)"):
        rl.config(parser.parse_args(["rl", "--quick", "--steps", "100"]))

    config = classify.config(parser.parse_args(["classify", "--quick", "--angles", "30", "--epochs", "2"]))
    assert config["angles"] == [30.0] and config["epochs"] == 2
    assert (config["train_size"], config["test_samples"], config["batch_size"]) == (512, 4, 32)  # quick's
    config = classify.config(parser.parse_args(["classify", "--quick"]))
    assert config["angles"] == [0.0, 45.0, 90.0] and config["epochs"] == 1
    config = classify.config(parser.parse_args(["classify", "--angles", "30"]))
    assert config["angles"] == [30.0] and config["train_size"] is None and config["epochs"] == 5


def test_list_reads_the_registries(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(m.cls in out for m in METHODS.values())
    assert all(name in out for name in COMMANDS if name != "list")


def test_results_json_of_a_resumed_run_keeps_its_config(tmp_path, capsys):
    (tmp_path / "results.json").write_text(json.dumps({"config": {"seed": 5}, "runs": {}}))
    argv = _uci_argv(tmp_path)
    assert cli.main(argv) == 2
    assert "another configuration" in _one_line_error(capsys)
