"""`ngvi bandits`: the score and regret against hand-computed values, the protocol's mechanics (initial pulls,
sessions, N = t × batch, the step-size schedule), Thompson sampling's one draw per round, and the reduced
mushroom run in which Thompson sampling with Vadam beats greedy and uniform (seeds fixed)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

import ngvi
from ngvi.experiments.bandits import protocol as bp
from ngvi.experiments.bandits.experiment import QUICK, load_problem
from ngvi.experiments.cli import main
from ngvi.experiments.data import load_mushroom_bandit, wheel_bandit

TINY = bp.Protocol(train_steps=2, batch_size=8, hidden=(8, 8))


def test_normalised_reward_and_regret_by_hand():
    rewards = np.array([[1.0, 0.0], [0.0, 2.0], [5.0, -35.0]])
    opt = np.array([1.0, 2.0, 5.0])
    assert bp.normalised_reward(rewards, np.array([0, 1, 0]), opt) == 1.0  # always optimal
    assert bp.normalised_reward(rewards, np.array([1, 0, 1]), opt) == (0 + 0 - 35) / 8
    np.testing.assert_array_equal(bp.cumulative_regret(rewards, np.array([1, 0, 1]), opt), [1, 3, 43])
    with pytest.raises(ValueError, match="optimal cumulative reward is 0"):
        bp.normalised_reward(rewards, np.array([0, 0, 0]), np.zeros(3))
    with pytest.raises(ValueError, match="rewards must be"):
        bp.normalised_reward(rewards[0], np.array([0]), opt[:1])
    assert bp.curve_rounds(10, points=4).tolist() == [1, 4, 7, 10]


@pytest.mark.parametrize("rule, n_per_round", [("rounds_x_batch", 8), ("rounds", 1)])
def test_initial_pulls_sessions_and_data_size(rule, n_per_round):
    data = wheel_bandit(65, 0.5, seed=0)
    protocol = bp.Protocol(**{**TINY.config(), "data_size": rule})
    for agent in ("vadam", "ivon", "greedy"):
        played = bp.play(data, agent, protocol, seed=0)
        np.testing.assert_array_equal(played.actions[:15], np.arange(15) % 5)  # each of 5 arms 3 times
        assert played.sessions == 3  # after rounds 20, 40 and 60; the last 5 rounds are not trained on
        (group,) = played.agent.trainer.param_groups
        assert group["data_size"] == 60 * n_per_round  # N of the last session: t = 60 rounds seen
        assert group["lr"] == pytest.approx(0.1 / (1 + 0.5 * 1))  # the last of 2 steps, k = 1
        if agent == "ivon":  # δ = λ/N follows N, so the prior stays N(0, I/λ)
            assert group["weight_decay"] == pytest.approx(1.0 / (60 * n_per_round))
    assert bp.play(data, "uniform", protocol, seed=0).sessions == 0


def test_noisy_adam_keeps_its_own_step_size():
    played = bp.play(wheel_bandit(25, 0.5, seed=0), "noisy_adam", TINY, seed=0)
    assert played.agent.trainer.param_groups[0]["lr"] == pytest.approx(1e-3 / 1.5)


@pytest.mark.parametrize("agent", ["vadam", "vogn", "bbvi"])
def test_a_block_of_rounds_is_decided_as_one_round_after_another(agent):
    """Acting on the rounds between two sessions at once gives the actions of acting round by round with
    one posterior draw each (the same draws, in the same order). (MC dropout's masks and BAdam's linearised
    draws come from torch's generator in another order: the same distribution, other numbers.)"""
    data = wheel_bandit(40, 0.5, seed=1)
    a = bp.build_agent(agent, data, TINY, seed=0)
    b = copy.deepcopy(a)
    x = torch.as_tensor(data.contexts, dtype=torch.float32)[:12]
    block = a.act(x)
    one_by_one = [
        int(ngvi.predict(b.model, b.trainer, x[j : j + 1], samples=1)[0, 0].argmax()) for j in range(12)
    ]
    assert block.tolist() == one_by_one


def test_every_mushroom_context_is_seen_once(data_dir):
    """A run over fewer contexts than mushroom's rows takes the first rows of the run's permutation (the
    loader alone would draw with replacement, as Riquelme et al.'s sampler)."""
    spec = {"dataset": "mushroom", "contexts": 3000, "seed": 4, "data_dir": data_dir, "user_dir": None}
    data = load_problem(spec)
    full = load_mushroom_bandit(seed=4, data_dir=data_dir)
    np.testing.assert_array_equal(data.contexts, full.contexts[:3000])
    np.testing.assert_array_equal(data.rewards, full.rewards[:3000])
    np.testing.assert_array_equal(data.opt_rewards, full.opt_rewards[:3000])
    np.testing.assert_array_equal(data.mean_rewards, full.mean_rewards[:3000])
    with pytest.raises(ValueError, match="n must be"):
        full.head(0)


def test_thompson_draws_vary_greedy_does_not():
    data = wheel_bandit(40, 0.5, seed=1)
    x = torch.as_tensor(data.contexts[:1], dtype=torch.float32).repeat(60, 1)  # one context, 60 rounds
    for agent in ("vadam", "badam"):  # at the start q is the prior N(μ, I): wide
        assert len(set(bp.build_agent(agent, data, TINY, seed=0).act(x).tolist())) > 1
    assert len(set(bp.build_agent("greedy", data, TINY, seed=0).act(x).tolist())) == 1
    assert bp.build_agent("badam", data, TINY, seed=0).linearized


def test_quick_mushroom_vadam_beats_greedy_and_uniform(tmp_path, data_dir):
    """The reduced run CI executes (`ngvi bandits --quick`): on mushroom, Thompson sampling with Vadam earns
    more than greedy and than uniform over the same contexts and rewards (seeds fixed)."""
    out = tmp_path / "bandits"
    assert main(["bandits", "--quick", "--out", str(out), "--jobs", "2", "--data-dir", str(data_dir)]) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    score = {
        a: [runs[f"mushroom/{QUICK['contexts']}/{a}/{r}"]["normalised_reward"] for r in range(QUICK["runs"])]
        for a in QUICK["agents"]
    }
    mean = {a: float(np.mean(v)) for a, v in score.items()}
    assert mean["vadam"] > mean["greedy"] > mean["uniform"], mean
    assert mean["uniform"] == pytest.approx(-0.9, abs=0.2)  # BADAM: −0.93 ± 0.09
    table = (out / "table.md").read_text()
    assert "| Vadam |" in table and "0.76 ± 0.03" in table  # BADAM's Vadam cell beside ours
    assert (out / "regret.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a rerun resumes: nothing is recomputed
    before = (out / "results.json").read_text()
    assert main(["bandits", "--quick", "--out", str(out), "--jobs", "1", "--data-dir", str(data_dir)]) == 0
    assert json.loads((out / "results.json").read_text())["runs"] == json.loads(before)["runs"]


def test_bad_arguments_and_missing_data_are_one_line(tmp_path, capsys):
    for argv, expected in (
        (["--contexts", "0"], "--contexts: expected a positive integer"),
        (["--contexts", "yahoo=10"], "unknown data set 'yahoo'"),
        (["--deltas", "1.5"], "--deltas: expected radii"),
        (["--agents", "sgd"], "--agents: unknown sgd"),
    ):
        assert main(["bandits", "--out", str(tmp_path), *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and expected in err, err
    assert main(["bandits", "--datasets", "jester", "--out", str(tmp_path / "j")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not available offline" in err and "--user-data-dir" in err


def test_report_only_compares_a_problem_on_the_runs_every_agent_finished(tmp_path, capsys):
    """A stopped run leaves agents with different numbers of runs: the table takes the runs all of a
    problem's agents finished (paired), says how many, and --report-only runs nothing."""

    def result(score: float) -> dict:
        return {
            "normalised_reward": score,
            "contexts": 300,
            "curve_rounds": [1, 300],
            "curve_regret": [0.0, 100 * (1 - score)],
            "seconds": 1.0,
            "sessions": 15,
        }

    runs = {f"mushroom/300/vadam/{r}": result(s) for r, s in enumerate([0.5, 0.7, 0.9])}
    runs |= {f"mushroom/300/uniform/{r}": result(s) for r, s in enumerate([-1.0, -0.8])}
    out = tmp_path / "bandits"
    out.mkdir()
    config = {"protocol": bp.Protocol().config(), "seed": 0}
    (out / "results.json").write_text(json.dumps({"config": config, "runs": runs}))
    argv = ["bandits", "--datasets", "mushroom", "--agents", "vadam,uniform", "--contexts", "300"]
    assert main([*argv, "--runs", "3", "--report-only", "--out", str(out)]) == 0
    assert json.loads((out / "results.json").read_text())["runs"] == runs  # nothing ran
    table = (out / "table.md").read_text()
    assert "Mushroom: ours (T = 300, 2 runs)" in table and "each arm pulled 3 times first" in table
    assert "| Vadam | **0.60 ± 0.14** |" in table  # runs 0 and 1 only: mean 0.6, std 0.1·√2
    assert "| Uniform | -0.90 ± 0.14 |" in table
