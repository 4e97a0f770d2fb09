r"""One bandit run: the protocol of BADAM App. D.3 (Riquelme et al.'s setup) for one agent on one data set.

A data set gives T contexts in a fixed order and the reward every action would earn in each round. Round t
shows context x_t; the agent picks a_t and observes only r_t(a_t), which joins the replay buffer.

- **Initial pulls.** Rounds 0 … 3K − 1 (K actions) pull action t mod K: every arm 3 times.
- **Training.** After every ``train_every`` = 20 rounds: ``train_steps`` = 50 minibatches of 512 drawn
  uniformly with replacement from the buffer (Riquelme et al.'s ``get_batch_with_weights``). The network is
  not reset between sessions. The loss is the Gaussian NLL of the observed reward alone, (τ/2)·(r − f_a(x))²
  averaged over the minibatch, with τ = ``noise_prec``; the other outputs get no gradient.
- **Step size.** lr_k = lr₀/(1 + 0.5·k) at the k-th minibatch of a session, k = 0 … 49, with lr₀ = 0.1 (BADAM:
  "an initial learning rate of 0.1 with an inverse decaying schedule"; Riquelme et al.'s inverse-time decay
  with rate 0.5, restarted at every session).
- **N.** BADAM: "The number of points seen N is set dynamically as t × batch_size, where t is the number of
  rounds of the bandit." We read t as the number of rounds observed when the session starts (the buffer
  size), so a session after t rounds trains with N = 512·t (``data_size="rounds_x_batch"``). Riquelme et
  al.'s BBB uses N = t, the buffer size: ``data_size="rounds"``.
- **Acting.** The posterior only changes in a training session, so the rounds between two sessions are
  decided together: row j of the block is decided by its own posterior draw (see :meth:`.Agent.act`), which
  is the same as deciding the rounds one after another.

The score is BADAM Table 1's: the cumulative reward normalised by the cumulative optimal reward,
Σ_t r_t(a_t) / Σ_t r*_t, with r*_t the optimal action's *expected* reward (the data set's ``opt_rewards``).
The cumulative regret after t rounds is Σ_{s≤t} (r*_s − r_s(a_s)).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ngvi import VariationalOptimizer
from ngvi.baselines import mc_dropout_mlp

from ..core import models
from ..data.bandits import BanditDataset
from .agents import AGENTS, Agent, Setting, init_uniform_, set_data_size

DATA_SIZE_RULES = ("rounds_x_batch", "rounds")
CURVE_POINTS = 200


@dataclass(frozen=True)
class Protocol:
    initial_pulls: int = 3
    train_every: int = 20
    train_steps: int = 50
    batch_size: int = 512
    hidden: tuple[int, ...] = (100, 100)
    lr: float = 0.1
    lr_decay: float = 0.5
    init_scale: float = 0.3
    prior_prec: float = 1.0
    noise_prec: float = 1.0
    data_size: str = "rounds_x_batch"

    def __post_init__(self) -> None:
        if self.data_size not in DATA_SIZE_RULES:
            raise ValueError(f"data_size must be one of {DATA_SIZE_RULES}, got {self.data_size!r}")

    def n_seen(self, rounds: int) -> int:
        """N for a session after ``rounds`` observed rounds."""
        return rounds * self.batch_size if self.data_size == "rounds_x_batch" else rounds

    def config(self) -> dict[str, Any]:
        return asdict(self)


def normalised_reward(rewards: np.ndarray, actions: np.ndarray, opt_rewards: np.ndarray) -> float:
    """BADAM Table 1's score: Σ_t rewards[t, actions[t]] / Σ_t opt_rewards[t]."""
    rewards, actions, opt_rewards = np.asarray(rewards), np.asarray(actions), np.asarray(opt_rewards)
    if rewards.ndim != 2 or actions.shape != (rewards.shape[0],) or opt_rewards.shape != actions.shape:
        raise ValueError("rewards must be [T, K], actions and opt_rewards [T]")
    total_opt = float(opt_rewards.sum())
    if total_opt == 0.0:
        raise ValueError("the optimal cumulative reward is 0: the normalised reward is undefined")
    return float(rewards[np.arange(len(actions)), actions].sum()) / total_opt


def cumulative_regret(rewards: np.ndarray, actions: np.ndarray, opt_rewards: np.ndarray) -> np.ndarray:
    """Σ_{s≤t} (opt_rewards[s] − rewards[s, actions[s]]) for every t."""
    earned = np.asarray(rewards)[np.arange(len(actions)), np.asarray(actions)]
    return np.cumsum(np.asarray(opt_rewards) - earned)


def curve_rounds(num_rounds: int, points: int = CURVE_POINTS) -> np.ndarray:
    """The rounds (1-based counts) at which the regret curve is kept: about ``points``, the last included."""
    return np.unique(np.linspace(1, num_rounds, min(points, num_rounds)).round().astype(np.int64))


def build_agent(spec_name: str, data: BanditDataset, protocol: Protocol, seed: int) -> Agent:
    """The agent's network (seeded, U[−0.3, 0.3] weights) and trainer, with N of the first session."""
    spec = AGENTS[spec_name]
    rng = np.random.default_rng([seed, 1])
    method = spec.registered
    if method is None:
        return Agent(spec, None, None, data.num_actions, rng)
    torch.manual_seed(seed)
    if spec.dropout:  # Riquelme et al.'s dropout network: after every hidden layer, not on the inputs
        model = mc_dropout_mlp(
            data.context_dim, data.num_actions, list(protocol.hidden), p=spec.dropout, input_dropout=False
        )
    else:
        model = models.mlp(data.context_dim, list(protocol.hidden), data.num_actions)
    init_uniform_(model, protocol.init_scale)
    setting = Setting(protocol.n_seen(protocol.train_every), protocol.prior_prec, protocol.noise_prec)
    options = {
        "lr": initial_lr(spec_name, protocol),
        "prior_prec": protocol.prior_prec,
        **spec.options(setting),
    }
    trainer_class = method.trainer_class()
    if isinstance(trainer_class, type) and issubclass(trainer_class, VariationalOptimizer):
        # a step whose gradient or curvature is not finite is skipped and counted (reported per run), so
        # one agent's instability is a number in the table, not the end of the run; steps that are finite
        # are unchanged by this flag
        options["skip_nonfinite"] = True
    return Agent(spec, model, method.build(model, setting.data_size, **options), data.num_actions, rng)


def initial_lr(spec_name: str, protocol: Protocol) -> float:
    """lr₀ of the agent: the protocol's, unless the rule needs its own (see :mod:`.agents`)."""
    own = AGENTS[spec_name].lr
    return protocol.lr if own is None else own


def train_session(
    agent: Agent, x: Tensor, actions: Tensor, rewards: Tensor, rounds: int, protocol: Protocol
) -> None:
    """One session: ``train_steps`` minibatches from the first ``rounds`` rounds of the buffer, N set for
    ``rounds`` and lr_k = lr₀/(1 + decay·k)."""
    model, trainer = agent.model, agent.trainer
    if model is None:
        return
    set_data_size(trainer, protocol.n_seen(rounds), protocol.prior_prec)
    tau, lr0 = protocol.noise_prec, initial_lr(agent.spec.name, protocol)
    params = [p for g in trainer.param_groups for p in g["params"]]
    model.train()
    for k in range(protocol.train_steps):
        for group in trainer.param_groups:
            group["lr"] = lr0 / (1.0 + protocol.lr_decay * k)
        idx = torch.as_tensor(agent.rng.integers(0, rounds, size=protocol.batch_size))
        trainer.step(_closure(agent, params, x[idx], actions[idx], rewards[idx], tau))


def _closure(
    agent: Agent, params: list[Tensor], x: Tensor, actions: Tensor, rewards: Tensor, tau: float
) -> Callable[[], Tensor]:
    """The minibatch's Gaussian NLL of the pulled arms' rewards; the trainer runs the backward pass."""
    model, trainer, clip = agent.model, agent.trainer, agent.spec.clip_norm
    assert model is not None

    def closure() -> Tensor:
        trainer.zero_grad()
        output = model(x)
        predicted = output.gather(1, actions.unsqueeze(1)).squeeze(1)  # only the pulled arm's reward
        loss = 0.5 * tau * (predicted - rewards).square().mean()
        trainer.backward(loss, output)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        return loss

    return closure


@dataclass
class Played:
    """The actions of a run, the agent as it ended, and where the time went."""

    actions: np.ndarray
    agent: Agent
    sessions: int
    act_seconds: float
    train_seconds: float


def play(data: BanditDataset, agent_name: str, protocol: Protocol, seed: int) -> Played:
    """Play every context of ``data`` once, in order, with the agent (see the module docstring)."""
    agent = build_agent(agent_name, data, protocol, seed)
    x, all_rewards = data.to_torch()
    n_rounds, k = all_rewards.shape
    actions = np.zeros(n_rounds, dtype=np.int64)
    observed = torch.zeros(n_rounds)
    forced = min(protocol.initial_pulls * k, n_rounds)
    act_seconds = train_seconds = 0.0
    sessions = t = 0
    while t < n_rounds:
        end = min((t // protocol.train_every + 1) * protocol.train_every, n_rounds)
        start = time.perf_counter()
        stop = min(max(t, forced), end)  # rounds t … stop−1 are initial pulls: action = round mod K
        actions[t:stop] = np.arange(t, stop) % k
        if stop < end:
            actions[stop:end] = agent.act(x[stop:end])
        act_seconds += time.perf_counter() - start
        observed[t:end] = all_rewards[torch.arange(t, end), torch.as_tensor(actions[t:end])]
        t = end
        if agent.model is not None and t % protocol.train_every == 0:
            start = time.perf_counter()
            train_session(agent, x, torch.as_tensor(actions), observed, t, protocol)
            train_seconds += time.perf_counter() - start
            sessions += 1
    return Played(actions, agent, sessions, act_seconds, train_seconds)


def run_bandit(data: BanditDataset, agent_name: str, protocol: Protocol, seed: int) -> dict[str, Any]:
    """One run's result: the score, the regret curve (about 200 points), action counts and timings."""
    played = play(data, agent_name, protocol, seed)
    actions, n_rounds = played.actions, len(data)
    regret = cumulative_regret(data.rewards, actions, data.opt_rewards)
    at = curve_rounds(n_rounds)
    return {
        "normalised_reward": normalised_reward(data.rewards, actions, data.opt_rewards),
        # the same with each pulled arm's expected reward (pseudo-regret): without the reward noise
        "expected_normalised_reward": normalised_reward(data.expected_rewards, actions, data.opt_rewards),
        "cumulative_reward": float(data.rewards[np.arange(n_rounds), actions].sum()),
        "optimal_reward": float(data.opt_rewards.sum()),
        "optimal_action_rate": float((actions == data.opt_actions).mean()),
        "action_counts": np.bincount(actions, minlength=data.num_actions).tolist(),
        "curve_rounds": at.tolist(),
        "curve_regret": regret[at - 1].tolist(),
        "sessions": played.sessions,
        "skipped_steps": int(getattr(played.agent.trainer, "skipped_steps", 0)),
        "act_seconds": played.act_seconds,
        "train_seconds": played.train_seconds,
    }
