"""What every contextual bandit is (:class:`BanditDataset`) and the helpers its loaders share.

The loaders of the data-folder sets (:mod:`.bandits`) and of the user's own files (:mod:`.bandits_user`) both
build on this module, and :mod:`.bandits` dispatches to both, so the imports point one way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["BanditDataset", "classification_bandit", "one_hot", "standardize_contexts"]


@dataclass(frozen=True)
class BanditDataset:
    """Contexts ``[n, d]``, the reward of every action ``[n, k]``, and the optimal action's expected reward.

    ``labels`` is the class of each row (mushroom: 1 = edible, 0 = poisonous; classification bandits: the
    true class, equal to ``opt_actions``).
    """

    name: str
    contexts: np.ndarray
    rewards: np.ndarray
    opt_rewards: np.ndarray
    opt_actions: np.ndarray
    labels: np.ndarray
    action_names: tuple[str, ...]
    #: the expected reward of every action [n, k] where it is known (None: the rewards are deterministic)
    mean_rewards: np.ndarray | None = None

    @property
    def expected_rewards(self) -> np.ndarray:
        """``mean_rewards``, or ``rewards`` where the rewards are deterministic."""
        return self.rewards if self.mean_rewards is None else self.mean_rewards

    def __len__(self) -> int:
        return self.contexts.shape[0]

    @property
    def num_actions(self) -> int:
        return self.rewards.shape[1]

    @property
    def context_dim(self) -> int:
        return self.contexts.shape[1]

    def head(self, n: int) -> BanditDataset:
        """The first ``n`` rounds (contexts keep their standardisation over the whole set)."""
        if not 0 < n <= len(self):
            raise ValueError(f"n must be in [1, {len(self)}], got {n}")
        return dataclasses.replace(
            self,
            contexts=self.contexts[:n],
            rewards=self.rewards[:n],
            opt_rewards=self.opt_rewards[:n],
            opt_actions=self.opt_actions[:n],
            labels=self.labels[:n],
            mean_rewards=None if self.mean_rewards is None else self.mean_rewards[:n],
        )

    def to_torch(
        self, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(contexts, rewards)`` as tensors."""
        return (
            torch.as_tensor(self.contexts, dtype=dtype, device=device),
            torch.as_tensor(self.rewards, dtype=dtype, device=device),
        )


def one_hot(values: Sequence[str], categories: Sequence[str]) -> np.ndarray:
    """Indicator matrix ``[len(values), len(categories)]``; every value must be one of ``categories``."""
    index = {c: i for i, c in enumerate(categories)}
    out = np.zeros((len(values), len(categories)))
    out[np.arange(len(values)), [index[v] for v in values]] = 1.0
    return out


def standardize_contexts(contexts: np.ndarray) -> np.ndarray:
    """Columns centred and divided by their std (ddof=0); zero-std columns are only centred."""
    std = contexts.std(0)
    return (contexts - contexts.mean(0)) / np.where(std > 0, std, 1.0)


def classification_bandit(
    contexts: np.ndarray,
    labels: np.ndarray,
    num_actions: int | None = None,
    *,
    name: str = "classification",
    action_names: Sequence[str] | None = None,
) -> BanditDataset:
    """A classification bandit: standardised contexts, reward 1 for the true class and 0 for the others."""
    labels = np.asarray(labels, dtype=np.int64)
    k = int(labels.max()) + 1 if num_actions is None else num_actions
    if labels.min() < 0 or labels.max() >= k:
        raise ValueError(f"labels must lie in [0, {k})")
    rewards = np.zeros((len(labels), k))
    rewards[np.arange(len(labels)), labels] = 1.0
    names = tuple(action_names) if action_names is not None else tuple(str(a) for a in range(k))
    return BanditDataset(
        name=name,
        contexts=standardize_contexts(np.asarray(contexts, dtype=np.float64)),
        rewards=rewards,
        opt_rewards=np.ones(len(labels)),
        opt_actions=labels.copy(),
        labels=labels,
        action_names=names,
    )
