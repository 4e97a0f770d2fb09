r"""DDPG (Lillicrap et al. 2015) whose actor acts with weights drawn from q at every time step
(Khan et al. 2018, App. K.3, Algorithms 1–2).

One time step t of :func:`train_step`, in the lines of Algorithm 1/2:

3. θ_t ~ q: enter the policy trainer's ``sampled_params`` (the plain variants act with μ);
4. act a_t = π_θt(s_t), step the environment, store (s_t, a_t, r_t, s'_t) in the replay buffer;
5. draw a minibatch of M transitions;
6. critic: one Adam step on ½·mean (r + γ(1 − d) Q_ω̃(s', π_μ̃(s')) − Q_ω(s, a))²;
7. policy gradient at θ_t through the updated critic: ∇_θ −mean Q_ω(s, π_θ(s));
8. leave the block (μ restored) and update q by the variant's rule;
9. Polyak averages of the targets: ω̃ ← (1−τ)ω̃ + τω, μ̃ ← (1−τ)μ̃ + τμ (the target actor follows μ).

The replay buffer and the Polyak update are stable-baselines3's (``ReplayBuffer``, ``polyak_update``); the
networks and the step are written here so that they can be put beside the algorithm. Networks as Lillicrap
et al.: 400 and 300 ReLU units, the action joins the critic at its second layer, the last layers start
uniform in ±3·10⁻³, the actor's output is tanh scaled to the action bounds.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

HIDDEN = (400, 300)
FINAL_INIT = 3e-3


def _final_layer(fan_in: int, out: int) -> nn.Linear:
    layer = nn.Linear(fan_in, out)
    nn.init.uniform_(layer.weight, -FINAL_INIT, FINAL_INIT)
    nn.init.uniform_(layer.bias, -FINAL_INIT, FINAL_INIT)
    return layer


class Actor(nn.Module):
    """π(s) = a_max · tanh(MLP(s)), 400-300 ReLU (torch's default init ±1/√fan_in, as Lillicrap et al.)."""

    def __init__(self, obs_dim: int, act_dim: int, act_scale: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim, HIDDEN[0]), nn.ReLU(), nn.Linear(HIDDEN[0], HIDDEN[1]), nn.ReLU(),
            _final_layer(HIDDEN[1], act_dim), nn.Tanh(),
        )  # fmt: skip
        self.act_scale = act_scale

    def forward(self, obs: Tensor) -> Tensor:
        return self.act_scale * self.net(obs)


class Critic(nn.Module):
    """Q(s, a): s → 400 ReLU, then [h, a] → 300 ReLU → 1."""

    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.first = nn.Linear(obs_dim, HIDDEN[0])
        self.second = nn.Linear(HIDDEN[0] + act_dim, HIDDEN[1])
        self.out = _final_layer(HIDDEN[1], 1)

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        h = torch.relu(self.first(obs))
        return self.out(torch.relu(self.second(torch.cat([h, action], dim=-1))))


@dataclass(frozen=True)
class DDPGConfig:
    """App. K: M = 64, κ = 10⁻³ (Adam), τ = 10⁻³; γ = 0.99 and the buffer of 10⁶ as Lillicrap et al."""

    batch_size: int = 64
    critic_lr: float = 1e-3
    tau: float = 1e-3
    gamma: float = 0.99
    buffer_size: int = 1_000_000


class DDPG:
    """Actor, critic, their targets, the critic's Adam and the actor's policy trainer (see variants)."""

    def __init__(self, obs_dim: int, act_dim: int, act_scale: float, make_trainer: Any, seed: int,
                 config: DDPGConfig = DDPGConfig()):  # fmt: skip
        torch.manual_seed(seed)
        self.config = config
        self.actor = Actor(obs_dim, act_dim, act_scale)
        self.critic = Critic(obs_dim, act_dim)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=config.critic_lr)
        self.policy = make_trainer(list(self.actor.parameters()), seed)

    @torch.no_grad()
    def act(self, obs: np.ndarray) -> np.ndarray:
        """The action of the actor's current weights (a sample θ_t inside ``policy.sampled_params``)."""
        return self.actor(torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0))[0].numpy()

    def explore(self, action: np.ndarray) -> np.ndarray:
        """The action with the policy trainer's action noise, if any (the others explore through θ_t)."""
        noise = getattr(self.policy, "explore", None)
        return action if noise is None else noise(action, self.actor.act_scale)

    def critic_step(
        self, obs: Tensor, action: Tensor, reward: Tensor, next_obs: Tensor, done: Tensor
    ) -> float:
        """Line 6: one Adam step on the squared TD error, targets from the target networks."""
        with torch.no_grad():
            target = reward + self.config.gamma * (1 - done) * self.critic_target(
                next_obs, self.actor_target(next_obs)
            )
        loss = 0.5 * (self.critic(obs, action) - target).square().mean()
        self.critic_opt.zero_grad()
        loss.backward()
        self.critic_opt.step()
        return float(loss.detach())

    def policy_gradient(self, obs: Tensor) -> None:
        """Line 7: ∇_θ of −mean Q_ω(s, π_θ(s)) at the actor's current weights, left in their ``.grad``."""
        self.policy.zero_grad()
        self.critic.requires_grad_(False)  # only the actor's gradient is wanted
        try:
            (-self.critic(obs, self.actor(obs)).mean()).backward()
        finally:
            self.critic.requires_grad_(True)

    def update_targets(self) -> None:
        """Line 9: ω̃ ← (1−τ)ω̃ + τω and μ̃ ← (1−τ)μ̃ + τμ (call outside ``sampled_params``: μ, not θ)."""
        from stable_baselines3.common.utils import polyak_update

        polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.config.tau)
        polyak_update(self.actor.parameters(), self.actor_target.parameters(), self.config.tau)


def make_buffer(env: Any, size: int) -> Any:
    from stable_baselines3.common.buffers import ReplayBuffer

    return ReplayBuffer(
        size, env.observation_space, env.action_space, device="cpu", handle_timeout_termination=True
    )


def train_step(agent: DDPG, env: Any, buffer: Any, obs: np.ndarray) -> tuple[np.ndarray, float, bool]:
    """One time step of Algorithm 1/2; returns (next observation, reward, episode ended). Learning
    (lines 5–9) starts once the buffer holds a minibatch."""
    learn = buffer.size() >= agent.config.batch_size
    with agent.policy.sampled_params(train=learn):  # line 3: θ_t ~ q, restored to μ on exit
        action = agent.explore(agent.act(obs))  # line 4
        next_obs, reward, terminated, truncated, _ = env.step(action)
        # a time limit is not a terminal state: the buffer keeps bootstrapping through it
        info = {"TimeLimit.truncated": truncated and not terminated}
        buffer.add(obs, next_obs, action, np.array([reward]), np.array([terminated or truncated]), [info])
        if learn:
            batch = buffer.sample(agent.config.batch_size)  # line 5
            f32 = [
                t.float()
                for t in (
                    batch.observations,
                    batch.actions,
                    batch.rewards,
                    batch.next_observations,
                    batch.dones,
                )
            ]
            agent.critic_step(f32[0], f32[1], f32[2], f32[3], f32[4])  # line 6
            agent.policy_gradient(f32[0])  # line 7
    if learn:
        agent.policy.step()  # line 8
        agent.update_targets()  # line 9
    return next_obs, float(reward), bool(terminated or truncated)


def evaluate(agent: DDPG, env: Any, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` test episodes acting with μ (no exploration)."""
    returns = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(agent.act(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))
