"""TRPO (sb3-contrib) with VIME's intrinsic reward added to each rollout before its advantages.

Per iteration, as the authors' ``BatchPolopt.train`` (github.com/openai/vime): sample ``n_steps`` with the
policy; the dynamics model as it stood scores every transition (its information gain, normalised by the
recent medians, times η, is added to the reward that TRPO sees); the transitions join the replay pool; the
dynamics model is fitted to the pool; TRPO updates the policy. The first iteration, and any before the pool
holds ``min_pool`` transitions, has no intrinsic reward (no fitted model yet).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from sb3_contrib import TRPO
from stable_baselines3.common.utils import obs_as_tensor

from .dynamics import BBBDynamics, Dynamics, KFACDynamics, normalised


class Recorder(gym.Wrapper):
    """Keeps every transition (s, a as applied, s′) and each finished episode's extrinsic return."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.transitions: list[np.ndarray] = []
        self.returns: list[float] = []
        self._obs, self._return = None, 0.0

    def reset(self, **kwargs):
        self._obs, info = self.env.reset(**kwargs)
        self._return = 0.0
        return self._obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        act = np.clip(np.asarray(action, dtype=np.float32), self.action_space.low, self.action_space.high)
        self.transitions.append(np.concatenate([self._obs, act, obs]).astype(np.float32))
        self._obs, self._return = obs, self._return + float(reward)
        if terminated or truncated:
            self.returns.append(self._return)
        return obs, reward, terminated, truncated, info

    def drain(self) -> tuple[np.ndarray, list[float]]:
        rows, returns = np.stack(self.transitions), self.returns
        self.transitions, self.returns = [], []
        return rows, returns


class VIMETRPO(TRPO):
    """TRPO whose ``collect_rollouts`` adds η × normalised information gain (none without ``dynamics``)."""

    def setup_vime(self, recorder: Recorder, dynamics: Dynamics | None, eta: float, fit: dict[str, int]):
        self.recorder, self.dynamics, self.eta, self.fit = recorder, dynamics, eta, fit
        self.kl_history: list[float] = []
        self.log: dict[str, list[Any]] = {"return": [], "episodes": [], "intrinsic": [], "dynamics_nll": []}

    def collect_rollouts(self, env, callback, rollout_buffer, n_rollout_steps) -> bool:
        if not super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps):
            return False
        rows, returns = self.recorder.drain()
        bonus = np.zeros(len(rows))
        dyn = self.dynamics
        if dyn is not None and dyn.pool.size >= self.fit["min_pool"]:
            bonus = self.eta * normalised(dyn.information_gain(rows), self.kl_history)
            rollout_buffer.rewards += bonus.reshape(rollout_buffer.rewards.shape).astype(np.float32)
            with torch.no_grad():
                last = self.policy.predict_values(obs_as_tensor(self._last_obs, self.device))
            rollout_buffer.compute_returns_and_advantage(last_values=last, dones=self._last_episode_starts)
        nll = None
        if dyn is not None:
            dyn.pool.add(rows[:, : dyn.obs_dim], rows[:, dyn.obs_dim : -dyn.obs_dim], rows[:, -dyn.obs_dim :])
            if dyn.pool.size >= self.fit["min_pool"]:
                nll = dyn.fit(self.fit["updates"], self.fit["batch"])
        self.log["return"].append(float(np.mean(returns)) if returns else None)
        self.log["episodes"].append(len(returns))
        self.log["intrinsic"].append(float(bonus.mean()))
        self.log["dynamics_nll"].append(nll)
        return True


def train(
    env: gym.Env,
    arm: str,
    seed: int,
    *,
    iterations: int,
    n_steps: int,
    eta: float,
    hidden: int,
    fit: dict[str, int],
) -> dict[str, list[Any]]:
    """Train one (task, arm, seed); per iteration: mean extrinsic episode return, episodes, mean bonus."""
    recorder = Recorder(env)
    recorder.reset(seed=seed)
    recorder.action_space.seed(seed)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    dynamics = {"trpo": None, "bbb": BBBDynamics, "nng_mvg": KFACDynamics}[arm]
    agent = VIMETRPO(
        "MlpPolicy",
        recorder,
        n_steps=n_steps,
        batch_size=min(100, n_steps),
        gamma=0.99,
        target_kl=0.01,  # TRPO's step size (the authors' step_size=0.01)
        policy_kwargs={"net_arch": [64, 32]},  # the authors' GaussianMLPPolicy(hidden_sizes=(64, 32))
        seed=seed,
        device="cpu",
    )
    agent.setup_vime(
        recorder, None if dynamics is None else dynamics(obs_dim, act_dim, hidden, seed), eta, fit
    )
    agent.learn(total_timesteps=iterations * n_steps)
    return agent.log
