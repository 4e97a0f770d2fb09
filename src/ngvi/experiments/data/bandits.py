r"""Contextual-bandit problems built from UCI data, following Riquelme, Tucker & Snoek (2018),
"Deep Bayesian Bandits Showdown" (ICLR), and their ``deep_contextual_bandits`` data sampler.

A :class:`BanditDataset` holds one context per round and the reward every action *would* earn there
(``rewards[t, a]``), so an agent's regret can be computed offline. Reward conventions:

**Mushroom** (UCI Mushroom, 8124 rows, 2 actions: 0 = don't eat, 1 = eat). Not eating earns ``r_noeat = 0``.
Eating an edible mushroom earns ``r_eat_safe = +5``. Eating a poisonous one earns ``r_eat_poison_bad = -35``
with probability ``prob_poison_bad = 1/2`` and ``r_eat_poison_good = +5`` otherwise (one draw per round,
stored in ``rewards``). The optimal action is the one with the higher *expected* reward (eat iff edible with
the defaults; ties go to eating), and ``opt_rewards`` is that expected reward (5 or 0).
Contexts are the one-hot encoding of the 22 categorical attributes (117 columns, not standardised; a missing
stalk-root ``?`` is its own category). With ``num_contexts`` rows are drawn *with replacement*, as in the
reference sampler; without it every row appears once in a seeded random order.

**Statlog (Shuttle)** (``shuttle.trn``, 43,500 rows, 9 numeric features, 7 actions = the 7 classes) and
**Adult** (``adult.data`` + ``adult.test`` = 48,842 rows; rows with a missing value ``?`` dropped, leaving
45,222; 14 actions = the occupation, column 6). Both are *classification bandits*: the reward is 1 for the
action equal to the true class and 0 otherwise, so ``opt_rewards`` is all ones and ``opt_actions`` the class.
Contexts are standardised (mean 0, std 1 over the returned rows; constant columns are only centred). Adult's
contexts are the 6 numeric columns followed by one-hot encodings of the 8 other categorical columns (including
the income label, as in the reference code; test labels lose their trailing ``.``), 92 columns in all.

**Wheel** (:func:`wheel_bandit`, generated: 2 features, 5 actions; see its docstring). The bandits whose data
is not in the ngvi data folder (covertype, census, jester, financial) are read from a folder of your own by
:mod:`.bandits_user`; :func:`load_bandit` dispatches to all of them.

Differences from the reference code, both for stability across subsamples: adult's occupation codes and
one-hot columns use the categories of the full data set rather than of the sampled rows, so
``num_actions = 14`` and ``context_dim = 92`` for every ``num_contexts``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Literal

import numpy as np

from . import bandits_user
from ._files import PathLike, data_path
from .bandit_dataset import BanditDataset, classification_bandit, one_hot

#: Class fraction below which ``remove_underrepresented=True`` drops rows (as in the reference code).
UNDERREPRESENTED_FRACTION = 0.0005

SHUTTLE_CLASSES = ("Rad Flow", "Fpv Close", "Fpv Open", "High", "Bypass", "Bpv Close", "Bpv Open")
_SHUTTLE_ROWS = {"train": 43500, "test": 14500}
_ADULT_NUMERIC = (0, 2, 4, 10, 11, 12)
_ADULT_CATEGORICAL = (1, 3, 5, 7, 8, 9, 13, 14)
_ADULT_LABEL = 6


def _remove_underrepresented(x: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = np.bincount(labels)
    keep = counts[labels] / len(labels) >= UNDERREPRESENTED_FRACTION
    return x[keep], labels[keep]


def _take(n_total: int, num_contexts: int | None, shuffle: bool, rng: np.random.Generator) -> np.ndarray:
    order = rng.permutation(n_total) if shuffle else np.arange(n_total)
    if num_contexts is None:
        return order
    if not 0 < num_contexts <= n_total:
        raise ValueError(f"num_contexts must be in [1, {n_total}], got {num_contexts}")
    return order[:num_contexts]


def _read_csv_rows(rel: str, data_dir: PathLike | None) -> list[list[str]]:
    rows = []
    for line in data_path(rel, data_dir).read_text().splitlines():
        if line.strip() and not line.startswith("|"):
            rows.append([field.strip() for field in line.split(",")])
    return rows


def load_mushroom_bandit(
    num_contexts: int | None = None,
    *,
    seed: int = 0,
    data_dir: PathLike | None = None,
    r_noeat: float = 0.0,
    r_eat_safe: float = 5.0,
    r_eat_poison_bad: float = -35.0,
    r_eat_poison_good: float = 5.0,
    prob_poison_bad: float = 0.5,
) -> BanditDataset:
    """The mushroom bandit of Riquelme et al. (2018); see the module docstring for the rewards."""
    if not 0.0 <= prob_poison_bad <= 1.0:
        raise ValueError(f"prob_poison_bad must lie in [0, 1], got {prob_poison_bad}")
    rows = _read_csv_rows("bandits/mushroom/agaricus-lepiota.data", data_dir)
    if len(rows) != 8124 or {len(r) for r in rows} != {23}:
        raise ValueError("agaricus-lepiota.data should hold 8124 rows of 23 fields")
    columns = list(zip(*rows, strict=True))
    if set(columns[0]) != {"e", "p"}:
        raise ValueError("the first mushroom column should hold the class, 'e' or 'p'")
    features = np.hstack([one_hot(col, sorted(set(col))) for col in columns[1:]])
    edible_all = np.array([c == "e" for c in columns[0]])

    rng = np.random.default_rng(seed)
    n_total = len(rows)
    if num_contexts is None:
        idx = rng.permutation(n_total)
    elif num_contexts > 0:
        idx = rng.integers(0, n_total, size=num_contexts)
    else:
        raise ValueError(f"num_contexts must be positive, got {num_contexts}")
    edible = edible_all[idx]
    harmed = rng.random(len(idx)) < prob_poison_bad
    eat = np.where(edible, r_eat_safe, np.where(harmed, r_eat_poison_bad, r_eat_poison_good))
    rewards = np.stack([np.full(len(idx), float(r_noeat)), eat], axis=1)

    exp_poison = prob_poison_bad * r_eat_poison_bad + (1.0 - prob_poison_bad) * r_eat_poison_good
    exp_eat = np.where(edible, r_eat_safe, exp_poison)
    opt_actions = (exp_eat >= r_noeat).astype(np.int64)
    return BanditDataset(
        name="mushroom",
        contexts=features[idx],
        rewards=rewards,
        opt_rewards=np.maximum(exp_eat, r_noeat),
        opt_actions=opt_actions,
        labels=edible.astype(np.int64),
        action_names=("no eat", "eat"),
        mean_rewards=np.stack([np.full(len(idx), float(r_noeat)), exp_eat], axis=1),
    )


def load_shuttle(
    split: Literal["train", "test"] = "train", data_dir: PathLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Statlog (Shuttle) as a classification set: float64 features ``[n, 9]`` and classes 0-6 (file's 1-7)."""
    if split not in _SHUTTLE_ROWS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    ext = "trn" if split == "train" else "tst"
    path = data_path(f"bandits/statlog_shuttle/shuttle.{ext}", data_dir)
    data = np.loadtxt(path, dtype=np.float64, ndmin=2)
    if data.shape != (_SHUTTLE_ROWS[split], 10):
        raise ValueError(f"shuttle.{ext} should be {_SHUTTLE_ROWS[split]} x 10, got {data.shape}")
    labels = data[:, -1].astype(np.int64) - 1
    if labels.min() < 0 or labels.max() > 6:
        raise ValueError(f"shuttle.{ext}: classes should be 1-7")
    return data[:, :-1], labels


def load_shuttle_bandit(
    num_contexts: int | None = None,
    *,
    seed: int = 0,
    shuffle: bool = True,
    remove_underrepresented: bool = False,
    data_dir: PathLike | None = None,
) -> BanditDataset:
    """The Statlog (Shuttle) classification bandit (``shuttle.trn``), 7 actions; see the module docstring.

    Rows are shuffled (seeded) and the first ``num_contexts`` kept; ``remove_underrepresented`` then drops
    classes below 0.05% of the kept rows (classes 6 and 7 of the full file), but still offers 7 actions.
    """
    x, labels = load_shuttle("train", data_dir)
    idx = _take(len(labels), num_contexts, shuffle, np.random.default_rng(seed))
    x, labels = x[idx], labels[idx]
    if remove_underrepresented:
        x, labels = _remove_underrepresented(x, labels)
    return classification_bandit(x, labels, 7, name="statlog_shuttle", action_names=SHUTTLE_CLASSES)


def _adult_table(data_dir: PathLike | None) -> list[list[str]]:
    rows = []
    for rel, n_expected in (("bandits/adult/adult.data", 32561), ("bandits/adult/adult.test", 16281)):
        part = _read_csv_rows(rel, data_dir)
        if len(part) != n_expected or {len(r) for r in part} != {15}:
            raise ValueError(f"{rel} should hold {n_expected} rows of 15 fields")
        rows.extend(part)
    for r in rows:
        r[14] = r[14].rstrip(".")
    return [r for r in rows if "?" not in r]


def _adult_encoded(data_dir: PathLike | None) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Unstandardised adult contexts, occupation codes and names; cached while the files are unchanged."""
    paths = [data_path(f"bandits/adult/{f}", data_dir) for f in ("adult.data", "adult.test")]
    stamp = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)
    return _adult_encoded_cached(stamp, data_dir)


@functools.lru_cache(maxsize=2)
def _adult_encoded_cached(
    _stamp: tuple[tuple[str, int, int], ...], data_dir: PathLike | None
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    columns = list(zip(*_adult_table(data_dir), strict=True))
    occupations = tuple(sorted(set(columns[_ADULT_LABEL])))
    code = {o: i for i, o in enumerate(occupations)}
    labels = np.array([code[o] for o in columns[_ADULT_LABEL]], dtype=np.int64)
    numeric = np.array([columns[c] for c in _ADULT_NUMERIC], dtype=np.float64).T
    encoded = [one_hot(columns[c], sorted(set(columns[c]))) for c in _ADULT_CATEGORICAL]
    x = np.hstack([numeric, *encoded])
    x.setflags(write=False)
    labels.setflags(write=False)
    return x, labels, occupations


def load_adult_bandit(
    num_contexts: int | None = None,
    *,
    seed: int = 0,
    shuffle: bool = True,
    remove_underrepresented: bool = False,
    data_dir: PathLike | None = None,
) -> BanditDataset:
    """The Adult classification bandit: 14 actions = occupation; see the module docstring."""
    x, labels, occupations = _adult_encoded(data_dir)
    idx = _take(len(labels), num_contexts, shuffle, np.random.default_rng(seed))
    x, labels = x[idx], labels[idx]
    if remove_underrepresented:
        x, labels = _remove_underrepresented(x, labels)
    return classification_bandit(x, labels, len(occupations), name="adult", action_names=occupations)


#: Riquelme et al.'s wheel: mean reward of each action inside the radius δ (action 4 is best there), the
#: reward of the quadrant's action outside it, and the noise of both (their ``sample_wheel_bandit_data``).
WHEEL_MEAN_V = (1.0, 1.0, 1.0, 1.0, 1.2)
WHEEL_STD_V = (0.01, 0.01, 0.01, 0.01, 0.01)
WHEEL_MU_LARGE = 50.0
WHEEL_STD_LARGE = 0.01


def wheel_quadrant_action(contexts: np.ndarray) -> np.ndarray:
    """The action that pays ``mu_large`` outside the radius: 0 for (x>0, y>0), 1 for (x>0, y≤0), 2 for
    (x≤0, y>0), 3 for (x≤0, y≤0), as in Riquelme et al.'s sampler."""
    x, y = contexts[:, 0], contexts[:, 1]
    return np.where(x > 0, np.where(y > 0, 0, 1), np.where(y > 0, 2, 3)).astype(np.int64)


def wheel_bandit(
    num_contexts: int,
    delta: float,
    *,
    seed: int = 0,
    mean_v: Sequence[float] = WHEEL_MEAN_V,
    std_v: Sequence[float] = WHEEL_STD_V,
    mu_large: float = WHEEL_MU_LARGE,
    std_large: float = WHEEL_STD_LARGE,
) -> BanditDataset:
    r"""The wheel bandit of Riquelme et al. (2018, §4 and their ``sample_wheel_bandit_data``), generated.

    Contexts X are uniform on the unit disc (rejection sampling from the square), 2 features, 5 actions.
    Every action a pays N(mean_v[a], std_v[a]²); where ‖X‖ ≥ δ the action of X's quadrant
    (:func:`wheel_quadrant_action`) pays N(mu_large, std_large²) instead. With the defaults action 4 (1.2) is
    optimal inside the radius and the quadrant's action (50) outside, so the optimal expected reward is

    .. math::  \mathbb E[r^*] = 50\,(1-\delta^2) + 1.2\,\delta^2,

    since P(‖X‖ ≥ δ) = 1 − δ² for X uniform on the disc. ``opt_rewards`` holds the optimal *expected* reward
    of each round (the reference code stores the sampled one), as for mushroom. ``labels`` is 1 outside the
    radius and 0 inside.
    """
    if not isinstance(num_contexts, int) or num_contexts < 1:
        raise ValueError(f"num_contexts must be a positive int, got {num_contexts!r}")
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must lie in [0, 1] (the radius inside the unit disc), got {delta}")
    mean_v, std_v = np.asarray(mean_v, dtype=np.float64), np.asarray(std_v, dtype=np.float64)
    if mean_v.shape != (5,) or std_v.shape != (5,) or (std_v < 0).any() or std_large < 0:
        raise ValueError("mean_v and std_v need 5 entries each (one per action) and the stds must be >= 0")
    rng = np.random.default_rng(seed)
    points: list[np.ndarray] = []
    kept = 0
    while kept < num_contexts:
        square = rng.uniform(-1.0, 1.0, size=(max(2 * num_contexts, 64), 2))
        disc = square[np.linalg.norm(square, axis=1) <= 1.0]
        points.append(disc)
        kept += len(disc)
    contexts = np.concatenate(points)[:num_contexts]

    outside = np.linalg.norm(contexts, axis=1) >= delta
    quadrant = wheel_quadrant_action(contexts)
    rows = np.flatnonzero(outside)
    means = np.broadcast_to(mean_v, (num_contexts, 5)).copy()
    means[rows, quadrant[rows]] = mu_large
    stds = np.broadcast_to(std_v, (num_contexts, 5)).copy()
    stds[rows, quadrant[rows]] = std_large
    rewards = means + stds * rng.standard_normal((num_contexts, 5))
    opt_actions = means.argmax(1)
    return BanditDataset(
        name=f"wheel_{delta:g}",
        contexts=contexts,
        rewards=rewards,
        opt_rewards=means[np.arange(num_contexts), opt_actions],
        opt_actions=opt_actions,
        labels=outside.astype(np.int64),
        action_names=("quadrant ++", "quadrant +-", "quadrant -+", "quadrant --", "centre"),
        mean_rewards=means,
    )


BANDIT_LOADERS = {
    "mushroom": load_mushroom_bandit,
    "statlog": load_shuttle_bandit,
    "shuttle": load_shuttle_bandit,
    "statlog_shuttle": load_shuttle_bandit,
    "adult": load_adult_bandit,
}


def load_bandit(name: str, num_contexts: int | None = None, **kwargs: object) -> BanditDataset:
    """Dispatch by name: ``"mushroom"``, ``"statlog"`` (or ``"shuttle"``), ``"adult"`` from the ngvi data
    folder; ``"wheel"`` (generated: pass ``delta=``); and ``"covertype"``, ``"census"``, ``"jester"``,
    ``"financial"``, which are not in the data folder and are read from a folder of your own (``user_dir=``,
    see :mod:`.bandits_user`)."""
    key = name.strip().lower()
    if key == "wheel":
        if num_contexts is None:
            raise ValueError("the wheel bandit is generated: pass num_contexts (and delta=)")
        return wheel_bandit(num_contexts, **kwargs)  # type: ignore[arg-type]
    if key in bandits_user.USER_BANDITS:
        return bandits_user.load_user_bandit(key, num_contexts, **kwargs)  # type: ignore[arg-type]
    if key not in BANDIT_LOADERS:
        known = ", ".join(["mushroom", "statlog", "adult", "wheel", *bandits_user.USER_BANDITS])
        raise ValueError(f"unknown bandit data set {name!r}; known: {known}")
    return BANDIT_LOADERS[key](num_contexts, **kwargs)  # type: ignore[arg-type]
