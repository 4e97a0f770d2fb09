"""MNIST IDX reader: shapes, label counts and normalisation, against MANIFEST.md."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch

import ngvi.experiments.data as nd
from ngvi.experiments.data.mnist import parse_idx

COUNTS = {
    "train": [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949],
    "test": [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009],
}


@pytest.mark.parametrize("split", ["train", "test"])
def test_shapes_dtypes_and_label_counts(split, data_dir):
    x, y = nd.load_mnist(split, data_dir)
    n = sum(COUNTS[split])
    assert x.shape == (n, 28, 28) and x.dtype == torch.uint8
    assert y.shape == (n,) and y.dtype == torch.int64
    assert torch.bincount(y, minlength=10).tolist() == COUNTS[split]
    if split == "train":
        assert x.double().mean().item() == pytest.approx(33.318, abs=1e-3)


def test_flatten_and_normalise(data_dir):
    raw, _ = nd.load_mnist("test", data_dir)
    unit, _ = nd.load_mnist("test", data_dir, flatten=True, normalize="unit")
    assert unit.shape == (10000, 784) and unit.dtype == torch.float32
    assert unit.min().item() == 0.0 and unit.max().item() == 1.0
    torch.testing.assert_close(unit[:500], raw[:500].reshape(500, -1).float() / 255)
    std, _ = nd.load_mnist("test", data_dir, normalize="standard", dtype=torch.float64)
    assert std.dtype == torch.float64 and std.shape == (10000, 28, 28)
    torch.testing.assert_close(std[:500], (raw[:500].double() / 255 - nd.MNIST_MEAN) / nd.MNIST_STD)
    assert abs(std.mean().item()) < 0.02 and abs(std.std().item() - 1) < 0.02  # test pixels, train statistics
    with pytest.raises(ValueError, match="normalize"):
        nd.load_mnist("test", data_dir, normalize="minmax")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="split"):
        nd.load_mnist("valid", data_dir)  # type: ignore[arg-type]


def test_returned_tensors_are_independent_copies(data_dir):
    x1, _ = nd.load_mnist("test", data_dir)
    x1[0] = 255
    x2, _ = nd.load_mnist("test", data_dir)
    assert x2[0].float().mean().item() < 255


def test_idx_reader(tmp_path):
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    raw = struct.pack(">BBBB3I", 0, 0, 0x08, 3, 2, 3, 4) + arr.tobytes()
    np.testing.assert_array_equal(parse_idx(raw), arr)
    (tmp_path / "a.idx").write_bytes(raw)
    (tmp_path / "a.idx.gz").write_bytes(gzip.compress(raw))
    np.testing.assert_array_equal(nd.read_idx(tmp_path / "a.idx"), arr)
    np.testing.assert_array_equal(nd.read_idx(tmp_path / "a.idx.gz"), arr)
    ints = np.array([[1, -2], [300, 4]], dtype=">i4")
    got = parse_idx(struct.pack(">BBBB2I", 0, 0, 0x0C, 2, 2, 2) + ints.tobytes())
    np.testing.assert_array_equal(got, ints)
    assert got.dtype.isnative and got.dtype == np.int32
    with pytest.raises(ValueError, match="magic"):
        parse_idx(b"\x1f\x8b\x08\x00" + raw[4:])
    with pytest.raises(ValueError, match="should have"):
        parse_idx(raw[:-1])
