"""`ngvi rl`: DDPG's pieces against hand computations, the sampled actor restored to μ, the variants'
update rules, and a tiny Pendulum run through the CLI."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

import ngvi
from ngvi.experiments.cli import main
from ngvi.experiments.rl import ddpg, report
from ngvi.experiments.rl.variants import VARIANTS, ActionNoise, ExplorationVadam, SeparateGaussian

gym = pytest.importorskip("gymnasium")


def agent(variant: str = "vadam", seed: int = 0) -> ddpg.DDPG:
    return ddpg.DDPG(3, 1, 2.0, VARIANTS[variant].build, seed)


def test_polyak_update_of_both_targets_matches_a_hand_computation():
    a = agent()
    with torch.no_grad():  # move the online networks away from their targets
        for p in [*a.actor.parameters(), *a.critic.parameters()]:
            p.add_(torch.randn_like(p))
    online = [p.detach().clone() for p in [*a.actor.parameters(), *a.critic.parameters()]]
    target = [p.detach().clone() for p in [*a.actor_target.parameters(), *a.critic_target.parameters()]]
    a.update_targets()
    tau = a.config.tau
    after = [*a.actor_target.parameters(), *a.critic_target.parameters()]
    for new, old, src in zip(after, target, online, strict=True):
        torch.testing.assert_close(new, (1 - tau) * old + tau * src, rtol=1e-6, atol=1e-7)
    assert all(
        torch.equal(p, q)
        for p, q in zip([*a.actor.parameters(), *a.critic.parameters()], online, strict=True)
    )


@pytest.mark.parametrize("variant", ["vadagrad", "vadam", "sgd_explore", "adam_explore"])
def test_the_actor_acts_with_a_sample_and_is_restored_to_mu(variant):
    a = agent(variant)
    mu = [p.detach().clone() for p in a.actor.parameters()]
    obs = np.array([0.3, -0.2, 0.5], dtype=np.float32)
    with a.policy.sampled_params():
        theta = [p.detach().clone() for p in a.actor.parameters()]
        action = a.act(obs)
    assert all(not torch.equal(t, m) for t, m in zip(theta, mu, strict=True))  # θ ≠ μ: it explores
    assert all(torch.equal(p, m) for p, m in zip(a.actor.parameters(), mu, strict=True))  # μ back, bitwise
    sampled = copy.deepcopy(a.actor)
    with torch.no_grad():
        for p, t in zip(sampled.parameters(), theta, strict=True):
            p.copy_(t)
        np.testing.assert_array_equal(action, sampled(torch.as_tensor(obs)[None])[0].numpy())
    with pytest.raises(RuntimeError, match="boom"), a.policy.sampled_params():
        raise RuntimeError("boom")
    assert all(torch.equal(p, m) for p, m in zip(a.actor.parameters(), mu, strict=True))


def test_a_learning_step_updates_the_target_actor_from_mu_not_from_the_sample():
    env = gym.make("Pendulum-v1")
    a = agent("vadam")
    buffer = ddpg.make_buffer(env, 1000)
    obs, _ = env.reset(seed=0)
    for _ in range(a.config.batch_size):  # fill one minibatch: no learning yet, the targets stay
        obs, _, _ = ddpg.train_step(a, env, buffer, obs)
    assert a.policy.num_steps == 0
    target = [p.detach().clone() for p in a.actor_target.parameters()]
    ddpg.train_step(a, env, buffer, obs)
    assert a.policy.num_steps == 1
    tau = a.config.tau
    for new, old, mu in zip(a.actor_target.parameters(), target, a.actor.parameters(), strict=True):
        torch.testing.assert_close(new, (1 - tau) * old + tau * mu.detach(), rtol=1e-6, atol=1e-7)


def test_exploration_vadam_steps_as_vadam_with_n_1_and_samples_with_precision_s_plus_lambda_plus_c():
    torch.manual_seed(0)
    mu0 = torch.randn(5)
    direction = torch.randn(5)  # F(θ) = direction·θ: the gradient is the same at every sample
    w1, w2 = mu0.clone().requires_grad_(), mu0.clone().requires_grad_()
    explore = ExplorationVadam([w1], lr=0.1, seed=1)
    plain = ngvi.Vadam([w2], data_size=1, lr=0.1, prior_prec=1e-8, init_prec=None, seed=2)
    for _ in range(4):
        for opt, w in ((explore, w1), (plain, w2)):
            with opt.sampled_params(train=True):
                opt.zero_grad()
                (direction * w).sum().backward()
            opt.step()
    torch.testing.assert_close(w1, w2, rtol=0, atol=0)  # the same μ: c changes only the sampling
    s = explore.state[w1]["exp_avg_sq"]
    torch.testing.assert_close(explore.posterior().variance[0], 1 / (s + 1e-8 + 1e4))
    torch.testing.assert_close(plain.posterior().variance[0], 1 / (s + 1e-8))


def test_separate_gaussian_hands_the_reparameterisation_gradients_to_mean_and_variance():
    w = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    vo = SeparateGaussian([w], lambda p: torch.optim.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.01),
                          init_prec=4.0, seed=0)  # fmt: skip
    with vo.sampled_params(train=True):
        vo.zero_grad()
        theta = w.detach().clone()
        (0.5 * w.square()).sum().backward()  # F(θ) = ½‖θ‖²: ∂F/∂θ = θ
    eps = (theta - torch.tensor([0.5, -1.0, 2.0])) / 0.5  # σ = 1/√4
    torch.testing.assert_close(w.grad, theta)  # ∇_μ = ĝ
    torch.testing.assert_close(vo.var[0].grad, theta * eps / (2 * 0.5))  # ∇_σ² = ĝ ε / (2σ)
    vo.step()
    torch.testing.assert_close(w.detach(), torch.tensor([0.5, -1.0, 2.0]) - 0.1 * theta)
    assert bool((vo.var[0] >= vo.min_var).all())


def test_adam_action_acts_with_mu_plus_clipped_gaussian_action_noise_and_steps_as_adam():
    env = gym.make("Pendulum-v1")  # actions in [−2, 2]
    a, plain = agent("adam_action", seed=3), agent("adam_plain", seed=3)
    buffer = ddpg.make_buffer(env, 1000)
    obs, _ = env.reset(seed=0)
    draws = np.random.default_rng(3)  # the variant's own stream, seeded as the agent
    for _ in range(5):
        mu = a.act(obs)
        with a.policy.sampled_params():  # acts with μ: nothing is sampled in weight space
            np.testing.assert_array_equal(a.act(obs), mu)
        expected = np.clip(mu + draws.normal(0.0, 0.1 * 2.0, size=mu.shape), -2.0, 2.0).astype(np.float32)
        obs, _, _ = ddpg.train_step(a, env, buffer, obs)
        np.testing.assert_array_equal(buffer.actions[buffer.pos - 1, 0], expected)  # stored noisy
    assert a.policy.explore(np.array([1.99, -1.99, 0.0], dtype=np.float32), 2.0).dtype == np.float32
    clipped = a.policy.explore(np.full(10_000, 1.95, dtype=np.float32), 2.0)
    assert clipped.max() == 2.0 and clipped.min() < 1.95  # noise on both sides, never past the bound
    # the weights learn as Adam-Plain's: same initialisation, same optimizer
    assert all(torch.equal(p, q) for p, q in zip(a.actor.parameters(), plain.actor.parameters(), strict=True))
    assert type(a.policy.optimizer) is type(plain.policy.optimizer)
    assert a.policy.optimizer.defaults == plain.policy.optimizer.defaults


def test_action_noise_scale_must_be_positive():
    with pytest.raises(ValueError, match=r"the action-noise scale must be > 0, got 0\.0"):
        ActionNoise(torch.optim.Adam([torch.zeros(1, requires_grad=True)]), 0.0, seed=0)


def _curve(steps: list[int], returns: list[float]) -> dict:
    return {"step": steps, "test_return": returns, "median_search_std": [None], "seconds": 1.0}


def test_area_is_the_trapezoid_area_from_step_0_over_the_steps():
    # 0 → 10 linearly over the first 10 steps, then 10 for 20 more: (½·10·10 + 20·10) / 30
    assert report.area(_curve([0, 10, 30], [0.0, 10.0, 10.0])) == pytest.approx(25 / 3, rel=1e-12)
    assert report.area(_curve([0, 5, 10], [-3.0, -3.0, -3.0])) == pytest.approx(-3.0, rel=1e-12)


def test_paired_area_difference_is_seed_by_seed_with_a_paired_t_test():
    from scipy import stats

    base = [_curve([0, 10], [r, r]) for r in (0.0, 100.0, -50.0)]  # constant curves: area = the value
    other = [
        _curve([0, 10], [r + d, r + d]) for r, d in zip((0.0, 100.0, -50.0), (1.0, 2.0, -0.5), strict=True)
    ]
    mean, se, wins, p = report.paired({"vadam": other, "adam_action": base}, "vadam", "adam_action")
    d = np.array([1.0, 2.0, -0.5])
    se_hand = d.std(ddof=1) / np.sqrt(3)
    assert mean == pytest.approx(2.5 / 3, rel=1e-12) and se == pytest.approx(se_hand, rel=1e-12)
    assert wins == 2
    assert p == pytest.approx(2 * stats.t.sf(d.mean() / se_hand, df=2), rel=1e-9)
    table = report.table({"adam_action": base, "vadam": other}, {"env": "E", "steps": 10, "eval_every": 10,
                         "test_episodes": 1}, baseline="adam_action")  # fmt: skip
    assert "area − Adam-Action's, paired by seed" in table
    row = "| Vadam | 17.50 ± 44.79 | 17.50 ± 44.79 | 17.50 ± 44.79 | 0.83 ± 0.73 (2/3 seeds higher, p = "
    assert f"{row}{p:.2g}) |" in table


def test_the_default_variants_are_the_papers_six_without_adam_action():
    import argparse

    from ngvi.experiments.rl.experiment import EXPERIMENT
    from ngvi.experiments.rl.variants import TABLE3

    parser = argparse.ArgumentParser()
    EXPERIMENT.add_arguments(parser)
    assert parser.parse_args([]).variants == list(TABLE3)  # `ngvi rl` stays the paper's run
    assert parser.parse_args(["--variants", "adam_action,vadam"]).variants == ["adam_action", "vadam"]


def test_a_baseline_outside_the_variants_is_one_line(tmp_path, capsys):
    argv = ["rl", "--quick", "--variants", "vadam", "--baseline", "adam_action", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "--baseline adam_action is not among --variants (vadam): add it" in err


def test_rl_quick_on_pendulum_through_the_cli(tmp_path):
    out = tmp_path / "rl"
    args = [
        "rl",
        "--quick",
        "--variants",
        "vadam,adam_plain",
        "--baseline",
        "adam_plain",
        "--seeds",
        "1",
        "--out",
        str(out),
        "--jobs",
        "1",
    ]
    assert main(args) == 0
    png = (out / "rl.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    table = (out / "table.md").read_text()
    assert "| Vadam |" in table and "area − Adam-Plain's, paired by seed" in table
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert set(runs) == {"vadam/seed0", "adam_plain/seed0"}
    for r in runs.values():
        assert r["step"] == [0, 150, 300]
        # a Pendulum episode is 200 steps of reward in [−16.3, 0]
        assert all(-16.3 * 200 <= x <= 0 for x in r["test_return"])
    assert runs["vadam/seed0"]["median_search_std"][-1] < 1e-2  # 1/√(s + λ + c) ≤ 1/√c
    assert runs["adam_plain/seed0"]["median_search_std"] == [None, None]


def test_the_paired_figure_is_redrawn_from_results_json_alone(tmp_path, capsys):
    # issue 48: the figure of the seeds a verdict rests on, from the cache, no environment and no run
    runs = {}
    for s, (b, d) in enumerate([(0.0, 1.0), (100.0, 2.0), (-50.0, -0.5), (10.0, 3.0)]):
        runs[f"adam_action/seed{s}"] = _curve([0, 10, 20], [b, b, b])
        runs[f"vadam/seed{s}"] = _curve([0, 10, 20], [b + d, b + d, b + d])
    (tmp_path / "results.json").write_text(json.dumps({"config": {"env": "E"}, "runs": runs}))
    argv = [str(tmp_path), "--variants", "adam_action,vadam", "--baseline", "adam_action", "--seeds", "4"]
    report.main([*argv, "--looks", "2", "--out", "p.png"])
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):
        report.main([*argv[:-1], "5"])
    assert "has no run 'adam_action/seed4': run those seeds first" in capsys.readouterr().err
