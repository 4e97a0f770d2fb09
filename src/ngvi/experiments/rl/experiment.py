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
from ..core.report import figure, fmt_mean_se, markdown_table, mean_se, save_figure
from ..core.results import ResultsFolder
from ..core.runner import Experiment, Job, Run
from .variants import VARIANTS

COLORS = {
    "vadagrad": "tab:green", "vadam": "tab:blue", "sgd_plain": "tab:gray", "adam_plain": "tab:orange",
    "sgd_explore": "tab:olive", "adam_explore": "tab:red", "adam_action": "tab:purple",
}  # fmt: skip
ADAM_FAMILY = ("vadam", "adam_plain", "adam_explore")  # Fig. 5
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
        types.add_subset(parser, "--variants", VARIANTS)
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
        (run.out / "table.md").write_text(_table(done, config))
        plot(done, run.out / "rl.png", config)
        print((run.out / "table.md").read_text())
        print(f"wrote {run.out / 'rl.png'}, {run.out / 'table.md'} and {run.out / 'results.json'}")


def _table(done: dict[str, list[dict[str, Any]]], config: dict[str, Any]) -> str:
    seeds = len(next(iter(done.values())))
    rows = []
    for name, results in done.items():
        final = mean_se(r["test_return"][-1] for r in results)
        area = mean_se(np.mean(r["test_return"][1:]) for r in results)
        best = mean_se(max(r["test_return"][1:]) for r in results)
        std = [r["median_search_std"][-1] for r in results]
        seconds = np.mean([r["seconds"] for r in results])
        rows.append([
            VARIANTS[name].label, fmt_mean_se(*final[:2]), fmt_mean_se(*area[:2]), fmt_mean_se(*best[:2]),
            "—" if std[0] is None else f"{np.mean(std):.2g}", f"{seconds:.0f}",
        ])  # fmt: skip
    head = (
        f"# ngvi rl: DDPG on {config['env']}, {config['steps']:,} steps, actor sampled at every step "
        "(Khan et al. 2018, App. K)\n\n"
        f"Test return: mean over {config['test_episodes']} episode(s) acting with μ, every "
        f"{config['eval_every']:,} steps; mean ± s.e. over {seeds} seed(s). The paper gives its curves "
        "(Figs. 5–6) only as plots.\n\n"
    )
    header = [
        "variant",
        "final test return",
        "mean over the tests",
        "best test",
        "median σ at the end",
        "train time [s]",
    ]
    return head + markdown_table(header, rows)


def plot(done: dict[str, list[dict[str, Any]]], path, config: dict[str, Any]) -> None:
    """Test return against steps, mean ± s.e. over seeds: the Adam family (Fig. 5) and all six (Fig. 6)."""
    adam = [v for v in ADAM_FAMILY if v in done]
    panels = [("Vadam, Adam-Plain, Adam-Explore (cf. Fig. 5)", adam)] if adam else []
    if set(done) - set(ADAM_FAMILY):
        title = "all six variants (cf. Fig. 6)" if len(done) == len(VARIANTS) else "variants run (cf. Fig. 6)"
        panels.append((title, list(done)))
    fig, axes = figure(len(panels), cols=2, size=(5.2, 3.6))
    for ax, (title, names) in zip(axes, panels, strict=True):
        for name in names:
            results = done[name]
            steps = np.array(results[0]["step"])
            returns = np.array([r["test_return"] for r in results])
            mean = returns.mean(0)
            ax.plot(steps, mean, color=COLORS[name], lw=1.6, label=VARIANTS[name].label)
            if len(results) > 1:
                se = returns.std(0, ddof=1) / np.sqrt(len(results))
                ax.fill_between(steps, mean - se, mean + se, color=COLORS[name], alpha=0.2, lw=0)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("environment steps", fontsize=8)
        ax.set_ylabel(f"test return ({config['test_episodes']} ep., μ)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
        ax.legend(fontsize=7, loc="best")
    seeds = len(next(iter(done.values())))
    spread = f"mean ± s.e. over {seeds} seeds" if seeds > 1 else "one seed"
    fig.suptitle(f"DDPG on {config['env']}: {spread}", fontsize=10)
    save_figure(fig, path, dpi=120)


EXPERIMENT = RL()
