"""CIFAR-10 (Krizhevsky 2009) from the standard "python version" batches, for users who have them.

The folder (``cifar-10-batches-py``, as unpacked from ``cifar-10-python.tar.gz``) holds ``data_batch_1`` …
``data_batch_5`` (50,000 training images) and ``test_batch`` (10,000): each a pickled dict with
``b"data"`` (uint8 [10000, 3072], the red, green and blue planes of each 32×32 image, row-major) and
``b"labels"`` (a list of ints). Nothing is downloaded.

**A pickle is a program**, not data: unpickling calls whatever callables the file names, and even numpy's
own array rebuilders can be steered into reading pointers from the file (issue 20). So these files are read by
:func:`ngvi.experiments.data._safe_pickle.loads`, which runs nothing: it builds dicts, lists, str, bytes and
ints itself, and the uint8 image array from its raw bytes; anything else is refused with a ``ValueError``.

**A batch's size is known** (issue 31): 10,000 images of 3,072 bytes, about 31 MB on disk. A file larger
than :data:`MAX_BATCH_FILE` is refused before it is read, and the reader may build at most
:data:`MAX_BATCH_BUILT` bytes of values from one (the image bytes three times over: the string in the file,
its latin-1 text form where Python 3 wrote it below protocol 3, and the array copied from it), so a crafted
file that names one string thousands of times through the pickle memo is refused in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch

from ._files import DataNotFoundError, PathLike
from ._safe_pickle import loads

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCHES = ("test_batch",)
#: per-channel mean and standard deviation of the training images in [0, 1]
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
#: images per batch file, and bytes per image
BATCH_IMAGES, IMAGE_BYTES = 10_000, 3072
#: the largest batch file read (a real one is 31,035,7xx bytes) and the most bytes of values built from one
MAX_BATCH_FILE = 64 << 20
MAX_BATCH_BUILT = 3 * BATCH_IMAGES * IMAGE_BYTES + (16 << 20)
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def _batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The images [n, 3072] and labels [n] of one batch file, checked."""
    hint = "use the batch files unpacked from cifar-10-python.tar.gz"
    size = path.stat().st_size
    if size <= MAX_BATCH_FILE:
        with path.open("rb") as f:  # at most one byte past the bound, should the file grow meanwhile
            raw = f.read(MAX_BATCH_FILE + 1)
        size = len(raw)
    if size > MAX_BATCH_FILE:
        raise ValueError(
            f"CIFAR-10 batch {path} has {size:,} bytes, more than the {MAX_BATCH_FILE:,} read from a batch "
            f"(a real one, {BATCH_IMAGES:,} images, is about 31 MB): {hint}"
        )
    batch = loads(raw, f"CIFAR-10 batch {path}", max_built=MAX_BATCH_BUILT)
    if not isinstance(batch, dict):
        raise ValueError(f"{path} is not a CIFAR-10 batch (a dict) but a {type(batch).__name__}: {hint}")
    get = lambda key: batch.get(key.encode(), batch.get(key))  # noqa: E731 (Python 2 pickles: bytes keys)
    data, labels = get("data"), get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        shape = data.shape if isinstance(data, np.ndarray) else type(data).__name__
        raise ValueError(f"{path}: 'data' must be a uint8 array [n, 3072], got {shape}: {hint}")
    n = data.shape[0]
    ok = isinstance(labels, list) and len(labels) == n
    if not (ok and all(type(y) is int and 0 <= y <= 9 for y in labels)):
        raise ValueError(f"{path}: 'labels' must be a list of {n} ints in 0..9: {hint}")
    return data, np.array(labels, dtype=np.int64)


def load_cifar10(
    folder: PathLike, split: Literal["train", "test"] = "train"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Images [N, 3, 32, 32] uint8 and int64 labels from the python-version batches in ``folder``.

    Raises:
        DataNotFoundError: a batch file is missing.
        ValueError: a file is not a CIFAR-10 batch, or holds anything but plain data and a uint8 array.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    root = Path(folder).expanduser()
    names = TRAIN_BATCHES if split == "train" else TEST_BATCHES
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise DataNotFoundError(
            f"CIFAR-10 batches {', '.join(missing)} not found in {str(root)!r}: pass --cifar-dir, the folder "
            "cifar-10-batches-py unpacked from cifar-10-python.tar.gz (the python version, "
            "https://www.cs.toronto.edu/~kriz/cifar.html); ngvi downloads nothing.",
            str(root / missing[0]),
        )
    parts = [_batch(root / n) for n in names]
    data = np.concatenate([d for d, _ in parts]).reshape(-1, 3, 32, 32)
    labels = np.concatenate([y for _, y in parts])
    return torch.from_numpy(data.copy()), torch.from_numpy(labels)
