"""MNIST from the standard gzipped IDX files in ``<data_dir>/mnist/``.

``train``: 60,000 images, ``test``: 10,000 (the ``t10k`` files); 28 x 28 uint8 pixels, labels 0-9.
No torchvision needed. See MANIFEST.md for the provenance (the training images were rebuilt losslessly and
match LeCun's canonical md5).
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from ._files import PathLike, data_path

#: Mean and standard deviation of the training pixels after scaling to [0, 1].
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

_FILES = {
    "train": ("mnist/train-images-idx3-ubyte.gz", "mnist/train-labels-idx1-ubyte.gz"),
    "test": ("mnist/t10k-images-idx3-ubyte.gz", "mnist/t10k-labels-idx1-ubyte.gz"),
}
_IDX_DTYPES = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def parse_idx(raw: bytes) -> np.ndarray:
    """Decode IDX bytes (magic ``0 0 <type> <ndim>``, big-endian uint32 dims, then the data)."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError("not an IDX file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = header + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(f"IDX file of shape {dims} should have {expected} bytes, has {len(raw)}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def read_idx(path: PathLike) -> np.ndarray:
    """Read an IDX file, gzipped (``.gz``) or not, into a numpy array of its stored dtype."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return parse_idx(raw)


@functools.lru_cache(maxsize=4)
def _cached_idx(path: str, _stamp: tuple[int, int]) -> np.ndarray:
    arr = read_idx(path)
    arr.setflags(write=False)
    return arr


def _load(rel: str, data_dir: PathLike | None) -> np.ndarray:
    path = data_path(rel, data_dir)
    st = path.stat()
    return _cached_idx(str(path), (st.st_size, st.st_mtime_ns))


def load_mnist(
    split: Literal["train", "test"] = "train",
    data_dir: PathLike | None = None,
    *,
    flatten: bool = False,
    normalize: Literal["unit", "standard"] | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST images and int64 labels.

    Images are ``[N, 28, 28]`` (``[N, 784]`` with ``flatten``). With ``normalize=None`` they stay uint8 in
    [0, 255]; ``"unit"`` gives ``dtype`` values in [0, 1]; ``"standard"`` gives ``(x/255 - 0.1307) / 0.3081``.
    """
    if split not in _FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if normalize not in (None, "unit", "standard"):
        raise ValueError(f"normalize must be None, 'unit' or 'standard', got {normalize!r}")
    img_rel, lbl_rel = _FILES[split]
    images, labels = _load(img_rel, data_dir), _load(lbl_rel, data_dir)
    if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.shape != (images.shape[0],):
        raise ValueError(f"unexpected MNIST shapes: images {images.shape}, labels {labels.shape}")
    x = torch.from_numpy(images.copy())
    if flatten:
        x = x.reshape(x.shape[0], -1)
    if normalize is not None:
        x = x.to(dtype) / 255.0
        if normalize == "standard":
            x = (x - MNIST_MEAN) / MNIST_STD
    return x, torch.from_numpy(labels.astype(np.int64))
