"""An option given on the command line wins over --quick, in every experiment: `--quick --steps 7` runs 7
steps. Each case reads the experiment's `config` (bandits: `resolve`, which holds its sizes): nothing runs."""

from __future__ import annotations

from typing import Any

import pytest

from ngvi.experiments import command
from ngvi.experiments.bandits.agents import AGENTS
from ngvi.experiments.bandits.experiment import REAL_SETS
from ngvi.experiments.core.args import Parser

# (command, the option given, its config key, the value given, plain --quick's value, the default's)
CASES = [
    ("logreg", ["--splits", "3"], "splits", 3, 2, 20),
    ("logreg", ["--restarts", "5"], "restarts", 5, 2, 20),
    ("logreg", ["--steps", "7"], "steps", 7, 200, 20_000),
    ("logreg", ["--minibatch-steps", "7"], "minibatch_steps", 7, 200, 30_000),
    ("logreg", ["--toy-steps", "7"], "toy_steps", 7, 200, 500_000),
    ("prune", ["--epochs", "3"], "epochs", 3, 2, 100),
    ("prune", ["--subset", "64"], "subset", 64, 1000, None),
    ("minima", ["--steps", "7"], "steps", 7, 200, 5000),
    ("minima", ["--seeds", "2"], "seeds", 2, 1, 3),
    ("nng-precision", ["--epochs", "3"], "epochs", 3, 2, 300),
    ("demo", ["--steps", "7"], "steps", 7, 300, 6000),
    ("convergence", ["--steps", "7"], "steps", 7, 60, 5000),
    ("convergence", ["--seeds", "2"], "seeds", 2, 1, 3),
    ("bench", ["--warmup", "3"], "warmup", 3, 2, 5),
    ("bench", ["--rounds", "3"], "rounds", 3, 2, 6),
    ("bench", ["--steps", "3"], "steps", 3, 2, 10),
    ("bench", ["--sweep", "8"], "sweep", [8], [16, 48], [100, 300, 1000, 3000]),
    ("charlm", ["--train-chars", "1000"], "train_chars", 1000, 80_000, 200_000),
    ("charlm", ["--test-chars", "1000"], "test_chars", 1000, 5_000, 50_000),
    ("charlm", ["--hidden", "8"], "hidden", 8, 32, 128),
    ("charlm", ["--layers", "3"], "layers", 3, 1, 2),
    ("charlm", ["--epochs", "2"], "epochs", 2, 5, 50),
    ("charlm", ["--seeds", "2"], "seeds", 2, 1, 1),
    ("bandits", ["--datasets", "wheel"], "datasets", ["wheel"], ["mushroom"], [*REAL_SETS, "wheel"]),
    ("bandits", ["--agents", "vogn"], "agents", ["vogn"], ["vadam", "greedy", "uniform"], list(AGENTS)),
    ("bandits", ["--contexts", "mushroom=50"], "contexts", {"mushroom": 50}, {"*": 300}, {}),
    ("bandits", ["--runs", "2"], "runs", 2, 12, 10),
    ("active", ["--rounds", "3"], "rounds", 3, 2, 10),
    ("active", ["--refit-steps", "7"], "budget.refit_steps", 7, 10, 100),
    ("calibration", ["--steps", "7"], "steps", 7, 40, 2000),
    ("calibration", ["--samples", "3"], "samples", 3, 8, 64),
]  # fmt: skip


def _values(name: str, argv: list[str]) -> dict[str, Any]:
    experiment = command(name)
    parser = Parser(prog=f"ngvi {name}")
    experiment.add_arguments(parser)
    args = parser.parse_args(argv)
    if name == "bandits":  # its config is the protocol; the sizes are resolved from the arguments
        return vars(experiment.resolve(args))
    config = experiment.config(args)
    return {**config, **{f"budget.{k}": v for k, v in config.get("budget", {}).items()}}


@pytest.mark.parametrize(
    ("name", "argv", "key", "given", "quick", "default"),
    CASES,
    ids=[f"{c[0]}{c[1][0]}" for c in CASES],
)
def test_an_option_given_wins_over_quick(
    name: str, argv: list[str], key: str, given: Any, quick: Any, default: Any
) -> None:
    assert _values(name, ["--quick", *argv])[key] == given
    assert _values(name, [*argv, "--quick"])[key] == given  # the order on the command line is no matter
    assert _values(name, ["--quick"])[key] == quick
    assert _values(name, [])[key] == default
    assert _values(name, argv)[key] == given


def test_quick_shrinks_only_what_is_left_out() -> None:
    """`--quick --epochs 3` keeps --quick's tiny data subset; the same for charlm's embedding."""
    config = _values("prune", ["--quick", "--epochs", "3"])
    assert (config["epochs"], config["subset"]) == (3, 1000)
    config = _values("charlm", ["--quick", "--hidden", "8"])
    assert (config["hidden"], config["layers"], config["embedding"]) == (8, 1, 16)
    assert _values("charlm", ["--hidden", "8"])["embedding"] == 64
