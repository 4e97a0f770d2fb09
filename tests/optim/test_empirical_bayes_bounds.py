"""EmpiricalBayes(bounds=) takes two numbers (issue 43, item 16): strings such as "1e-3" are refused when
the option is made, not at the first update, where they failed inside it."""

from __future__ import annotations

import pytest

import ngvi


def test_empirical_bayes_bounds_must_be_numbers():
    with pytest.raises(ValueError, match=r"bounds must be two numbers \(low, high\), got \('1e-3', '1e3'\)"):
        ngvi.EmpiricalBayes(bounds=("1e-3", "1e3"))
    with pytest.raises(ValueError, match="bounds must be two numbers"):
        ngvi.EmpiricalBayes(bounds=(True, 10.0))
    assert ngvi.EmpiricalBayes(bounds=(1, 1e3)).bounds == (1, 1e3)  # ints are numbers
