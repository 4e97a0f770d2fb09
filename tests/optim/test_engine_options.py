"""The engine's options behind one keyword (issue 42, item 5): ``engine=ngvi.EngineOptions(...)`` or a dict;
the same names as keywords still work with a DeprecationWarning until 0.3.0 and compute the same steps."""

from __future__ import annotations

import warnings

import pytest
import torch

import ngvi


def trajectory(**options) -> list[torch.Tensor]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1)).double()
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = torch.sin(x.sum(1, keepdim=True))
    opt = ngvi.IVON(net.parameters(), 64, seed=0, **options)

    def closure():
        opt.zero_grad()
        loss = 0.5 * (net(x) - y).square().mean()
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    return [p.detach().clone() for p in net.parameters()]


def test_engine_options_as_an_object_a_dict_and_the_old_keywords_agree():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new forms warn nothing
        new = trajectory(engine=ngvi.EngineOptions(flat=False, noise="chunked"))
        mapping = trajectory(engine={"flat": False, "noise": "chunked"})
    with pytest.warns(DeprecationWarning, match=r"IVON\(flat=...\) is deprecated.*engine=\{'flat': ...\}"):
        old = trajectory(flat=False, noise="chunked")
    for a, b, c in zip(new, mapping, old, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert trajectory(engine={"flat": False})[0].ne(trajectory()[0]).any()  # the option reaches the engine


def test_the_options_are_readable_back_and_the_defaults_are_the_engines():
    opt = ngvi.IVON(torch.nn.Linear(2, 1).parameters(), 10, engine={"finite_check": "host"})
    assert opt.engine == ngvi.EngineOptions(finite_check="host")
    assert opt.finite_check == "host" and opt.flat is None and opt.noise == "normal"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"engine": {"flatt": False}}, ValueError, r"engine= has no option 'flatt'"),
        ({"engine": ["flat"]}, TypeError, r"engine= takes an ngvi.EngineOptions or a dict"),
        ({"engine": {"flat": False}, "flat": True}, ValueError, r"flat is given in engine= and as a keyword"),
        ({"flatt": False}, TypeError, r"unexpected keyword argument 'flatt'"),
        ({"engine": {"finite_check": "gpu"}}, ValueError, r"finite_check"),
    ],
)
def test_bad_options_are_refused_in_one_line(kwargs, error, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(error, match=message):
            ngvi.IVON(torch.nn.Linear(2, 1).parameters(), 10, **kwargs)
