"""The public namespaces: ``ngvi.optim.__all__`` holds the optimizers, and the names that moved out of
``ngvi.optim`` in 0.2.0 still work from their old paths for one release, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch

import ngvi
import ngvi.optim
import ngvi.protocol


def test_optim_all_holds_only_optimizers():
    for name in ngvi.optim.__all__:
        obj = getattr(ngvi.optim, name)
        assert isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer), name
    # and every optimizer class ngvi exports at the top is one of them
    top = {n for n in ngvi.__all__ if isinstance(getattr(ngvi, n), type)}
    optimizers = {n for n in top if issubclass(getattr(ngvi, n), torch.optim.Optimizer)}
    assert optimizers == set(ngvi.optim.__all__)


@pytest.mark.parametrize("name", ["PosteriorOptimizer", "unwrap"])
def test_moved_names_warn_from_the_old_paths_and_are_the_same_objects(name):
    new = getattr(ngvi.protocol, name)
    assert getattr(ngvi, name) is new
    with pytest.warns(DeprecationWarning, match=rf"ngvi\.optim\.{name} moved to ngvi\.protocol\.{name}"):
        assert getattr(ngvi.optim, name) is new
    old_module = importlib.import_module("ngvi.optim.protocol")
    with pytest.warns(DeprecationWarning, match=rf"ngvi\.optim\.protocol\.{name} moved"):
        assert getattr(old_module, name) is new


def test_new_paths_and_importing_the_integrations_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from ngvi import PosteriorOptimizer, unwrap  # noqa: F401
        from ngvi.optim import EmpiricalBayes, NonFiniteGradientError, sample_preactivations  # noqa: F401
        from ngvi.protocol import PosteriorOptimizer as P  # noqa: F401


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Adam'"):
        ngvi.optim.Adam
    with pytest.raises(ImportError):
        from ngvi.optim import Adam  # noqa: F401
