"""UCI regression loaders: shapes from MANIFEST.md, split integrity, standardisation, cross-validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

import ngvi.experiments.data as nd

# From MANIFEST.md: N, columns of data.txt, features, target column, splits, train/test, n_hidden, n_epochs.
MANIFEST = {
    "bostonHousing": (506, 14, 13, 13, 20, 455, 51, 50, 40),
    "concrete": (1030, 9, 8, 8, 20, 927, 103, 50, 40),
    "energy": (768, 9, 8, 8, 20, 691, 77, 50, 40),
    "kin8nm": (8192, 9, 8, 8, 20, 7373, 819, 50, 40),
    "naval-propulsion-plant": (11934, 18, 16, 16, 20, 10741, 1193, 50, 40),
    "power-plant": (9568, 5, 4, 4, 20, 8611, 957, 50, 40),
    "protein-tertiary-structure": (45730, 10, 9, 9, 5, 41157, 4573, 100, 20),
    "wine-quality-red": (1599, 12, 11, 11, 20, 1439, 160, 50, 40),
    "yacht": (308, 7, 6, 6, 20, 277, 31, 50, 40),
}


def test_uci_datasets_table_matches_manifest():
    expected = {k: (v[0], v[2], v[4]) for k, v in MANIFEST.items()}
    table = dict(nd.UCI_DATASETS)
    assert table == expected


@pytest.mark.parametrize("name", list(MANIFEST))
def test_info_matches_manifest(name, data_dir):
    n, _, d, target, splits, _, _, hidden, epochs = MANIFEST[name]
    info = nd.uci_info(name, data_dir)
    assert (info.n_rows, info.n_features, info.target_column) == (n, d, target)
    assert info.feature_columns == tuple(range(d))
    assert (info.n_splits, info.n_hidden, info.n_epochs) == (splits, hidden, epochs)
    assert info.dropout_rates == (0.005, 0.01, 0.05, 0.1)
    assert len(info.tau_values) == 3 and all(t > 0 for t in info.tau_values)


@pytest.mark.parametrize("name", list(MANIFEST))
def test_every_split_is_a_partition(name, data_dir):
    n, n_cols, d, target, splits, n_tr, n_te, _, _ = MANIFEST[name]
    folder = data_dir / "uci" / name
    raw = np.loadtxt(folder / "data.txt")
    assert raw.shape == (n, n_cols) and np.isfinite(raw).all()
    for i in range(splits):
        s = nd.load_uci(name, i, data_dir)
        assert (s.split, s.n_splits) == (i, splits)
        assert s.x_train.shape == (n_tr, d) and s.x_test.shape == (n_te, d)
        assert s.y_train.shape == (n_tr,) and s.y_test.shape == (n_te,)
        assert s.x_train.dtype == np.float64 and s.y_test.dtype == np.float64
        tr, te = s.train_index, s.test_index
        np.testing.assert_array_equal(tr, np.loadtxt(folder / f"index_train_{i}.txt", dtype=np.int64))
        np.testing.assert_array_equal(te, np.loadtxt(folder / f"index_test_{i}.txt", dtype=np.int64))
        assert np.intersect1d(tr, te).size == 0
        np.testing.assert_array_equal(np.sort(np.concatenate([tr, te])), np.arange(n))
        assert tr.max() < n and te.max() < n
        np.testing.assert_array_equal(s.x_train, raw[tr][:, :d])
        np.testing.assert_array_equal(s.y_test, raw[te, target])


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("boston", "bostonHousing"),
        ("naval", "naval-propulsion-plant"),
        ("power", "power-plant"),
        ("wine", "wine-quality-red"),
        ("protein", "protein-tertiary-structure"),
        ("BostonHousing", "bostonHousing"),
        ("power_plant", "power-plant"),
        ("yacht", "yacht"),
    ],
)
def test_aliases(alias, name):
    assert nd.uci_name(alias) == name


def test_alias_loads_same_split(data_dir):
    a, b = nd.load_uci("boston", 4, data_dir), nd.load_uci("bostonHousing", 4, data_dir)
    assert a.name == "bostonHousing"
    np.testing.assert_array_equal(a.x_train, b.x_train)


def test_bad_name_and_split(data_dir):
    with pytest.raises(ValueError, match=r"unknown UCI data set 'year'.*yacht"):
        nd.load_uci("year", 0, data_dir)
    with pytest.raises(ValueError, match=r"split must be in \[0, 5\)"):
        nd.load_uci("protein", 5, data_dir)


def test_energy_target_is_heating_load(data_dir):
    x, y = nd.load_uci_data("energy", data_dir)
    assert x.shape == (768, 8) and y.shape == (768,)
    assert y[0] == pytest.approx(15.55)  # heating load of the first building


def test_naval_constant_columns_are_guarded(data_dir):
    s = nd.load_uci("naval", 0, data_dir)
    z, scaler = s.standardized()
    np.testing.assert_array_equal(np.flatnonzero(scaler.constant_columns), [8, 11])
    assert np.isfinite(z.x_train).all() and np.isfinite(z.x_test).all()
    assert np.all(z.x_train[:, [8, 11]] == 0.0)
    others = np.delete(np.arange(16), [8, 11])
    np.testing.assert_allclose(z.x_train[:, others].std(0), 1.0, rtol=1e-10)


@pytest.mark.parametrize("name", ["bostonHousing", "concrete", "yacht"])
def test_standardisation_uses_training_statistics_only(name, data_dir):
    s = nd.load_uci(name, 1, data_dir)
    z, scaler = s.standardized()
    np.testing.assert_allclose(scaler.x_mean, s.x_train.mean(0))
    np.testing.assert_allclose(scaler.x_std, s.x_train.std(0))
    assert scaler.y_mean == pytest.approx(s.y_train.mean()) and scaler.y_std == pytest.approx(s.y_train.std())
    np.testing.assert_allclose(z.x_train.mean(0), 0.0, atol=1e-12)
    np.testing.assert_allclose(z.x_train.std(0), 1.0, rtol=1e-12)
    assert z.y_train.mean() == pytest.approx(0.0, abs=1e-12) and z.y_train.std() == pytest.approx(1.0)
    # the statistics are those of the training rows alone, not of all rows
    s2 = nd.Standardizer.fit(s.x_train, s.y_train)
    np.testing.assert_array_equal(s2.x_mean, scaler.x_mean)
    x_all, y_all = nd.load_uci_data(name, data_dir)
    assert not np.allclose(nd.Standardizer.fit(x_all, y_all).x_mean, scaler.x_mean)
    np.testing.assert_allclose(z.x_test, (s.x_test - s.x_train.mean(0)) / s.x_train.std(0))
    # round trips
    np.testing.assert_allclose(scaler.inverse_y(z.y_test), s.y_test, rtol=1e-12)
    np.testing.assert_allclose(scaler.inverse_x(z.x_test), s.x_test, rtol=1e-12, atol=1e-12)
    assert scaler.inverse_y_std(1.0) == pytest.approx(s.y_train.std())


def test_standardizer_on_tensors_and_log_likelihood_offset(data_dir):
    s = nd.load_uci("concrete", 0, data_dir)
    z, scaler = s.standardized()
    _, _, x_te, y_te = s.to_torch(torch.float64)
    zt = scaler.transform_x(x_te)
    assert isinstance(zt, torch.Tensor) and zt.dtype == torch.float64
    np.testing.assert_allclose(zt.numpy(), z.x_test, rtol=1e-12)
    back = scaler.inverse_y(scaler.transform_y(y_te))
    torch.testing.assert_close(back, y_te)
    # a Gaussian predictive in standardised units, scored in original units
    mu_z, sd_z = 0.3, 0.7
    y = s.y_test[:5]
    ll_orig = norm.logpdf(y, scaler.inverse_y(mu_z), scaler.inverse_y_std(sd_z))
    ll_std = norm.logpdf(scaler.transform_y(y), mu_z, sd_z) + scaler.log_likelihood_offset
    np.testing.assert_allclose(ll_orig, ll_std, rtol=1e-12)
    assert scaler.log_likelihood_offset == pytest.approx(-math.log(s.y_train.std()))


def test_standardizer_constant_target():
    scaler = nd.Standardizer.fit(np.zeros((4, 2)), np.full(4, 3.0))
    assert scaler.y_std == 1.0 and scaler.constant_columns.all()
    np.testing.assert_array_equal(scaler.transform_y(np.full(4, 3.0)), 0.0)


def test_to_torch(data_dir):
    s = nd.load_uci("yacht", 0, data_dir)
    x_tr, y_tr, x_te, y_te = s.to_torch()
    assert x_tr.dtype == torch.float32 and x_tr.shape == (277, 6) and y_te.shape == (31,)
    assert y_tr.shape == (277,) and x_te.shape == (31, 6)
    assert s.to_torch(torch.float64)[0].dtype == torch.float64


def test_cv_folds_partition_the_training_set(data_dir):
    s = nd.load_uci("yacht", 2, data_dir)
    folds = s.cv_folds(n_folds=5, seed=3)
    assert len(folds) == 5 and [f.fold for f in folds] == list(range(5))
    val = np.concatenate([f.test_index for f in folds])
    np.testing.assert_array_equal(np.sort(val), np.sort(s.train_index))
    for f in folds:
        assert len(f.y_test) in (55, 56) and len(f.y_train) + len(f.y_test) == 277
        assert np.intersect1d(f.train_index, f.test_index).size == 0
        assert np.intersect1d(f.test_index, s.test_index).size == 0  # the test split is never used
        both = np.concatenate([f.train_index, f.test_index])
        np.testing.assert_array_equal(np.sort(both), np.sort(s.train_index))
    again = s.cv_folds(n_folds=5, seed=3)
    other = s.cv_folds(n_folds=5, seed=4)
    np.testing.assert_array_equal(folds[0].test_index, again[0].test_index)
    assert not np.array_equal(folds[0].test_index, other[0].test_index)


@pytest.mark.parametrize(("n", "k"), [(10, 2), (11, 5), (277, 5), (5, 5)])
def test_kfold_indices(n, k):
    folds = nd.kfold_indices(n, k, seed=0)
    sizes = [len(v) for _, v in folds]
    assert max(sizes) - min(sizes) <= 1
    np.testing.assert_array_equal(np.sort(np.concatenate([v for _, v in folds])), np.arange(n))
    for tr, va in folds:
        np.testing.assert_array_equal(np.union1d(tr, va), np.arange(n))
        assert np.intersect1d(tr, va).size == 0


def test_kfold_and_random_split_validation():
    with pytest.raises(ValueError, match="n_folds"):
        nd.kfold_indices(3, 5)
    tr, te = nd.random_split_indices(1540, 0.5, seed=1)
    assert len(tr) == len(te) == 770 and np.intersect1d(tr, te).size == 0
    with pytest.raises(ValueError, match="test_fraction"):
        nd.random_split_indices(10, 1.0)
