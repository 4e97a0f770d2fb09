"""Posteriors as files (ngvi.posterior.io, ngvi.artefacts): a bitwise round trip for every family, the checks
against a model, and a one-line refusal for every kind of bad file."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

import ngvi
from ngvi.posterior import DiagonalGaussian
from optimizer_db import TRAINERS

ENTRIES = {t.name: t for t in TRAINERS}
FAMILIES = {
    "vadam": "DiagonalGaussian",
    "noisy_kfac": "KroneckerGaussian",
    "nng_full": "FullGaussian",
    "nng_blktri": "BlockTridiagonalGaussian",
}


def trained(name: str, dtype: torch.dtype = torch.float64, steps: int = 4):
    info = ENTRIES[name]
    model = info.model(0, dtype=dtype)
    opt = info.build(model)
    info.train(model, opt, steps)
    return info, model, opt


def assert_same(a: ngvi.GaussianPosterior, b: ngvi.GaussianPosterior) -> None:
    """Bitwise: means, variances, samples from one seed, log_prob, KL to a prior, SNR."""
    assert type(a) is type(b)
    for x, y in zip(a.mean, b.mean, strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y)
    for x, y in zip(a.variance, b.variance, strict=True):
        assert torch.equal(x, y)
    sa = a.sample(3, generator=torch.Generator().manual_seed(7))
    sb = b.sample(3, generator=torch.Generator().manual_seed(7))
    assert all(torch.equal(x, y) for x, y in zip(sa, sb, strict=True))
    assert torch.equal(a.log_prob(sa), b.log_prob(sb))
    prior = DiagonalGaussian.isotropic(a.mean, precision=2.0)
    assert torch.equal(a.kl(prior), b.kl(prior))
    assert all(torch.equal(x, y) for x, y in zip(a.snr(), b.snr(), strict=True))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_round_trip_is_bitwise_for_every_family(name, tmp_path):
    info, model, opt = trained(name)
    path = ngvi.save_posterior(model, opt, tmp_path / "q.safetensors")
    loaded = ngvi.load_posterior(path, model=model)
    assert type(loaded).__name__ == FAMILIES[name]
    assert_same(opt.posterior(), loaded)
    assert loaded.names == [n for n, p in model.named_parameters() if p.requires_grad]
    assert loaded.rule == info.cls.__name__
    assert loaded.hyperparameters[0]["lr"] == opt.param_groups[0]["lr"]
    assert loaded.hyperparameters[0]["data_size"] == 64
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["family"] == FAMILIES[name] and meta["format_version"] == "2"
    assert meta["ngvi_version"] == ngvi.__version__
    assert json.loads(meta["shapes"]) == [list(p.shape) for p in model.parameters()]
    assert json.loads(meta["dtypes"]) == ["float64"] * len(loaded.mean)


def test_float32_posterior_and_point_estimates_round_trip(tmp_path):
    _, model, opt = trained("vadam", dtype=torch.float32)
    post = ngvi.posterior_of(model, opt)
    post.save(tmp_path / "f32.safetensors")
    loaded = ngvi.load_posterior(tmp_path / "f32.safetensors")
    assert_same(post, loaded)
    assert loaded.mean[0].dtype == torch.float32
    # a point estimate (zero variance), as VOGN and noisy K-FAC give batch norm
    mean = [torch.randn(3, 2), torch.randn(2)]
    point = DiagonalGaussian(mean, [torch.rand(3, 2) + 0.1, torch.zeros(2)], point=[1])
    point.save(tmp_path / "point.safetensors", names=["w", "b"])
    again = ngvi.load_posterior(tmp_path / "point.safetensors")
    assert again.point == (1,) and again.names == ["w", "b"] and again.rule is None
    assert_same(point, again)


def test_names_follow_the_optimizer_order_not_the_model_order(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = ngvi.Vadam([{"params": model[2].parameters()}, {"params": model[0].parameters(), "lr": 0.1}], 8)
    post = ngvi.posterior_of(model, opt)
    assert post.names == ["2.weight", "2.bias", "0.weight", "0.bias"]
    assert [h["lr"] for h in post.hyperparameters] == [0.001, 0.1]
    loaded = ngvi.load_posterior(post.save(tmp_path / "q.safetensors"), model=model)
    assert [m.shape for m in loaded.mean] == [(1, 4), (1,), (4, 3), (4,)]


def test_save_without_names_is_refused_and_says_how(tmp_path):
    _, _, opt = trained("vadam", steps=1)
    with pytest.raises(ValueError, match=r"does not know its parameter names: pass names=") as err:
        opt.posterior().save(tmp_path / "q.safetensors")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="names must be 4 strings"):
        opt.posterior().save(tmp_path / "q.safetensors", names=["a"])
    with pytest.raises(ValueError, match="names must be unique"):
        opt.posterior().save(tmp_path / "q.safetensors", names=["a", "a", "b", "c"])


def _saved(tmp_path):
    _, model, opt = trained("vadam", steps=1)
    return model, ngvi.save_posterior(model, opt, tmp_path / "q.safetensors")


def _one_line(exc_type, match, fn):
    with pytest.raises(exc_type, match=match) as err:
        fn()
    assert "\n" not in str(err.value), str(err.value)


def test_a_model_that_does_not_match_is_refused_naming_the_first_difference(tmp_path):
    _, path = _saved(tmp_path)
    wider = nn.Sequential(nn.Linear(3, 9), nn.Tanh(), nn.Linear(9, 1))
    _one_line(
        ValueError,
        r"parameter '0\.weight' has shape \[8, 3\] in the posterior but \[9, 3\] in the model",
        lambda: ngvi.load_posterior(path, model=wider),
    )
    renamed = nn.Sequential()
    renamed.add_module("inp", nn.Linear(3, 8))
    _one_line(ValueError, r"parameter '0\.weight' is not a parameter of the model",
              lambda: ngvi.load_posterior(path, model=renamed))  # fmt: skip
    deeper = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1), nn.Linear(1, 1))
    _one_line(ValueError, r"the model's trainable parameter '3\.weight' is not in the posterior",
              lambda: ngvi.load_posterior(path, model=deeper))  # fmt: skip
    deeper[3].requires_grad_(False)  # frozen parameters are not part of the posterior: accepted
    assert ngvi.load_posterior(path, model=deeper).names[0] == "0.weight"


def _rewrite(path, out, **changes):
    """A copy of the posterior file at ``path`` with metadata entries changed (None: removed)."""
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    for key, value in changes.items():
        if key.startswith("drop_"):
            tensors.pop(value)
        elif value is None:
            meta.pop(key)
        else:
            meta[key] = value
    save_file(tensors, str(out), metadata=meta)
    return out


def test_bad_files_are_refused_in_one_line(tmp_path):
    _, path = _saved(tmp_path)
    _one_line(FileNotFoundError, "no posterior file at", lambda: ngvi.load_posterior(tmp_path / "none"))
    (tmp_path / "text").write_text("not a safetensors file\n")
    text = tmp_path / "text"
    _one_line(ValueError, "is not a readable safetensors file", lambda: ngvi.load_posterior(text))
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(path.read_bytes()[:-40])
    _one_line(ValueError, "is not a readable safetensors file", lambda: ngvi.load_posterior(truncated))
    save_file({"w": torch.zeros(2)}, str(tmp_path / "foreign.safetensors"), metadata={"a": "b"})
    _one_line(ValueError, "a safetensors file but not an ngvi posterior",
              lambda: ngvi.load_posterior(tmp_path / "foreign.safetensors"))  # fmt: skip
    cases = {
        "names": ({"names": "[not json"}, r"metadata is corrupt \('names' is missing or not JSON\)"),
        "nostructure": ({"structure": None}, r"metadata is corrupt \('structure'"),
        "unpaired": ({"shapes": "[[8, 3]]"}, "names and shapes do not pair up"),
        "family": ({"family": "Mixture"}, "unknown posterior family 'Mixture'"),
        "version": ({"format_version": "3"}, "format version 3, this ngvi reads up to 2: upgrade ngvi"),
        "badversion": ({"format_version": "one"}, "metadata is corrupt"),
        "tensor": ({"drop_": "variance.2"}, "tensor 'variance.2' is missing"),
        "shape": ({"shapes": "[[8, 3], [8], [1, 8], [2]]"}, r"mean\.3 has shape \[1\], the metadata says"),
    }
    for key, (changes, match) in cases.items():
        bad = _rewrite(path, tmp_path / f"{key}.safetensors", **changes)
        _one_line(ValueError, match, lambda bad=bad: ngvi.load_posterior(bad))


def test_missing_safetensors_says_pip_install(tmp_path, monkeypatch):
    _, model, opt = trained("vadam", steps=1)
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    _one_line(ImportError, "pip install safetensors", lambda: ngvi.save_posterior(model, opt, tmp_path / "q"))
    _one_line(ImportError, "pip install safetensors", lambda: ngvi.load_posterior(tmp_path / "q"))


@pytest.mark.parametrize("name", ["vadam", "nng_blktri"])
def test_a_loaded_posterior_predicts_as_the_trained_optimizer(name, tmp_path):
    info, model, opt = trained(name)
    path = ngvi.save_posterior(model, opt, tmp_path / "q.safetensors")
    fresh = info.model(seed=5)  # other weights until the posterior's mean is put in
    x, _ = info.batch(3)
    sampler = ngvi.PosteriorSampler(fresh, ngvi.load_posterior(path, model=fresh), seed=0)
    assert torch.equal(ngvi.predict(fresh, sampler, x, 0), ngvi.predict(model, opt, x, 0))
    expected = ngvi.predict(model, opt, x, 4, vectorize=True, generator=torch.Generator().manual_seed(1))
    got = ngvi.predict(fresh, sampler, x, 4, vectorize=True, generator=torch.Generator().manual_seed(1))
    assert torch.equal(got, expected)
    # the loop form: one draw per pass from the sampler's generator, the mean put back afterwards
    before = [p.clone() for p in fresh.parameters()]
    draws = ngvi.predict(fresh, sampler, x, 3)
    assert draws.shape == (3, *expected.shape[1:]) and (draws.std(0) > 0).all()
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.parameters(), strict=True))
    again = ngvi.PosteriorSampler(fresh, ngvi.load_posterior(path), seed=0)
    assert torch.equal(ngvi.predict(fresh, again, x, 3), draws)  # same seed, same draws


def test_sampler_refuses_a_posterior_without_names_or_of_another_model():
    _, model, opt = trained("vadam", steps=1)
    with pytest.raises(ValueError, match="has no parameter names"):
        ngvi.PosteriorSampler(model, opt.posterior())
    other = nn.Sequential(nn.Linear(3, 2), nn.Tanh(), nn.Linear(2, 1))
    with pytest.raises(ValueError, match=r"'0\.weight' has shape \[8, 3\]"):
        ngvi.PosteriorSampler(other, ngvi.posterior_of(model, opt))


def test_the_library_imports_safetensors_and_matplotlib_only_inside_functions():
    """``import ngvi`` needs only torch and numpy: no module-level import of either outside the experiments
    (a subprocess ``import ngvi`` would check the same in seconds; the source says it in milliseconds)."""
    src = Path(ngvi.__file__).parent
    found = []
    for path in src.rglob("*.py"):
        if "experiments" in path.relative_to(src).parts:
            continue
        for node in ast.parse(path.read_text()).body:  # module level only
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            lazy = ("safetensors", "matplotlib")
            found += [f"{path.name}: {n}" for n in names if n.partition(".")[0] in lazy]
    assert found == []
    assert "safetensors" in (src / "posterior" / "_format.py").read_text()  # the lazy import is where we look
