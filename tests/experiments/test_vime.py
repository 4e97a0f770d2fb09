"""`ngvi vime`: the information gains against analytic truths and the optimizers' own steps, the tasks'
physics and rewards, and a quick run through the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

pytest.importorskip("sb3_contrib")
pytest.importorskip("gymnasium")

from ngvi.experiments.cli import main
from ngvi.experiments.vime import dynamics as dyn
from ngvi.experiments.vime.tasks import CartpoleSwingup, make_task


def _fitted(kind, seed=0, updates=60, **kwargs):
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = kind(2, 1, 8, seed, **kwargs)
    obs = rng.normal(size=(400, 2)).astype(np.float32)
    act = rng.uniform(-1, 1, size=(400, 1)).astype(np.float32)
    nxt = (obs + 0.1 * act).astype(np.float32)  # a simple linear system
    model.pool.add(obs, act, nxt)
    model.fit(updates, 32)
    return model, np.concatenate([obs, act, nxt], 1)


def test_mvg_kl_matches_the_dense_gaussian_kl():
    torch.manual_seed(0)
    r, c = 3, 4

    def spd(n):
        x = torch.randn(n, n, dtype=torch.float64)
        return x @ x.T + n * torch.eye(n, dtype=torch.float64)

    m1, m2 = torch.randn(r, c, dtype=torch.float64), torch.randn(r, c, dtype=torch.float64)
    u1, v1, u2, v2 = spd(r), spd(c), spd(r), spd(c)
    # vec over rows: W[i, j] at index i·c + j, so cov = U ⊗ V
    p = torch.distributions.MultivariateNormal(m1.reshape(-1), torch.kron(u1, v1))
    q = torch.distributions.MultivariateNormal(m2.reshape(-1), torch.kron(u2, v2))
    truth = torch.distributions.kl_divergence(p, q)
    torch.testing.assert_close(dyn.mvg_kl(m1, u1, v1, m2, u2, v2), truth, rtol=1e-10, atol=1e-12)
    batched = dyn.mvg_kl(torch.stack([m1, m2]), torch.stack([u1, u2]), torch.stack([v1, v2]), m2, u2, v2)
    torch.testing.assert_close(batched, torch.stack([truth, torch.zeros((), dtype=torch.float64)]))


def test_nng_information_gain_is_the_kl_after_noisy_kfacs_own_step_at_the_mean():
    model, rows = _fitted(dyn.KFACDynamics, sampling="weights")  # no per-example noise in its step
    batched = model.information_gain(rows[:3])
    opt = model.optimizer
    before = opt.posterior()
    state = {k: v.clone() for k, v in model.model.state_dict().items()}
    opt_state = opt.state_dict()
    opt._perturbs_in_step = False  # the step at the mean, as the information gain takes it
    for k in range(3):
        model.model.load_state_dict(state)
        opt.load_state_dict(opt_state)
        x, y = model.standardise(rows[k : k + 1])

        def closure(x=x, y=y):
            opt.zero_grad()
            loss = dyn.nll(model.model(x), y).mean()
            loss.backward()
            return loss

        opt.step(closure)
        kl = float(opt.posterior().kl(before))
        assert batched[k] == pytest.approx(kl, rel=1e-4), k


def test_second_order_kl_is_the_exact_diagonal_kl_after_the_newton_step_to_second_order():
    from ngvi.posterior import DiagonalGaussian

    torch.manual_seed(1)
    mu, std = torch.randn(6, dtype=torch.float64), torch.rand(6, dtype=torch.float64) + 0.2
    g_mu, g_rho = torch.randn(1, 6, dtype=torch.float64), torch.randn(1, 6, dtype=torch.float64)
    for step in (1e-2, 1e-3):
        # the Newton step on the KL-regularised loss from q: Δμ = −λ σ² ∇_μ, Δρ = −λ ∇_ρ / 2
        moved = DiagonalGaussian(
            [mu - step * std**2 * g_mu[0]], [(std * torch.exp(-step * g_rho[0] / 2)) ** 2]
        )
        exact = float(moved.kl(DiagonalGaussian([mu], [std**2])))
        approx = float(dyn.second_order_kl(std, g_mu, g_rho, step)[0])
        assert approx == pytest.approx(exact, rel=5 * step)  # agrees to O(λ³)


@pytest.mark.parametrize("kind", [dyn.BBBDynamics, dyn.KFACDynamics])
def test_a_novel_transition_gains_more_information_than_the_ones_trained_on(kind):
    model, rows = _fitted(kind, updates=150)
    novel = np.array([[4.0, -4.0, 1.0, -3.0, 3.0]], dtype=np.float32)  # far from the data, off the dynamics
    gains = model.information_gain(np.concatenate([rows[:50], novel]))
    assert np.isfinite(gains).all() and (gains > 0).all()
    assert gains[-1] > 10 * np.median(gains[:-1])


def test_normalised_divides_by_the_mean_of_recent_medians():
    history: list[float] = []
    np.testing.assert_allclose(dyn.normalised(np.array([1.0, 2.0, 3.0]), history), [0.5, 1.0, 1.5])
    out = dyn.normalised(np.array([4.0, 4.0]), history)  # medians 2 and 4: divided by 3
    np.testing.assert_allclose(out, [4 / 3, 4 / 3])
    assert history == [2.0, 4.0]


def test_cartpole_conserves_energy_without_force_and_rewards_only_the_pole_up():
    env = CartpoleSwingup()
    env.reset(seed=3)
    start = env.energy(env.state)
    for _ in range(20):  # 1 s, no force
        env.step(np.zeros(1))
    assert env.energy(env.state) == pytest.approx(start, rel=1e-4)
    env.state = np.array([0.0, 0.0, 0.1, 0.0])  # up: cos θ > 0.8
    assert env.step(np.zeros(1))[1] == 1.0
    env.state = np.array([0.0, 0.0, math.pi, 0.0])  # hanging: at rest, no reward
    obs, reward, terminated, _, _ = env.step(np.zeros(1))
    assert reward == 0.0 and not terminated
    np.testing.assert_allclose(obs[2:4], [-1.0, 0.0], atol=1e-6)
    env.state = np.array([2.99, 5.0, 0.0, 0.0])  # leaves |x| ≤ 3: ends, unrewarded
    _, reward, terminated, _, _ = env.step(np.zeros(1))
    assert terminated and reward == 0.0


def test_cartpole_pushes_the_cart_the_way_of_the_force():
    env = CartpoleSwingup()
    env.state = np.array([0.0, 0.0, math.pi, 0.0])
    env.step(np.ones(1))
    assert env.state[1] > 0 and env.state[0] > 0


def test_sparse_mountain_car_rewards_one_at_the_goal_and_nothing_before():
    env = make_task("mountain_car")
    env.reset(seed=0)
    _, reward, terminated, _, _ = env.step(np.array([1.0]))
    assert reward == 0.0 and not terminated  # gymnasium's action cost is gone
    env.unwrapped.state = np.array([0.449, 0.05])
    _, reward, terminated, _, _ = env.step(np.array([1.0]))
    assert terminated and reward == 1.0


def test_quick_run_records_returns_bonuses_and_the_figure(tmp_path):
    out = tmp_path / "vime"
    assert main(["vime", "--quick", "--out", str(out), "--jobs", "1"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["tasks"] == ["mountain_car"] and results["config"]["iterations"] == 3
    assert sorted(results["runs"]) == [f"mountain_car/{a}/seed0" for a in ("bbb", "nng_mvg", "trpo")]
    for key, run in results["runs"].items():
        assert len(run["return"]) == len(run["intrinsic"]) == len(run["episodes"]) == 3, key
        assert all(r is None or 0.0 <= r <= 1.0 for r in run["return"])  # sparse: at most 1 per episode
        assert sum(run["episodes"]) >= 3  # 500-step horizon, 500 steps per iteration
        if key.endswith("/trpo/seed0"):
            assert run["intrinsic"] == [0.0, 0.0, 0.0]
        else:  # no model before the first fit; a positive, finite bonus after it
            assert run["intrinsic"][0] == 0.0
            assert all(math.isfinite(b) and b > 0 for b in run["intrinsic"][1:]), run["intrinsic"]
            assert all(math.isfinite(n) for n in run["dynamics_nll"])
    assert (out / "vime.png").stat().st_size > 10_000
    assert "TRPO+NNG-MVG (VIME)" in (out / "table.md").read_text()


def test_the_cli_lists_the_tasks_that_the_task_module_builds():
    from ngvi.experiments.vime import experiment, tasks

    assert experiment.TASKS == tasks.TASKS
