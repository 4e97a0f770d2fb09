"""Bad held-out data and arguments for ngvi.calibrate and ngvi.uncertainty_report (issue 43, items 6, 7, 13
and 14): each refused in one line that names the argument, before anything is fitted or written, the
optimizer left as it was."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import ngvi

N = 40


def _pair(outputs: int) -> tuple[nn.Module, ngvi.Vadam]:
    torch.manual_seed(0)
    model = nn.Linear(3, outputs)
    return model, ngvi.Vadam(model.parameters(), N, seed=0)


def _groups(opt) -> list[dict]:
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


def _one_line(match: str, fn) -> None:
    with pytest.raises(ValueError, match=match) as err:
        fn()
    assert "\n" not in str(err.value), str(err.value)


def test_calibrate_refuses_labels_that_do_not_fit_the_inputs():
    model, opt = _pair(3)
    x, y = torch.randn(N, 3), torch.randint(0, 3, (N,))
    before = _groups(opt)
    fit = lambda data, **kw: ngvi.calibrate(model, opt, data, "classification", samples=2, **kw)  # noqa: E731
    _one_line(r"val_data: 40 inputs but y has 30 rows: x and y differ in size", lambda: fit((x, y[:30])))
    _one_line(r"labels must be class indices \(whole numbers\), got values such as [0-9]\.5",
              lambda: fit((x, y + 0.5)))  # fmt: skip
    _one_line(r"labels must be class indices in \[0, 3\) for the model's 3 outputs, got values in \[0, 7\]",
              lambda: fit((x, torch.where(y == 2, 7, y))))  # fmt: skip
    _one_line(r"class indices in \[0, 3\).*got values in \[-1, 2\]", lambda: fit((x, y - (y == 0).long())))
    assert _groups(opt) == before


def test_calibrate_refuses_nan_data_and_bad_batch_size_or_seed():
    model, opt = _pair(1)
    x, y = torch.randn(N, 3), torch.randn(N, 1)
    before = _groups(opt)
    fit = lambda data, **kw: ngvi.calibrate(model, opt, data, samples=2, **kw)  # noqa: E731
    x_nan = x.clone()
    x_nan[5, 1] = math.nan
    _one_line(r"calibrate: val_data: the inputs hold 1 NaN or inf values; remove or impute them",
              lambda: fit((x_nan, y)))  # fmt: skip
    y_nan = y.clone()
    y_nan[3] = math.nan
    _one_line(r"calibrate: val_data: y holds 1 NaN or inf values", lambda: fit((x, y_nan)))
    _one_line(r"batch_size must be a positive int, got 0", lambda: fit((x, y), batch_size=0))
    _one_line(r"seed must be an int in \[0, 2\*\*63\).*got 1\.5", lambda: fit((x, y), seed=1.5))
    assert _groups(opt) == before


@pytest.fixture
def classifier():
    pytest.importorskip("matplotlib")
    return _pair(3)


def test_uncertainty_report_refuses_nan_targets_empty_data_and_bad_arguments(classifier, tmp_path):
    model, opt = classifier
    x, y = torch.randn(N, 3), torch.randint(0, 3, (N,))
    out = tmp_path / "card"
    y_nan = torch.randn(N, 3)
    y_nan[0, 0] = math.nan
    _one_line(r"data: y holds 1 NaN or inf values",
              lambda: ngvi.uncertainty_report(model, opt, (x, y_nan), out=out, task="regression",
                                              noise_std=1.0))  # fmt: skip
    x_nan = x.clone()
    x_nan[0, 0] = math.inf
    _one_line(
        r"data: the inputs hold 1 NaN or inf values", lambda: ngvi.uncertainty_report(model, opt, (x_nan, y))
    )
    _one_line(r"ood: the inputs hold 1 NaN or inf values",
              lambda: ngvi.uncertainty_report(model, opt, (x, y), ood=x_nan, out=out))  # fmt: skip
    empty = (torch.empty(0, 3), torch.empty(0, dtype=torch.long))
    _one_line(r"data holds no points", lambda: ngvi.uncertainty_report(model, opt, empty, out=out))
    _one_line(r"x and y differ in size", lambda: ngvi.uncertainty_report(model, opt, (x, y[:30]), out=out))
    for kwargs, match in (
        ({"batch_size": 0}, "batch_size must be a positive int, got 0"),
        ({"batch_size": -5}, "batch_size must be a positive int, got -5"),
        ({"n_bins": 2.5}, r"n_bins must be a positive int, got 2\.5"),
    ):
        _one_line(match, lambda kwargs=kwargs: ngvi.uncertainty_report(model, opt, (x, y), out=out, **kwargs))
    assert not out.exists()  # nothing written for refused input
