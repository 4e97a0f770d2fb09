"""USPS handwritten digits (the ESL "zip" data) and the 3-vs-5 logistic-regression task of Vadam §6.1.

Files in ``<data_dir>/usps/``: ``zip.train.gz`` (7291 images) and ``zip.test.gz`` (2007), one image per line:
the digit, then 256 grey values in [-1, 1] (16 x 16, row-major); and ``usps_3vs5.txt.gz``, the rows of
``zip.train`` then ``zip.test`` whose digit is 3 or 5 (1540 rows: 824 threes, 716 fives), same format.

The 3-vs-5 task follows Vadam's ``get_data_log_reg.m``: y = 1 for a 5 and 0 for a 3, a random 50/50 split.
(Vadam loads GPML's ``usps_resampled.mat``, a re-split of the same 9298 USPS images; its 3-vs-5 subset has the
same 1540 rows ("1540 obs"), but in another order, so a seeded split here is not row-for-row Vadam's.)
"""

from __future__ import annotations

import functools
import gzip
import io
from pathlib import Path
from typing import Literal

import numpy as np

from ._files import PathLike, data_path
from .libsvm import BinaryDataset, add_bias_column
from .splits import random_split_indices

#: Rows of each file.
USPS_SIZES = {"train": 7291, "test": 2007, "3vs5": 1540}


@functools.lru_cache(maxsize=4)
def _parse_zip(path: str, _stamp: tuple[int, int]) -> np.ndarray:
    text = gzip.decompress(Path(path).read_bytes()).decode("ascii")
    table = np.loadtxt(io.StringIO(text), dtype=np.float64, ndmin=2)
    table.setflags(write=False)
    return table


def _read_zip(rel: str, n_rows: int, data_dir: PathLike | None) -> tuple[np.ndarray, np.ndarray]:
    path = data_path(rel, data_dir)
    st = path.stat()
    table = _parse_zip(str(path), (st.st_size, st.st_mtime_ns))
    if table.shape != (n_rows, 257):
        raise ValueError(f"{rel}: expected {n_rows} rows of 257 values, got {table.shape}")
    digits = table[:, 0]
    if not np.array_equal(digits, np.round(digits)) or digits.min() < 0 or digits.max() > 9:
        raise ValueError(f"{rel}: first column should hold digits 0-9")
    return table[:, 1:].copy(), digits.astype(np.int64)


def load_usps(
    split: Literal["train", "test"] = "train", data_dir: PathLike | None = None, *, images: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """USPS ``(x, digits)``: float64 grey levels in [-1, 1], ``[N, 256]`` (``[N, 16, 16]`` if ``images``)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    x, digits = _read_zip(f"usps/zip.{split}.gz", USPS_SIZES[split], data_dir)
    return (x.reshape(-1, 16, 16) if images else x), digits


def load_usps_3vs5_full(data_dir: PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """All 1540 USPS threes and fives: ``x [1540, 256]`` float64 and y int64 (1 = digit 5, 0 = digit 3)."""
    x, digits = _read_zip("usps/usps_3vs5.txt.gz", USPS_SIZES["3vs5"], data_dir)
    if not set(np.unique(digits).tolist()) <= {3, 5}:
        raise ValueError("usps_3vs5.txt.gz should hold only digits 3 and 5")
    return x, (digits == 5).astype(np.int64)


def load_usps_3vs5(
    data_dir: PathLike | None = None, *, seed: int = 0, test_fraction: float = 0.5, add_bias: bool = False
) -> BinaryDataset:
    """USPS 3-vs-5 (Vadam §6.1) with a seeded random split (50/50 by default: 770 / 770); y = 1 for a 5."""
    x, y = load_usps_3vs5_full(data_dir)
    if add_bias:
        x = add_bias_column(x)
    tr, te = random_split_indices(len(y), test_fraction, seed)
    return BinaryDataset("usps_3vs5", x[tr], y[tr], x[te], y[te])
