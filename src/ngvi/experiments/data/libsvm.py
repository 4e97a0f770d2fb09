"""LIBSVM binary-classification sets with the fixed 50/50 splits of the Vadam paper's PyTorch code.

- ``australian_scale``: Statlog Australian credit, N = 690 (345 train / 345 test), D = 14, values in [-1, 1].
- ``breast_cancer_scale``: Wisconsin breast cancer (original), N = 683 (341 / 342), D = 10, values in [-1, 1].
  The first feature is LIBSVM's scaled sample-ID column, kept as in LIBSVM and Vadam.

Files: ``<data_dir>/libsvm_<name>/<name>_{X_tr,X_te,y_tr,y_te}.csv`` (space-separated, no header).
Labels are returned as int64 in {0, 1}: 1 = positive class (australian: LIBSVM label +1;
breast cancer: malignant, LIBSVM label 4). Source: github.com/emtiyaz/vadam (see MANIFEST.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ._files import PathLike, data_path

#: Name -> (train rows, test rows, features).
LIBSVM_DATASETS: dict[str, tuple[int, int, int]] = {
    "australian_scale": (345, 345, 14),
    "breast_cancer_scale": (341, 342, 10),
}


@dataclass(frozen=True)
class BinaryDataset:
    """A binary classification train/test split: float64 inputs ``[n, D]`` and int64 labels in {0, 1}."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]

    def to_torch(
        self,
        dtype: torch.dtype = torch.float32,
        label_dtype: torch.dtype = torch.int64,
        device: torch.device | str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x_train, y_train, x_test, y_test)`` as tensors (use ``label_dtype=torch.float32`` for BCE)."""
        return (
            torch.as_tensor(self.x_train, dtype=dtype, device=device),
            torch.as_tensor(self.y_train, dtype=label_dtype, device=device),
            torch.as_tensor(self.x_test, dtype=dtype, device=device),
            torch.as_tensor(self.y_test, dtype=label_dtype, device=device),
        )


def add_bias_column(x: np.ndarray) -> np.ndarray:
    """``x`` with a leading column of ones (the bias feature of the Vadam MATLAB code)."""
    return np.hstack([np.ones((x.shape[0], 1), dtype=x.dtype), x])


def as_binary_labels(values: np.ndarray, positive: float = 1.0, negative: float = 0.0) -> np.ndarray:
    """Map labels valued in ``{negative, positive}`` to int64 {0, 1}; any other value is a ValueError."""
    values = np.asarray(values).reshape(-1)
    unexpected = set(np.unique(values).tolist()) - {positive, negative}
    if unexpected:
        raise ValueError(f"expected labels in {{{negative}, {positive}}}, found {sorted(unexpected)}")
    return (values == positive).astype(np.int64)


def _csv(rel: str, data_dir: PathLike | None) -> np.ndarray:
    return np.loadtxt(data_path(rel, data_dir), dtype=np.float64, ndmin=2)


def load_libsvm(name: str, data_dir: PathLike | None = None, *, add_bias: bool = False) -> BinaryDataset:
    """The fixed Vadam split of ``"australian_scale"`` or ``"breast_cancer_scale"``; labels in {0, 1}."""
    key = name.strip().lower().replace("-", "_")
    if key not in LIBSVM_DATASETS:
        raise ValueError(f"unknown LIBSVM data set {name!r}; known: {', '.join(LIBSVM_DATASETS)}")
    n_tr, n_te, d = LIBSVM_DATASETS[key]
    parts = {p: _csv(f"libsvm_{key}/{key}_{p}.csv", data_dir) for p in ("X_tr", "y_tr", "X_te", "y_te")}
    x_tr, x_te = parts["X_tr"], parts["X_te"]
    y_tr, y_te = as_binary_labels(parts["y_tr"]), as_binary_labels(parts["y_te"])
    if x_tr.shape != (n_tr, d) or x_te.shape != (n_te, d) or len(y_tr) != n_tr or len(y_te) != n_te:
        raise ValueError(f"{key}: unexpected shapes {x_tr.shape}, {x_te.shape}, {y_tr.shape}, {y_te.shape}")
    if add_bias:
        x_tr, x_te = add_bias_column(x_tr), add_bias_column(x_te)
    return BinaryDataset(key, x_tr, y_tr, x_te, y_te)


def load_australian_scale(data_dir: PathLike | None = None, *, add_bias: bool = False) -> BinaryDataset:
    """LIBSVM ``australian_scale``, Vadam's fixed split: 345 train / 345 test, D = 14, labels {0, 1}."""
    return load_libsvm("australian_scale", data_dir, add_bias=add_bias)


def load_breast_cancer_scale(data_dir: PathLike | None = None, *, add_bias: bool = False) -> BinaryDataset:
    """LIBSVM ``breast-cancer_scale``, Vadam's fixed split: 341 train / 342 test, D = 10; 1 = malignant."""
    return load_libsvm("breast_cancer_scale", data_dir, add_bias=add_bias)


def load_breast_cancer_scale_full(data_dir: PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """All 683 rows from Vadam's MATLAB ``breast_cancer_scale.mat``: ``x [683, 10]`` float64 and y in {0, 1}.

    The file stores LIBSVM's labels {2, 4}; 4 (malignant) maps to 1. Use it for random re-splits.
    """
    from scipy.io import loadmat

    mat = loadmat(data_path("libsvm_breast_cancer_scale/breast_cancer_scale_full.mat", data_dir))
    x = mat["X"]
    x = np.asarray(x.toarray() if hasattr(x, "toarray") else x, dtype=np.float64)
    return x, as_binary_labels(mat["y"], positive=4, negative=2)
