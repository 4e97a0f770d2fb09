"""Seeded index splits: k-fold cross-validation and a random train/test split."""

from __future__ import annotations

import numpy as np


def kfold_indices(n: int, n_folds: int = 5, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Shuffled k-fold split of ``range(n)``: a list of ``(train_idx, val_idx)``, one pair per fold.

    The validation folds partition ``range(n)`` and differ in size by at most one. Each index array is
    sorted int64. The same ``seed`` gives the same folds.
    """
    if not 2 <= n_folds <= n:
        raise ValueError(f"n_folds must be between 2 and n={n}, got {n_folds}")
    perm = np.random.default_rng(seed).permutation(n)
    folds = np.array_split(perm, n_folds)
    out = []
    for k in range(n_folds):
        val = np.sort(folds[k])
        train = np.sort(np.concatenate([folds[j] for j in range(n_folds) if j != k]))
        out.append((train.astype(np.int64), val.astype(np.int64)))
    return out


def random_split_indices(n: int, test_fraction: float = 0.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A seeded random ``(train_idx, test_idx)`` split of ``range(n)``; ``round(n * test_fraction)`` test.

    Both index arrays are sorted int64, disjoint, and together cover ``range(n)``.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    n_test = round(n * test_fraction)
    if not 0 < n_test < n:
        raise ValueError(f"test_fraction={test_fraction} leaves an empty train or test set for n={n}")
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_test:]).astype(np.int64), np.sort(perm[:n_test]).astype(np.int64)
