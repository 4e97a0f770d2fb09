r"""The sparse-reward tasks of VIME (Houthooft et al. 2016, §3.1), on gymnasium.

Each is rewarded only at its goal, as the authors' task code (github.com/openai/vime, ``envs/``) defines it:

* ``mountain_car``: gymnasium's MountainCarContinuous-v0 dynamics; reward 1 on the step that reaches the goal
  (x ≥ 0.45), which ends the episode, else 0 (gymnasium's own reward adds 100 there and an action cost at
  every step; both are dropped). Gymnasium's start (x ∈ [−0.6, −0.4], at rest), not the authors' random
  initial speed.
* ``cartpole_swingup``: the cart-pole of Barto et al. (1983) with the pole started hanging down; reward 1 per
  step while the pole is up (cos θ > 0.8) and the cart within |x| ≤ 3, which ends the episode when left.
  Built here (:class:`CartpoleSwingup`): gymnasium has no swing-up.
* ``half_cheetah``: HalfCheetah-v5; reward 1 per step while the torso is past x = 5, else 0.

Every task is cut at ``horizon`` steps (500, the authors' ``max_path_length``).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

TASKS = ("mountain_car", "cartpole_swingup", "half_cheetah")
HORIZON = 500


class CartpoleSwingup(gym.Env):
    r"""Frictionless cart-pole, θ = 0 upright, integrated by RK4 with the force held over each step.

    Cart mass M, pole mass m, half-length l (a uniform rod, inertia m l²/3 about its centre), force 10·a with
    a ∈ [−1, 1]. The equations of motion are those of gymnasium's CartPole (Florian 2007) and conserve

    .. math:: E = \tfrac12 (M+m)\dot x^2 + m l \dot x \dot\theta\cos\theta + \tfrac23 m l^2 \dot\theta^2
                 + m g l\cos\theta

    when the force is zero. Observation (x, ẋ, cos θ, sin θ, θ̇); the start draws x ∈ [−1, 1], ẋ ∈ [−2, 2],
    θ ∈ π ± 1, θ̇ ∈ [−3, 3] (the authors' ``reset``).
    """

    gravity, cart_mass, pole_mass, half_length, force_scale, dt = 9.8, 1.0, 0.1, 0.5, 10.0, 0.05
    x_limit = 3.0

    def __init__(self) -> None:
        high = np.array([np.inf] * 5, dtype=np.float32)
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.state = np.zeros(4)

    def derivatives(self, state: np.ndarray, force: float) -> np.ndarray:
        """(ẋ, ẍ, θ̇, θ̈) at ``state`` = (x, ẋ, θ, θ̇)."""
        _, x_dot, theta, theta_dot = state
        m, total, l = self.pole_mass, self.cart_mass + self.pole_mass, self.half_length
        sin, cos = math.sin(theta), math.cos(theta)
        temp = (force + m * l * theta_dot**2 * sin) / total
        theta_acc = (self.gravity * sin - cos * temp) / (l * (4.0 / 3.0 - m * cos**2 / total))
        x_acc = temp - m * l * theta_acc * cos / total
        return np.array([x_dot, x_acc, theta_dot, theta_acc])

    def energy(self, state: np.ndarray) -> float:
        _, x_dot, theta, theta_dot = state
        m, total, l = self.pole_mass, self.cart_mass + self.pole_mass, self.half_length
        kinetic = 0.5 * total * x_dot**2 + m * l * x_dot * theta_dot * math.cos(theta)
        return kinetic + 2.0 / 3.0 * m * l**2 * theta_dot**2 + m * self.gravity * l * math.cos(theta)

    def _obs(self) -> np.ndarray:
        x, x_dot, theta, theta_dot = self.state
        return np.array([x, x_dot, math.cos(theta), math.sin(theta), theta_dot], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        low, high = np.array([-1.0, -2.0, math.pi - 1, -3.0]), np.array([1.0, 2.0, math.pi + 1, 3.0])
        self.state = self.np_random.uniform(low, high)
        return self._obs(), {}

    def step(self, action):
        force = self.force_scale * float(np.clip(np.asarray(action).reshape(-1)[0], -1.0, 1.0))
        s, h = self.state, self.dt
        k1 = self.derivatives(s, force)
        k2 = self.derivatives(s + 0.5 * h * k1, force)
        k3 = self.derivatives(s + 0.5 * h * k2, force)
        k4 = self.derivatives(s + h * k3, force)
        self.state = s + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        out = abs(self.state[0]) > self.x_limit
        reward = 1.0 if not out and math.cos(self.state[2]) > 0.8 else 0.0
        return self._obs(), reward, out, False, {}


class SparseMountainCar(gym.Wrapper):
    """MountainCarContinuous-v0 rewarded 1 at the goal only (the episode ends there)."""

    def step(self, action):
        obs, _, terminated, truncated, info = self.env.step(action)
        return obs, float(terminated), terminated, truncated, info


class SparseHalfCheetah(gym.Wrapper):
    """HalfCheetah-v5 rewarded 1 per step while the torso is past x = 5."""

    goal_x = 5.0

    def step(self, action):
        obs, _, terminated, truncated, info = self.env.step(action)
        return obs, float(info["x_position"] > self.goal_x), terminated, truncated, info


def make_task(name: str, horizon: int = HORIZON) -> gym.Env:
    """The sparse task ``name`` (one of :data:`TASKS`), cut at ``horizon`` steps."""
    if name == "mountain_car":
        env = SparseMountainCar(gym.make("MountainCarContinuous-v0").unwrapped)
    elif name == "cartpole_swingup":
        env = CartpoleSwingup()
    elif name == "half_cheetah":
        env = SparseHalfCheetah(gym.make("HalfCheetah-v5").unwrapped)
    else:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    return gym.wrappers.TimeLimit(env, max_episode_steps=horizon)
