"""Fashion-MNIST (Xiao et al. 2017), the out-of-distribution set of ``ngvi classify``, from Debian's package.

Debian's ``dataset-fashion-mnist`` puts the four gzipped IDX files in ``/usr/share/datasets/fashion-mnist``
(``dpkg -L dataset-fashion-mnist``): ``apt-get install -y dataset-fashion-mnist`` (``make vision-data`` runs
it). Another folder holding the same files can be given as ``data_dir`` (``--ood-dir``) or through
``$NGVI_FASHION_MNIST``. The files are checked against the sha256 sums of the package's version
0.0~git20200523.55506a9-1 (the upstream files of zalandoresearch/fashion-mnist).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from ._files import ChecksumError, DataNotFoundError, PathLike, sha256_file
from .mnist import read_idx

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
ENV_VAR = "NGVI_FASHION_MNIST"
INSTALL_HINT = (
    "Fashion-MNIST (the out-of-distribution set) is read from Debian's package: install it with\n"
    "      apt-get install -y dataset-fashion-mnist      (or: make vision-data)\n"
    f"  which puts the files in {DEBIAN_DIR}; or pass --ood-dir (data_dir=) / set ${ENV_VAR} to a folder\n"
    "  holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and\n"
    "  t10k-labels-idx1-ubyte.gz; or run `ngvi classify --no-ood` to skip the out-of-distribution part."
)
CHECKSUMS = {
    "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
}
_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def fashion_mnist_dir(data_dir: PathLike | None = None) -> Path:
    """The folder of the files: ``data_dir``, else ``$NGVI_FASHION_MNIST``, else Debian's."""
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    return Path(os.environ.get(ENV_VAR) or DEBIAN_DIR).expanduser()


def load_fashion_mnist(
    split: Literal["train", "test"] = "test", data_dir: PathLike | None = None, *, verify: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fashion-MNIST images [N, 28, 28] uint8 and int64 labels (the 10,000 ``t10k`` images for "test").

    Raises:
        DataNotFoundError: the files are missing (the message says how to install them).
        ChecksumError: a file differs from the package's.
    """
    if split not in _FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    root = fashion_mnist_dir(data_dir)
    arrays = []
    for name in _FILES[split]:
        path = root / name
        if not path.is_file():
            raise DataNotFoundError(f"Fashion-MNIST file {str(path)!r} not found.\n{INSTALL_HINT}", str(path))
        if verify and (actual := sha256_file(path)) != CHECKSUMS[name]:
            raise ChecksumError(
                f"Fashion-MNIST file {str(path)!r} has sha256 {actual}, expected {CHECKSUMS[name]}: it is "
                "corrupt or another version; reinstall it: apt-get install --reinstall dataset-fashion-mnist"
            )
        arrays.append(read_idx(path))
    images, labels = arrays
    if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.shape != (images.shape[0],):
        raise ValueError(f"unexpected Fashion-MNIST shapes: images {images.shape}, labels {labels.shape}")
    return torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64))
