r"""The bandits of Riquelme et al. (2018) whose data is not in the ngvi data folder: covertype, census,
jester and financial.

These files are not shipped with the benchmark data and nothing is downloaded at run time, so each loader
reads its file from a folder of your own (``user_dir=``, ``--user-data-dir`` on the command line) and says
where to get it when the folder or the file is missing. They are not checksum-verified (we hold no copy to
take a checksum from). The preprocessing follows the reference sampler (``deep_contextual_bandits``
``data_sampler.py``) with the differences stated per loader.

- **covertype** (UCI Covertype, ``covtype.data``: 581,012 rows of 54 features and the cover type 1-7):
  a classification bandit with 7 actions, contexts standardised. (The reference reads the file with
  ``header=0`` and so drops its first row; we keep it.)
- **census** (UCI US Census 1990, ``USCensus1990.data.txt``: a header, then 2,458,285 rows of 69 discretised
  columns): 9 actions = ``dOccup``, ``caseid`` dropped, every other column one-hot encoded with the categories
  of the sampled rows (as the reference does), then standardised.
- **jester** (the dense subset of Jester used by the reference, ``jester_data_40jokes_19181users.npy``:
  19,181 users × 40 joke ratings): the first 32 ratings are the context and the last 8 the rewards of the 8
  actions; the optimal action is the best-rated of the 8 (deterministic). Contexts are not standardised.
- **financial** (``raw_stock_contexts``: a header line, then 21 stock prices per row): a linear bandit with
  8 actions. β ~ U(−1, 1)^{21×8} with unit-norm columns, mean rewards Xβ, rewards Xβ + N(0, σ²), σ = 0.01;
  the optimal action maximises the mean reward.

Rows are shuffled (seeded) and the first ``num_contexts`` kept, as in the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._files import DataNotFoundError, PathLike
from .bandit_dataset import BanditDataset, classification_bandit, one_hot


@dataclass(frozen=True)
class UserBandit:
    """A bandit read from the user's folder: its file, where to get it, and its reader."""

    file: str
    source: str
    reader: Callable[[Path, int | None, np.random.Generator], BanditDataset]


def _user_file(name: str, user_dir: PathLike | None) -> Path:
    spec = USER_BANDITS[name]
    get = f"download {spec.file} ({spec.source})"
    if user_dir is None or str(user_dir) == "":
        raise DataNotFoundError(
            f"the {name} bandit is not available offline (it is not in the ngvi data folder): {get} and "
            "pass the folder that holds it as --user-data-dir (user_dir= in Python)"
        )
    path = Path(user_dir).expanduser() / spec.file
    if not path.is_file():
        raise DataNotFoundError(
            f"{spec.file} (the {name} bandit) was not found in {user_dir}: {get}", str(path)
        )
    return path


def _sample_lines(path: Path, num_contexts: int | None, rng: np.random.Generator, header: bool) -> list[str]:
    """``num_contexts`` rows of a text file in a seeded random order (all rows if None): the reference's
    shuffle-then-take, read in one pass without parsing the rows that are not kept."""
    with path.open() as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    if header:
        lines = lines[1:]
    order = rng.permutation(len(lines))
    if num_contexts is not None:
        if not 0 < num_contexts <= len(lines):
            raise ValueError(f"num_contexts must be in [1, {len(lines)}] for {path.name}, got {num_contexts}")
        order = order[:num_contexts]
    return [lines[i] for i in order]


def _covertype(path: Path, num_contexts: int | None, rng: np.random.Generator) -> BanditDataset:
    rows = _sample_lines(path, num_contexts, rng, header=False)
    data = np.array([r.split(",") for r in rows], dtype=np.float64)
    if data.shape[1] != 55:
        raise ValueError(f"{path.name} should have 55 comma-separated columns, got {data.shape[1]}")
    labels = data[:, -1].astype(np.int64) - 1
    if labels.min() < 0 or labels.max() > 6:
        raise ValueError(f"{path.name}: cover types should be 1-7")
    return classification_bandit(data[:, :-1], labels, 7, name="covertype")


def _census(path: Path, num_contexts: int | None, rng: np.random.Generator) -> BanditDataset:
    with path.open() as f:
        header = f.readline().strip().split(",")
    if "dOccup" not in header or "caseid" not in header:
        raise ValueError(f"{path.name} should start with a header naming the columns dOccup and caseid")
    rows = [r.split(",") for r in _sample_lines(path, num_contexts, rng, header=True)]
    columns = list(zip(*rows, strict=True))
    occupation = columns[header.index("dOccup")]
    codes = {c: i for i, c in enumerate(sorted(set(occupation), key=float))}
    if len(codes) > 9:
        raise ValueError(f"{path.name}: dOccup should take at most 9 values, got {len(codes)}")
    labels = np.array([codes[c] for c in occupation], dtype=np.int64)
    keep = [i for i, h in enumerate(header) if h not in ("dOccup", "caseid")]
    x = np.hstack([one_hot(columns[i], sorted(set(columns[i]), key=float)) for i in keep])
    return classification_bandit(x, labels, 9, name="census")


def _jester(path: Path, num_contexts: int | None, rng: np.random.Generator) -> BanditDataset:
    ratings = np.load(path)
    if ratings.ndim != 2 or ratings.shape[1] != 40:
        raise ValueError(f"{path.name} should hold a [users, 40] array of ratings, got {ratings.shape}")
    order = rng.permutation(len(ratings))
    if num_contexts is not None:
        if not 0 < num_contexts <= len(ratings):
            raise ValueError(f"num_contexts must be in [1, {len(ratings)}] for jester, got {num_contexts}")
        order = order[:num_contexts]
    ratings = np.asarray(ratings[order], dtype=np.float64)
    rewards = ratings[:, 32:]
    opt_actions = rewards.argmax(1)
    return BanditDataset(
        name="jester",
        contexts=ratings[:, :32],
        rewards=rewards,
        opt_rewards=rewards.max(1),
        opt_actions=opt_actions,
        labels=opt_actions.copy(),
        action_names=tuple(f"joke {j}" for j in range(32, 40)),
    )


FINANCIAL_NOISE = 0.01


def _financial(path: Path, num_contexts: int | None, rng: np.random.Generator) -> BanditDataset:
    rows = _sample_lines(path, num_contexts, rng, header=True)
    contexts = np.array([r.split() for r in rows], dtype=np.float64)
    if contexts.shape[1] != 21:
        raise ValueError(f"{path.name} should have 21 whitespace-separated columns, got {contexts.shape[1]}")
    betas = rng.uniform(-1.0, 1.0, size=(21, 8))
    betas /= np.linalg.norm(betas, axis=0)
    means = contexts @ betas
    rewards = means + FINANCIAL_NOISE * rng.standard_normal(means.shape)
    opt_actions = means.argmax(1)
    return BanditDataset(
        name="financial",
        contexts=contexts,
        rewards=rewards,
        opt_rewards=means.max(1),
        opt_actions=opt_actions,
        labels=opt_actions.copy(),
        action_names=tuple(f"portfolio {a}" for a in range(8)),
        mean_rewards=means,
    )


USER_BANDITS: dict[str, UserBandit] = {
    "covertype": UserBandit(
        "covtype.data", "UCI Covertype, https://archive.ics.uci.edu/dataset/31/covertype", _covertype
    ),
    "census": UserBandit(
        "USCensus1990.data.txt",
        "UCI US Census Data (1990), https://archive.ics.uci.edu/dataset/116/us+census+data+1990",
        _census,
    ),
    "jester": UserBandit(
        "jester_data_40jokes_19181users.npy",
        "the dense Jester subset of Riquelme et al.'s deep_contextual_bandits, built from "
        "https://goldberg.berkeley.edu/jester-data/",
        _jester,
    ),
    "financial": UserBandit(
        "raw_stock_contexts",
        "the stock-price contexts of Riquelme et al.'s deep_contextual_bandits (21 stocks)",
        _financial,
    ),
}


def load_user_bandit(
    name: str, num_contexts: int | None = None, *, seed: int = 0, user_dir: PathLike | None = None
) -> BanditDataset:
    """The bandit ``name`` (covertype, census, jester, financial) from the file in ``user_dir``.

    Raises:
        DataNotFoundError: no ``user_dir``, or the file is not in it (the message says where to get it).
        ValueError: the file does not have the expected shape, or ``num_contexts`` is out of range.
    """
    key = name.strip().lower()
    if key not in USER_BANDITS:
        raise ValueError(f"unknown bandit {name!r}; read from a user folder: {', '.join(USER_BANDITS)}")
    path = _user_file(key, user_dir)
    return USER_BANDITS[key].reader(path, num_contexts, np.random.default_rng(seed))
