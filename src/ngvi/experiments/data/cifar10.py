"""CIFAR-10 (Krizhevsky 2009) from the standard "python version" batches, for users who have them.

The folder (``cifar-10-batches-py``, as unpacked from ``cifar-10-python.tar.gz``) holds ``data_batch_1`` …
``data_batch_5`` (50,000 training images) and ``test_batch`` (10,000): each a pickled dict with
``b"data"`` (uint8 [10000, 3072], the red, green and blue planes of each 32×32 image, row-major) and
``b"labels"`` (a list of ints). Nothing is downloaded.

**A pickle is a program**, not data: unpickling calls whatever callables the file names. These files are
read with :class:`RestrictedUnpickler`, which admits only what the batches contain — dicts, lists, str and
bytes, ints and floats (pickle's own opcodes, no callables), and numpy arrays, through the two numpy
functions that rebuild them — and refuses every other global (``os.system``, ``builtins.eval``, …) with an
``UnpicklingError`` before anything runs.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from ._files import DataNotFoundError, PathLike

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCHES = ("test_batch",)
#: per-channel mean and standard deviation of the training images in [0, 1]
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

# The globals a pickled numpy array needs: numpy's array rebuilder (module name of numpy 1.x and 2.x),
# the ndarray and dtype classes it is called with, numpy's scalar rebuilder and its protocol-5 buffer
# reader; and _codecs.encode, with
# which Python 3 writes bytes in pickle protocols 0-2 (a pure str -> bytes conversion).
_ALLOWED = {
    ("_codecs", "encode"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),  # protocol 5
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}


class RestrictedUnpickler(pickle.Unpickler):
    """An Unpickler that resolves only numpy's array-rebuilding globals; any other global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(
                f"refusing to load {module}.{name} from a data pickle: only numpy arrays, lists, dicts, "
                "str and bytes are admitted (a pickle that names other callables can run code)"
            )
        if module.startswith("numpy.core"):  # numpy 2 keeps the 1.x names only as deprecated aliases
            module = "numpy._core" + module[len("numpy.core") :] if hasattr(np, "_core") else module
        return getattr(__import__(module, fromlist=[name]), name)


def restricted_loads(data: bytes) -> Any:
    """Unpickle ``data`` with :class:`RestrictedUnpickler` (Python 2 strings are read as bytes)."""
    return RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()


def _batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    batch = restricted_loads(path.read_bytes())
    if not isinstance(batch, dict):
        raise ValueError(f"{path} is not a CIFAR-10 batch (a pickled dict), got {type(batch).__name__}")
    get = lambda key: batch.get(key.encode(), batch.get(key))  # noqa: E731 (Python 2 pickles: bytes keys)
    data, labels = get("data"), get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise ValueError(
            f"{path}: 'data' must be a uint8 array [n, 3072], got {getattr(data, 'shape', data)}"
        )
    labels = np.asarray(labels, dtype=np.int64)
    if labels.shape != (data.shape[0],) or labels.min(initial=0) < 0 or labels.max(initial=0) > 9:
        raise ValueError(f"{path}: 'labels' must be {data.shape[0]} ints in 0..9")
    return data, labels


def load_cifar10(
    folder: PathLike, split: Literal["train", "test"] = "train"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Images [N, 3, 32, 32] uint8 and int64 labels from the python-version batches in ``folder``.

    Raises:
        DataNotFoundError: a batch file is missing.
        pickle.UnpicklingError: a file names a callable other than numpy's array rebuilders.
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
