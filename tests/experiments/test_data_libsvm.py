"""LIBSVM binary sets: shapes and label encodings from MANIFEST.md."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

import ngvi.experiments.data as nd
from ngvi.experiments.data.libsvm import add_bias_column, as_binary_labels

# name -> (train rows, test rows, features, train positives, test positives), from MANIFEST.md
EXPECTED = {
    "australian_scale": (345, 345, 14, 157, 150),
    "breast_cancer_scale": (341, 342, 10, 131, 108),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_shapes_and_labels(name, data_dir):
    n_tr, n_te, d, pos_tr, pos_te = EXPECTED[name]
    ds = nd.load_libsvm(name, data_dir)
    assert ds.x_train.shape == (n_tr, d) and ds.x_test.shape == (n_te, d) and ds.n_features == d
    assert ds.y_train.dtype == np.int64 and ds.y_train.shape == (n_tr,) and ds.y_test.shape == (n_te,)
    assert set(np.unique(np.concatenate([ds.y_train, ds.y_test]))) == {0, 1}
    assert (ds.y_train.sum(), ds.y_test.sum()) == (pos_tr, pos_te)
    assert ds.x_train.min() >= -1.0 and ds.x_train.max() <= 1.0
    assert ds.x_test.min() >= -1.0 and ds.x_test.max() <= 1.0
    # the CSV label files hold 0/1 already
    raw = np.loadtxt(data_dir / f"libsvm_{name}" / f"{name}_y_tr.csv")
    np.testing.assert_array_equal(raw, ds.y_train)


def test_named_loaders_and_bias(data_dir):
    a = nd.load_australian_scale(data_dir)
    b = nd.load_australian_scale(data_dir, add_bias=True)
    assert b.x_train.shape == (345, 15)
    np.testing.assert_array_equal(b.x_train[:, 0], 1.0)
    np.testing.assert_array_equal(b.x_train[:, 1:], a.x_train)
    assert nd.load_breast_cancer_scale(data_dir).x_test.shape == (342, 10)


def test_australian_rows_are_distinct(data_dir):
    a = nd.load_australian_scale(data_dir)
    rows = np.vstack([a.x_train, a.x_test])
    assert len(np.unique(rows, axis=0)) == 690


def test_breast_cancer_mat_equals_csv_union(data_dir):
    x, y = nd.load_breast_cancer_scale_full(data_dir)
    assert x.shape == (683, 10) and y.shape == (683,) and y.sum() == 239 and y.dtype == np.int64
    split = nd.load_breast_cancer_scale(data_dir)
    csv_rows = np.vstack([split.x_train, split.x_test])
    csv_y = np.concatenate([split.y_train, split.y_test])
    as_multiset = lambda xs, ys: Counter((tuple(np.round(r, 6)), int(t)) for r, t in zip(xs, ys, strict=True))  # noqa: E731
    assert as_multiset(x, y) == as_multiset(csv_rows, csv_y)


def test_to_torch_label_dtype(data_dir):
    x_tr, y_tr, x_te, y_te = nd.load_australian_scale(data_dir).to_torch(label_dtype=torch.float32)
    assert x_tr.dtype == torch.float32 and y_tr.dtype == torch.float32 and x_te.shape == (345, 14)
    assert y_te.shape == (345,) and set(y_te.tolist()) == {0.0, 1.0}


def test_label_mapping_helpers(data_dir):
    mapped = as_binary_labels(np.array([[2], [4], [4]]), positive=4, negative=2)
    np.testing.assert_array_equal(mapped, [0, 1, 1])
    with pytest.raises(ValueError, match=r"found \[-1.0\]"):
        as_binary_labels(np.array([-1.0, 1.0]))
    assert add_bias_column(np.zeros((2, 3))).shape == (2, 4)
    with pytest.raises(ValueError, match="unknown LIBSVM"):
        nd.load_libsvm("covtype", data_dir)
