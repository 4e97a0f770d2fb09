"""``ngvi rl``: parameter-space exploration in DDPG (Khan et al. 2018, §6.3 and App. K, Figs. 5–6).

Each job trains one variant (:mod:`.variants`) with one seed for ``--steps`` environment steps and, every
``--eval-every`` steps, measures the mean return of ``--test-episodes`` episodes acting with μ (App. K: 20
test episodes without exploration). The defaults are the paper's run (HalfCheetah, 3 million steps); the
committed results are a reduced run (docs/results/rl/README.md). ``--quick`` is the CI smoke run on
Pendulum-v1. Seeds can run as separate commands (``--seeds 1 --first-seed k``, one ``--out`` each) and be
joined with ``--merge-from``. Writes ``results.json``, ``table.md`` and ``rl.png``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

import numpy as np

from ..core import args as types
from ..core.results import ResultsFolder
from ..core.runner import Experiment, Job, Run
from .report import plot, table
from .variants import TABLE3, VARIANTS

DEFAULTS = {"env": "HalfCheetah-v5", "steps": 3_000_000, "eval_every": 10_000, "test_episodes": 20}  # App. K
QUICK = {"env": "Pendulum-v1", "steps": 300, "eval_every": 150, "test_episodes": 1}


def _mujoco_warnings_to_python() -> None:
    """MuJoCo's own warning handler appends to MUJOCO_LOG.TXT in the current folder (HalfCheetah's model
    uses an attribute MuJoCo 4 deprecates); hand its warnings to Python's ``warnings`` instead."""
    try:
        import mujoco
    except ImportError:  # a classic-control task needs no MuJoCo
        return
    mujoco.set_mju_user_warning(lambda message: warnings.warn(f"MuJoCo: {message.strip()}", stacklevel=2))


class RL(Experiment):
    name = "rl"
    requires = ("tqdm", "matplotlib", "gymnasium", "stable_baselines3")
    help = "DDPG with the actor sampled from q at every step (Khan et al. 2018, App. K): test return vs steps"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        types.add_subset(
            parser,
            "--variants",
            VARIANTS,
            f"comma-separated subset of: {', '.join(VARIANTS)} (default: Table 3's six, all but adam_action)",
            default=list(TABLE3),
        )
        parser.add_argument(
            "--env",
            default=None,
            help="a gymnasium task with continuous actions (default HalfCheetah-v5; --quick: Pendulum-v1)",
        )
        types.add_count(parser, "--steps", None, "environment steps (default 3M, App. K; --quick: 300)")
        types.add_count(parser, "--eval-every", None, "steps between tests (default 10k; --quick: 150)")
        types.add_count(parser, "--test-episodes", None, "episodes per test (default 20; --quick: 1)")
        types.add_count(parser, "--seeds", 3, "seeds per variant (default 3)")
        parser.add_argument("--first-seed", type=types.non_negative_int, default=0)
        parser.add_argument(
            "--baseline",
            choices=sorted(VARIANTS),
            default=None,
            help="report every variant's area under the test curve minus this variant's, paired by seed",
        )
        types.add_quick(
            parser,
            "CI smoke run: Pendulum-v1, 300 steps, 2 tests of 1 episode (options given explicitly win)",
        )
        types.add_merge_from(
            parser,
            "comma-separated results folders of the same protocol (e.g. one seed each) copied in first",
        )

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        config = types.with_quick(args, DEFAULTS, QUICK)  # an explicit option wins over --quick
        if config["eval_every"] > config["steps"]:
            raise ValueError(
                f"--eval-every ({config['eval_every']}) is more than --steps ({config['steps']})"
            )
        if args.baseline is not None and args.baseline not in args.variants:
            raise ValueError(
                f"--baseline {args.baseline} is not among --variants ({','.join(args.variants)}): add it"
            )
        return config

    def _seeds(self, args: argparse.Namespace) -> list[int]:
        return list(range(args.first_seed, args.first_seed + args.seeds))

    def prepare(self, args: argparse.Namespace, run: Run) -> None:
        import gymnasium as gym

        env_id = self.config(args)["env"]
        try:
            env = gym.make(env_id)
        except gym.error.Error as err:
            raise ValueError(f"--env {env_id}: {err}") from None
        if not isinstance(env.action_space, gym.spaces.Box):
            raise ValueError(
                f"--env {env_id} has {type(env.action_space).__name__} actions; DDPG needs a Box"
            )
        env.close()
        for path in args.merge_from:
            other = ResultsFolder(path, writable=False).load_results()
            if other.get("config") != run.results["config"]:
                raise ValueError(
                    f"{path} was run with {other.get('config')}, {run.out.path} with "
                    f"{run.results['config']}; merge only results of the same protocol"
                )
            for key, value in other["runs"].items():
                run.results["runs"].setdefault(key, value)
        run.save()

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        config = self.config(args)
        return [
            Job(f"{v}/seed{s}", {"variant": v, "seed": s, **config})
            for v in args.variants
            for s in self._seeds(args)
        ]

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        import gymnasium as gym
        import torch

        from .ddpg import DDPG, DDPGConfig, evaluate, make_buffer, train_step
        from .variants import search_std

        _mujoco_warnings_to_python()
        seed, steps = spec["seed"], spec["steps"]
        np.random.seed(seed)  # stable-baselines3's buffer samples with numpy's global generator
        env, test_env = gym.make(spec["env"]), gym.make(spec["env"])
        env.action_space.seed(seed)
        config = DDPGConfig(buffer_size=min(DDPGConfig.buffer_size, steps))  # never full: the same FIFO
        high = float(env.action_space.high.max())
        dims = env.observation_space.shape[0], env.action_space.shape[0]
        agent = DDPG(*dims, high, VARIANTS[spec["variant"]].build, seed, config)
        buffer = make_buffer(env, config.buffer_size)
        test_seed = 10_000 + 1000 * seed
        curve = {"step": [0], "test_return": [evaluate(agent, test_env, spec["test_episodes"], test_seed)]}
        spread: list[float | None] = []
        episode_returns, episode_return = [], 0.0
        obs, _ = env.reset(seed=seed)
        start = time.perf_counter()
        for t in range(1, steps + 1):
            obs, reward, done = train_step(agent, env, buffer, obs)
            episode_return += reward
            if done:
                episode_returns.append(episode_return)
                episode_return = 0.0
                obs, _ = env.reset()
            if t % spec["eval_every"] == 0 or t == steps:
                curve["step"].append(t)
                curve["test_return"].append(evaluate(agent, test_env, spec["test_episodes"], test_seed))
                std = search_std(agent.policy)
                spread.append(
                    None if std is None else float(torch.cat([s.reshape(-1) for s in std]).median())
                )
        return {
            **curve,
            "median_search_std": spread,
            "train_episode_returns": episode_returns,
            "seconds": time.perf_counter() - start,
        }

    def report(self, args: argparse.Namespace, run: Run) -> None:
        config = self.config(args)
        done = {v: [run.results["runs"][f"{v}/seed{s}"] for s in self._seeds(args)] for v in args.variants}
        (run.out / "table.md").write_text(table(done, config, args.baseline))
        plot(done, run.out / "rl.png", config)
        print((run.out / "table.md").read_text())
        print(f"wrote {run.out / 'rl.png'}, {run.out / 'table.md'} and {run.out / 'results.json'}")


EXPERIMENT = RL()
