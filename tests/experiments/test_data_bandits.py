"""Contextual-bandit data sets: reward matrices follow the documented Riquelme et al. (2018) rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ngvi.experiments.data as nd
from ngvi.experiments.bandits.protocol import normalised_reward

SHUTTLE_COUNTS = [34108, 37, 132, 6748, 2458, 6, 11]  # classes 1-7 of shuttle.trn, from MANIFEST.md


def test_mushroom_full_rewards(data_dir):
    ds = nd.load_mushroom_bandit(data_dir=data_dir, seed=0)
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
    ref = nd.load_mushroom_bandit(data_dir=data_dir, seed=1)
    assert not np.array_equal(ds.contexts, ref.contexts)
    assert sorted(map(tuple, ds.contexts)) == sorted(map(tuple, ref.contexts))


def test_mushroom_sampling_is_seeded_with_replacement(data_dir):
    a = nd.load_mushroom_bandit(3000, data_dir=data_dir, seed=5)
    b = nd.load_mushroom_bandit(3000, data_dir=data_dir, seed=5)
    c = nd.load_mushroom_bandit(3000, data_dir=data_dir, seed=6)
    assert a.contexts.shape == (3000, 117) and a.rewards.shape == (3000, 2)
    np.testing.assert_array_equal(a.contexts, b.contexts)
    np.testing.assert_array_equal(a.rewards, b.rewards)
    assert not np.array_equal(a.rewards, c.rewards)
    big = nd.load_mushroom_bandit(20000, data_dir=data_dir, seed=0)
    assert len(np.unique(big.contexts, axis=0)) < 8124 < 20000  # with replacement: repeats


def test_mushroom_custom_rewards(data_dir):
    always_bad = nd.load_mushroom_bandit(data_dir=data_dir, prob_poison_bad=1.0)
    np.testing.assert_array_equal(always_bad.rewards[always_bad.labels == 0, 1], -35.0)
    # if not eating costs more than the expected poison (-15), the oracle always eats
    hungry = nd.load_mushroom_bandit(data_dir=data_dir, r_noeat=-50.0)
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


def test_shuttle_bandit(data_dir):
    ds = nd.load_shuttle_bandit(data_dir=data_dir, seed=0)
    assert ds.contexts.shape == (43500, 9) and ds.name == "statlog_shuttle"
    _check_classification_bandit(ds, 7)
    assert np.bincount(ds.labels, minlength=7).tolist() == SHUTTLE_COUNTS
    assert ds.action_names[0] == "Rad Flow"
    x, labels = nd.load_shuttle("test", data_dir)
    assert x.shape == (14500, 9) and labels.min() >= 0 and labels.max() <= 6


def test_shuttle_subsample_and_rare_classes(data_dir):
    ordered = nd.load_shuttle_bandit(data_dir=data_dir, shuffle=False)
    _, labels = nd.load_shuttle("train", data_dir)
    np.testing.assert_array_equal(ordered.labels, labels)
    small = nd.load_shuttle_bandit(1000, data_dir=data_dir, seed=2)
    assert len(small) == 1000
    _check_classification_bandit(small, 7)
    pruned = nd.load_shuttle_bandit(data_dir=data_dir, remove_underrepresented=True)
    assert len(pruned) == 43500 - 6 - 11 and pruned.num_actions == 7  # classes 6 and 7 (< 0.05%) dropped
    assert set(np.unique(pruned.labels)) == {0, 1, 2, 3, 4}
    with pytest.raises(ValueError, match="num_contexts"):
        nd.load_shuttle_bandit(50000, data_dir=data_dir)


def test_adult_bandit(data_dir):
    ds = nd.load_adult_bandit(data_dir=data_dir, seed=0)
    # rows with any missing value dropped, counted independently here
    n_complete = 0
    for fname in ("adult.data", "adult.test"):
        for line in (data_dir / "bandits" / "adult" / fname).read_text().splitlines():
            if line.strip() and not line.startswith("|") and "?" not in line:
                n_complete += 1
    assert len(ds) == n_complete == 45222
    assert ds.context_dim == 92 and ds.num_actions == 14
    _check_classification_bandit(ds, 14)
    assert ds.action_names[0] == "Adm-clerical" and "Armed-Forces" in ds.action_names
    assert np.bincount(ds.labels, minlength=14).min() > 0
    # the income column is one 2-valued block (test labels' trailing '.' removed): last two columns
    assert len(np.unique(ds.contexts[:, -2:], axis=0)) == 2
    small = nd.load_adult_bandit(2000, data_dir=data_dir, seed=1)
    assert small.contexts.shape == (2000, 92) and small.num_actions == 14


def test_dispatch_and_torch(data_dir):
    ds = nd.load_bandit("statlog", 100, data_dir=data_dir, seed=0)
    assert ds.name == "statlog_shuttle" and len(ds) == 100
    ctx, rew = ds.to_torch()
    assert ctx.dtype == torch.float32 and ctx.shape == (100, 9) and rew.shape == (100, 7)
    with pytest.raises(ValueError, match="unknown bandit"):
        nd.load_bandit("yahoo")


def test_classification_bandit_helper():
    x = np.array([[1.0, 5.0], [3.0, 5.0], [5.0, 5.0]])
    ds = nd.classification_bandit(x, np.array([0, 2, 1]))
    assert ds.num_actions == 3
    np.testing.assert_allclose(ds.contexts[:, 0], [-np.sqrt(1.5), 0.0, np.sqrt(1.5)])
    np.testing.assert_array_equal(ds.contexts[:, 1], 0.0)  # constant column: centred only
    with pytest.raises(ValueError, match="labels"):
        nd.classification_bandit(x, np.array([0, 1, 3]), num_actions=3)


# the wheel bandit (generated) ------------------------------------------------------------------------------


def test_wheel_quadrants_by_hand():
    points = np.array(
        [[0.5, 0.5], [0.5, -0.5], [-0.5, 0.5], [-0.5, -0.5], [0.5, 0.0], [0.0, 0.5], [0.0, 0.0]]
    )
    # (x>0, y>0) → 0, (x>0, y≤0) → 1, (x≤0, y>0) → 2, (x≤0, y≤0) → 3, as in Riquelme et al.'s sampler
    assert nd.wheel_quadrant_action(points).tolist() == [0, 1, 2, 3, 1, 2, 3]


@pytest.mark.parametrize("delta", [0.5, 0.95])
def test_wheel_optimal_reward(delta):
    """Outside the radius the quadrant's action pays 50, inside action 4 pays 1.2 (the rest 1.0), so the
    optimal expected reward is 50 or 1.2 per round and 50(1 − δ²) + 1.2δ² on average (P(‖X‖ ≥ δ) = 1 − δ²
    on the disc)."""
    n = 20000
    ds = nd.wheel_bandit(n, delta, seed=3)
    assert ds.contexts.shape == (n, 2) and ds.rewards.shape == (n, 5) and ds.name == f"wheel_{delta:g}"
    norm = np.linalg.norm(ds.contexts, axis=1)
    assert norm.max() <= 1.0
    outside = norm >= delta
    np.testing.assert_array_equal(ds.labels, outside)
    quadrant = nd.wheel_quadrant_action(ds.contexts)
    np.testing.assert_array_equal(ds.opt_actions, np.where(outside, quadrant, 4))
    np.testing.assert_array_equal(ds.opt_rewards, np.where(outside, 50.0, 1.2))
    # sampled rewards: N(mean, 0.01²), the quadrant's action at 50 outside the radius
    means = np.tile([1.0, 1.0, 1.0, 1.0, 1.2], (n, 1))
    means[outside, quadrant[outside]] = 50.0
    assert np.abs(ds.rewards - means).max() < 6 * 0.01
    np.testing.assert_array_equal(ds.mean_rewards, means)  # the expected rewards, for the pseudo-regret
    # the share outside and the mean optimal reward, within 4 standard errors of the hand-computed values
    p = 1 - delta**2
    assert abs(outside.mean() - p) < 4 * np.sqrt(p * (1 - p) / n)
    assert abs(ds.opt_rewards.mean() - (50 * p + 1.2 * (1 - p))) < 4 * 48.8 * np.sqrt(p * (1 - p) / n)


def test_wheel_is_seeded_and_checks_arguments():
    a, b, c = (nd.wheel_bandit(500, 0.7, seed=s) for s in (1, 1, 2))
    np.testing.assert_array_equal(a.contexts, b.contexts)
    np.testing.assert_array_equal(a.rewards, b.rewards)
    assert not np.array_equal(a.contexts, c.contexts)
    assert nd.load_bandit("wheel", 50, delta=0.7, seed=1).name == "wheel_0.7"
    with pytest.raises(ValueError, match="delta"):
        nd.wheel_bandit(10, 1.5)
    with pytest.raises(ValueError, match="num_contexts"):
        nd.wheel_bandit(0, 0.5)
    with pytest.raises(ValueError, match="num_contexts"):
        nd.load_bandit("wheel")


def _uniform_score(ds: nd.BanditDataset) -> float:
    """The expected normalised reward of the uniform policy on ds: the mean over the K constant policies."""
    n, k = ds.rewards.shape
    return np.mean([normalised_reward(ds.rewards, np.full(n, a), ds.opt_rewards) for a in range(k)])


def test_uniform_policy_scores_match_hand_computed_and_badam(data_dir):
    """Normalisation by the optimal reward: uniform earns 1/K on a classification bandit (exactly), and
    E[(5·p_e − 15·p_p)/2] / (5·p_e) on mushroom; BADAM Table 1's Uniform row (Statlog 0.14 ± 0.00, Adult
    0.07 ± 0.00, Mushroom −0.93 ± 0.09) agrees."""
    assert _uniform_score(nd.load_shuttle_bandit(data_dir=data_dir)) == pytest.approx(1 / 7, abs=1e-12)
    assert _uniform_score(nd.load_adult_bandit(5000, data_dir=data_dir)) == pytest.approx(1 / 14, abs=1e-12)
    p_e = 4208 / 8124
    expected = 0.5 * (5 * p_e - 15 * (1 - p_e)) / (5 * p_e)  # = −0.896
    # the poison rewards are ±20 around −15: the realised mean is within 4 s.e. of it
    tolerance = 4 * 0.5 * (1 - p_e) * 20 / np.sqrt(3916) / (5 * p_e)
    score = _uniform_score(nd.load_mushroom_bandit(data_dir=data_dir))
    assert score == pytest.approx(expected, abs=tolerance)
    assert abs(expected - (-0.93)) < 0.09
    # with the expected rewards (E[eat] = 5 or −15, E[no eat] = 0) the uniform score is exactly that value
    full = nd.load_mushroom_bandit(data_dir=data_dir)
    exact = np.mean(
        [normalised_reward(full.mean_rewards, np.full(8124, a), full.opt_rewards) for a in (0, 1)]
    )
    assert exact == pytest.approx(expected, abs=1e-12)
    # the wheel: inside, uniform earns (4·1 + 1.2)/5 = 1.04; outside (50 + 3·1 + 1.2)/5 = 10.84
    for delta in (0.5, 0.9):
        p = 1 - delta**2
        truth = (10.84 * p + 1.04 * (1 - p)) / (50 * p + 1.2 * (1 - p))
        assert _uniform_score(nd.wheel_bandit(40000, delta, seed=0)) == pytest.approx(truth, rel=0.01)


# the bandits read from a folder of the user's (not in the ngvi data) ---------------------------------------


@pytest.mark.parametrize("name", ["covertype", "census", "jester", "financial"])
def test_user_bandits_say_they_are_not_available_offline(name, tmp_path):
    with pytest.raises(nd.DataNotFoundError, match="not available offline") as err:
        nd.load_bandit(name, 10)
    assert "--user-data-dir" in str(err.value) and nd.USER_BANDITS[name].file in str(err.value)
    with pytest.raises(nd.DataNotFoundError, match="was not found in") as err:
        nd.load_bandit(name, 10, user_dir=tmp_path)
    assert nd.USER_BANDITS[name].file in str(err.value)


def test_covertype_and_census_from_user_files(tmp_path):
    rng = np.random.default_rng(0)
    rows = np.hstack([rng.integers(0, 50, size=(40, 54)), (np.arange(40) % 7 + 1)[:, None]])
    (tmp_path / "covtype.data").write_text("\n".join(",".join(map(str, r)) for r in rows) + "\n")
    ds = nd.load_bandit("covertype", 30, user_dir=tmp_path, seed=1)
    _check_classification_bandit(ds, 7)
    assert ds.contexts.shape == (30, 54)
    full = nd.load_user_bandit("covertype", user_dir=tmp_path)
    assert len(full) == 40 and sorted(np.bincount(full.labels).tolist()) == [5, 5, 6, 6, 6, 6, 6]

    header = "caseid,dAge,dOccup,iSex"
    lines = [header] + [f"{i},{i % 3},{i % 9},{i % 2}" for i in range(45)]
    (tmp_path / "USCensus1990.data.txt").write_text("\n".join(lines) + "\n")
    ds = nd.load_bandit("census", None, user_dir=tmp_path)
    _check_classification_bandit(ds, 9)
    assert ds.context_dim == 3 + 2  # dAge and iSex one-hot; caseid and the label dOccup dropped
    with pytest.raises(ValueError, match="num_contexts"):
        nd.load_bandit("census", 46, user_dir=tmp_path)


def test_jester_and_financial_from_user_files(tmp_path):
    rng = np.random.default_rng(0)
    ratings = rng.uniform(-10, 10, size=(25, 40))
    np.save(tmp_path / "jester_data_40jokes_19181users.npy", ratings)
    ds = nd.load_bandit("jester", 20, user_dir=tmp_path, seed=2)
    assert ds.contexts.shape == (20, 32) and ds.num_actions == 8
    rows = [np.flatnonzero((ratings[:, :32] == c).all(1))[0] for c in ds.contexts]  # the users drawn
    np.testing.assert_array_equal(ds.rewards, ratings[rows, 32:])
    np.testing.assert_array_equal(ds.opt_rewards, ratings[rows, 32:].max(1))  # the best-rated joke

    prices = rng.uniform(10, 20, size=(30, 21))
    text = "header\n" + "\n".join(" ".join(f"{v:.4f}" for v in r) for r in prices) + "\n"
    (tmp_path / "raw_stock_contexts").write_text(text)
    ds = nd.load_bandit("financial", 30, user_dir=tmp_path, seed=0)
    assert ds.contexts.shape == (30, 21) and ds.num_actions == 8
    # rewards are linear in the context plus N(0, 0.01²) noise; the oracle maximises the linear part
    beta, *_ = np.linalg.lstsq(ds.contexts, ds.rewards, rcond=None)
    np.testing.assert_allclose(np.linalg.norm(beta, axis=0), 1.0, atol=0.05)
    assert np.all(ds.opt_rewards >= (ds.contexts @ beta).max(1) - 0.05)
