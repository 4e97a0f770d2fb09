"""USPS zip data and the 3-vs-5 task: counts from zip.info.txt and MANIFEST.md."""

from __future__ import annotations

import numpy as np
import pytest

import ngvi.experiments.data as nd

# per-digit counts from zip.info.txt
COUNTS = {
    "train": [1194, 1005, 731, 658, 652, 556, 664, 645, 542, 644],
    "test": [359, 264, 198, 166, 200, 160, 170, 147, 166, 177],
}


@pytest.mark.parametrize("split", ["train", "test"])
def test_usps_shapes_and_counts(split, data_dir):
    x, digits = nd.load_usps(split, data_dir)
    n = sum(COUNTS[split])
    assert x.shape == (n, 256) and x.dtype == np.float64 and digits.dtype == np.int64
    assert np.bincount(digits, minlength=10).tolist() == COUNTS[split]
    assert x.min() >= -1.0 and x.max() <= 1.0
    images, _ = nd.load_usps(split, data_dir, images=True)
    assert images.shape == (n, 16, 16)
    np.testing.assert_array_equal(images[7].ravel(), x[7])


def test_3vs5_file_is_the_threes_and_fives_of_train_then_test(data_dir):
    x, y = nd.load_usps_3vs5_full(data_dir)
    assert x.shape == (1540, 256) and y.dtype == np.int64
    assert (int((y == 0).sum()), int(y.sum())) == (824, 716)  # 824 threes (y=0), 716 fives (y=1)
    parts = [nd.load_usps(s, data_dir) for s in ("train", "test")]
    ref_x = np.vstack([px[(pd == 3) | (pd == 5)] for px, pd in parts])
    ref_d = np.concatenate([pd[(pd == 3) | (pd == 5)] for _, pd in parts])
    np.testing.assert_array_equal(x, ref_x)
    np.testing.assert_array_equal(y, (ref_d == 5).astype(np.int64))


def test_3vs5_random_split(data_dir):
    ds = nd.load_usps_3vs5(data_dir, seed=0)
    assert ds.x_train.shape == (770, 256) and ds.x_test.shape == (770, 256)
    assert ds.y_train.sum() + ds.y_test.sum() == 716
    rows = np.vstack([ds.x_train, ds.x_test])
    x, _ = nd.load_usps_3vs5_full(data_dir)
    assert len(np.unique(rows, axis=0)) == len(np.unique(x, axis=0))  # nothing lost or duplicated
    again, other = nd.load_usps_3vs5(data_dir, seed=0), nd.load_usps_3vs5(data_dir, seed=1)
    np.testing.assert_array_equal(ds.x_test, again.x_test)
    assert not np.array_equal(ds.y_test, other.y_test) or not np.array_equal(ds.x_test, other.x_test)
    biased = nd.load_usps_3vs5(data_dir, seed=0, add_bias=True, test_fraction=0.25)
    assert biased.x_train.shape == (1155, 257) and np.all(biased.x_train[:, 0] == 1.0)
