"""Contextual-bandit data sets: reward matrices follow the documented Riquelme et al. (2018) rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ngvi.experiments.data as nd
from conftest import data_dir

DATA = data_dir()
SHUTTLE_COUNTS = [34108, 37, 132, 6748, 2458, 6, 11]  # classes 1-7 of shuttle.trn, from MANIFEST.md


def test_mushroom_full_rewards():
    ds = nd.load_mushroom_bandit(data_dir=DATA, seed=0)
    assert len(ds) == 8124 and ds.num_actions == 2 and ds.context_dim == 117
    assert ds.action_names == ("no eat", "eat")
    assert (int(ds.labels.sum()), int((ds.labels == 0).sum())) == (4208, 3916)  # edible / poisonous
    # contexts: one-hot of 22 attributes, not standardised
    assert set(np.unique(ds.contexts)) == {0.0, 1.0}
    np.testing.assert_array_equal(ds.contexts.sum(1), 22)
    edible = ds.labels == 1
    np.testing.assert_array_equal(ds.rewards[:, 0], 0.0)  # not eating: 0
    np.testing.assert_array_equal(ds.rewards[edible, 1], 5.0)  # eating an edible mushroom: +5
    poison = ds.rewards[~edible, 1]
    assert set(np.unique(poison)) == {-35.0, 5.0}  # eating a poisonous one: -35 or +5 ...
    n_bad = int((poison == -35).sum())
    assert abs(n_bad - 3916 / 2) < 4 * np.sqrt(3916 / 4)  # ... each with probability 1/2
    # expected-value oracle: eat iff edible; its expected reward is 5 or 0
    np.testing.assert_array_equal(ds.opt_actions, ds.labels)
    np.testing.assert_array_equal(ds.opt_rewards, np.where(edible, 5.0, 0.0))
    # without num_contexts every row appears once, in a seeded order
    ref = nd.load_mushroom_bandit(data_dir=DATA, seed=1)
    assert not np.array_equal(ds.contexts, ref.contexts)
    assert sorted(map(tuple, ds.contexts)) == sorted(map(tuple, ref.contexts))


def test_mushroom_sampling_is_seeded_with_replacement():
    a = nd.load_mushroom_bandit(3000, data_dir=DATA, seed=5)
    b = nd.load_mushroom_bandit(3000, data_dir=DATA, seed=5)
    c = nd.load_mushroom_bandit(3000, data_dir=DATA, seed=6)
    assert a.contexts.shape == (3000, 117) and a.rewards.shape == (3000, 2)
    np.testing.assert_array_equal(a.contexts, b.contexts)
    np.testing.assert_array_equal(a.rewards, b.rewards)
    assert not np.array_equal(a.rewards, c.rewards)
    big = nd.load_mushroom_bandit(20000, data_dir=DATA, seed=0)
    assert len(np.unique(big.contexts, axis=0)) < 8124 < 20000  # with replacement: repeats


def test_mushroom_custom_rewards():
    always_bad = nd.load_mushroom_bandit(data_dir=DATA, prob_poison_bad=1.0)
    np.testing.assert_array_equal(always_bad.rewards[always_bad.labels == 0, 1], -35.0)
    # if not eating costs more than the expected poison (-15), the oracle always eats
    hungry = nd.load_mushroom_bandit(data_dir=DATA, r_noeat=-50.0)
    np.testing.assert_array_equal(hungry.opt_actions, 1)
    np.testing.assert_array_equal(hungry.opt_rewards, np.where(hungry.labels == 1, 5.0, -15.0))
    np.testing.assert_array_equal(hungry.rewards[:, 0], -50.0)


def _check_classification_bandit(ds: nd.BanditDataset, k: int) -> None:
    n = len(ds)
    assert ds.rewards.shape == (n, k) and ds.num_actions == k
    np.testing.assert_array_equal(ds.rewards.sum(1), 1.0)  # reward 1 for the true class, 0 otherwise
    np.testing.assert_array_equal(ds.rewards[np.arange(n), ds.labels], 1.0)
    np.testing.assert_array_equal(ds.opt_actions, ds.labels)
    np.testing.assert_array_equal(ds.opt_rewards, 1.0)
    np.testing.assert_allclose(ds.contexts.mean(0), 0.0, atol=1e-9)
    std = ds.contexts.std(0)
    assert np.all((np.abs(std - 1) < 1e-9) | (std == 0))


def test_shuttle_bandit():
    ds = nd.load_shuttle_bandit(data_dir=DATA, seed=0)
    assert ds.contexts.shape == (43500, 9) and ds.name == "statlog_shuttle"
    _check_classification_bandit(ds, 7)
    assert np.bincount(ds.labels, minlength=7).tolist() == SHUTTLE_COUNTS
    assert ds.action_names[0] == "Rad Flow"
    x, labels = nd.load_shuttle("test", DATA)
    assert x.shape == (14500, 9) and labels.min() >= 0 and labels.max() <= 6


def test_shuttle_subsample_and_rare_classes():
    ordered = nd.load_shuttle_bandit(data_dir=DATA, shuffle=False)
    _, labels = nd.load_shuttle("train", DATA)
    np.testing.assert_array_equal(ordered.labels, labels)
    small = nd.load_shuttle_bandit(1000, data_dir=DATA, seed=2)
    assert len(small) == 1000
    _check_classification_bandit(small, 7)
    pruned = nd.load_shuttle_bandit(data_dir=DATA, remove_underrepresented=True)
    assert len(pruned) == 43500 - 6 - 11 and pruned.num_actions == 7  # classes 6 and 7 (< 0.05%) dropped
    assert set(np.unique(pruned.labels)) == {0, 1, 2, 3, 4}
    with pytest.raises(ValueError, match="num_contexts"):
        nd.load_shuttle_bandit(50000, data_dir=DATA)


def test_adult_bandit():
    ds = nd.load_adult_bandit(data_dir=DATA, seed=0)
    # rows with any missing value dropped, counted independently here
    n_complete = 0
    for fname in ("adult.data", "adult.test"):
        for line in (DATA / "bandits" / "adult" / fname).read_text().splitlines():
            if line.strip() and not line.startswith("|") and "?" not in line:
                n_complete += 1
    assert len(ds) == n_complete == 45222
    assert ds.context_dim == 92 and ds.num_actions == 14
    _check_classification_bandit(ds, 14)
    assert ds.action_names[0] == "Adm-clerical" and "Armed-Forces" in ds.action_names
    assert np.bincount(ds.labels, minlength=14).min() > 0
    # the income column is one 2-valued block (test labels' trailing '.' removed): last two columns
    assert len(np.unique(ds.contexts[:, -2:], axis=0)) == 2
    small = nd.load_adult_bandit(2000, data_dir=DATA, seed=1)
    assert small.contexts.shape == (2000, 92) and small.num_actions == 14


def test_dispatch_and_torch():
    ds = nd.load_bandit("statlog", 100, data_dir=DATA, seed=0)
    assert ds.name == "statlog_shuttle" and len(ds) == 100
    ctx, rew = ds.to_torch()
    assert ctx.dtype == torch.float32 and ctx.shape == (100, 9) and rew.shape == (100, 7)
    with pytest.raises(ValueError, match="unknown bandit"):
        nd.load_bandit("jester")


def test_classification_bandit_helper():
    x = np.array([[1.0, 5.0], [3.0, 5.0], [5.0, 5.0]])
    ds = nd.classification_bandit(x, np.array([0, 2, 1]))
    assert ds.num_actions == 3
    np.testing.assert_allclose(ds.contexts[:, 0], [-np.sqrt(1.5), 0.0, np.sqrt(1.5)])
    np.testing.assert_array_equal(ds.contexts[:, 1], 0.0)  # constant column: centred only
    with pytest.raises(ValueError, match="labels"):
        nd.classification_bandit(x, np.array([0, 1, 3]), num_actions=3)
