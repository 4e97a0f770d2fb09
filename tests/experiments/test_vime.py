"""`ngvi vime`: the information gains against analytic truths and the optimizers' own steps, the tasks'
physics and rewards, and a quick run through the CLI."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("sb3_contrib")
pytest.importorskip("gymnasium")

from ngvi.experiments.vime import dynamics as dyn


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
    opt.perturbs_in_step = False  # the step at the mean, as the information gain takes it
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
