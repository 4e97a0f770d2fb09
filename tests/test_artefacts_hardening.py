"""Posterior files as a careful user and an attacker would try them (issue 43): the buffers a prediction
needs travel with the posterior, every malformed file is refused in one ValueError naming it, text from a
file never reaches a model card unescaped, and a property-based fuzz of the loader over every family."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

import ngvi
from optimizer_db import TRAINERS

ENTRIES = {t.name: t for t in TRAINERS}
FAMILIES = {
    "vadam": "DiagonalGaussian",
    "noisy_kfac": "KroneckerGaussian",
    "nng_full": "FullGaussian",
    "nng_blktri": "BlockTridiagonalGaussian",
}


def _saved(name: str, folder: Path, steps: int = 2) -> tuple[nn.Module, Path]:
    info = ENTRIES[name]
    model = info.model(0, dtype=torch.float64)
    opt = info.build(model)
    info.train(model, opt, steps)
    return model, ngvi.save_posterior(model, opt, folder / f"{name}.safetensors")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, tuple[nn.Module, Path]]:
    folder = tmp_path_factory.mktemp("posteriors")
    return {name: _saved(name, folder) for name in FAMILIES}


def _contents(path: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    with safe_open(str(path), framework="pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118


def _rewrite(path: Path, out: Path, meta: dict[str, str] | None = None, **tensors) -> Path:
    """A copy of ``path`` with metadata entries and tensors replaced (a tensor None: dropped)."""
    old_meta, old = _contents(path)
    old_meta.update(meta or {})
    for key, value in tensors.items():
        key = key.replace("__", ".")
        if value is None:
            old.pop(key)
        else:
            old[key] = value
    save_file(old, str(out), metadata=old_meta)
    return out


def _refused(path: Path, match: str, model: nn.Module | None = None) -> str:
    """The load is refused with one ValueError line that names the file and says ``match``."""
    with pytest.raises(ValueError, match=match) as err:
        ngvi.load_posterior(path, model=model)
    message = str(err.value)
    assert "\n" not in message and str(path) in message, message
    return message


# -- item 1: the buffers ------------------------------------------------------------------------------------
def _bn_net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))


def _bn_problem() -> tuple[nn.Module, ngvi.IVON, torch.Tensor, torch.Tensor]:
    """The issue's 4-16-2 net with BatchNorm1d, 150 full-batch IVON steps on inputs far from the default
    running statistics (mean 5, s.d. 3), so the trained statistics matter."""
    torch.manual_seed(0)
    x = torch.randn(512, 4) * 3 + 5
    y = ((x[:, 0] - 5) + (x[:, 1] - 5) > 0).long()
    model = _bn_net()
    opt = ngvi.IVON(model.parameters(), 512, lr=0.1, seed=0)
    for _ in range(150):
        with opt.sampled_params(train=True):
            nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval(), opt, x, y


def test_a_posterior_file_carries_the_batch_norm_statistics(tmp_path):
    model, opt, x, y = _bn_problem()
    path = ngvi.save_posterior(model, opt, tmp_path / "bn.safetensors")
    fresh = _bn_net().eval()  # running mean 0, variance 1: what a model built to load into has
    sampler = ngvi.PosteriorSampler(fresh, ngvi.load_posterior(path, model=fresh), seed=0)
    for name, value in model.state_dict().items():  # weights (the mean) and every buffer, exactly
        assert torch.equal(fresh.state_dict()[name], value), name
    at_mean = ngvi.predict(fresh, sampler, x, 0)
    assert torch.equal(at_mean, ngvi.predict(model, opt, x, 0))
    accuracy = float((at_mean[0].argmax(-1) == y).double().mean())
    assert accuracy > 0.9  # 0.94 here; on main, without the statistics, 0.535 (chance)
    expected = ngvi.predict(model, opt, x, 4, vectorize=True, generator=torch.Generator().manual_seed(1))
    got = ngvi.predict(fresh, sampler, x, 4, vectorize=True, generator=torch.Generator().manual_seed(1))
    assert torch.equal(got, expected)


def test_a_posterior_without_buffers_is_refused_against_a_model_with_them(tmp_path):
    model, opt, _, _ = _bn_problem()
    bare = opt.posterior().save(tmp_path / "bare.safetensors", names=[n for n, _ in model.named_parameters()])
    message = _refused(bare, r"carries no buffers, but the model has 3 persistent buffer\(s\)", _bn_net())
    assert "'1.running_mean'" in message and "ngvi.save_posterior(model, opt, path)" in message
    with pytest.raises(ValueError, match="carries no buffers"):
        ngvi.PosteriorSampler(_bn_net(), ngvi.load_posterior(bare))
    # a version 1 file (before the buffers) loads as before, and is refused where buffers are needed
    meta, tensors = _contents(ngvi.save_posterior(model, opt, tmp_path / "v2.safetensors"))
    meta.pop("buffers")
    meta["format_version"] = "1"
    save_file(
        {k: v for k, v in tensors.items() if not k.startswith("buffer.")}, str(tmp_path / "v1"), metadata=meta
    )
    assert ngvi.load_posterior(tmp_path / "v1").buffers is None
    _refused(tmp_path / "v1", "carries no buffers", _bn_net())
    # a model whose buffers differ from the file's: named
    path = ngvi.save_posterior(model, opt, tmp_path / "bn.safetensors")
    wider = nn.Sequential(
        nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2), nn.BatchNorm1d(2)
    )
    wider[4].requires_grad_(False)
    _refused(path, r"the model's persistent buffer '4\.running_mean' is not in the posterior", wider)


# -- items 4, 5, 11: what loads is finite, named once and floating point -------------------------------------
@pytest.mark.parametrize("name", list(FAMILIES))
def test_non_finite_means_are_refused_in_every_family(name, files, tmp_path):
    _, path = files[name]
    _, tensors = _contents(path)
    for bad in (math.nan, math.inf):
        mean = tensors["mean.0"].clone()
        mean.view(-1)[0] = bad
        _refused(
            _rewrite(path, tmp_path / "m.safetensors", mean__0=mean), r"tensor 'mean\.0' holds NaN or inf"
        )


def test_a_nan_chain_basis_and_an_infinite_scale_are_refused(files, tmp_path):
    _, path = files["nng_blktri"]
    meta, tensors = _contents(path)
    basis = tensors["chain.0.row_basis"].clone()
    basis[0, 0] = math.nan
    _refused(_rewrite(path, tmp_path / "b.safetensors", chain__0__row_basis=basis), "holds NaN or inf")
    structure = json.loads(meta["structure"])
    text = json.dumps(structure).replace(str(structure["scale"]), "1e400")  # JSON's 1e400 parses to inf
    _refused(
        _rewrite(path, tmp_path / "s.safetensors", {"structure": text}), "'scale' must be a finite number"
    )


def test_a_file_naming_a_parameter_twice_is_refused(files, tmp_path):
    model, path = files["vadam"]
    meta, _ = _contents(path)
    names = json.loads(meta["names"])
    twice = _rewrite(path, tmp_path / "t.safetensors", {"names": json.dumps([names[0]] * len(names))})
    _refused(twice, r"'names' lists '0\.weight' twice")
    with pytest.raises(ValueError, match=r"names the parameter '0\.weight' twice"):
        ngvi.posterior.io.check_against_model([names[0], names[0]], [(8, 3), (8, 3)], model)


def test_means_that_are_not_floating_point_are_refused(files, tmp_path):
    _, path = files["vadam"]
    _, tensors = _contents(path)
    as_int = tensors["mean.0"].to(torch.int64)
    _refused(_rewrite(path, tmp_path / "i.safetensors", mean__0=as_int), r"mean\.0 has dtype int64")
    as_f8 = tensors["mean.0"].to(torch.float8_e4m3fn)
    _refused(_rewrite(path, tmp_path / "f8.safetensors", mean__0=as_f8), r"mean\.0 has dtype float8_e4m3fn")
    as_f32 = tensors["mean.0"].float()  # a float dtype, but not the one the metadata records
    _refused(_rewrite(path, tmp_path / "f32.safetensors", mean__0=as_f32), "the metadata says 'float64'")


# -- items 9, 10: malformed tensors and metadata: one ValueError naming the file -----------------------------
def test_malformed_family_tensors_are_refused_in_one_line(files, tmp_path):
    _, kron = files["noisy_kfac"]
    _, tensors = _contents(kron)
    rect = tensors["block.0.row_cov"][:, :, :-1].contiguous()
    _refused(_rewrite(kron, tmp_path / "k.safetensors", block__0__row_cov=rect), r"not \[G, n, n\]")
    _, blktri = files["nng_blktri"]
    _, tensors = _contents(blktri)
    zero = torch.zeros_like(tensors["chain.0.row_basis"])
    _refused(
        _rewrite(blktri, tmp_path / "z.safetensors", chain__0__row_basis=zero), "do not make a posterior"
    )
    short = tensors["chain.0.row_eig"][:-1].clone()
    _refused(
        _rewrite(blktri, tmp_path / "e.safetensors", chain__0__row_eig=short), r"chain\.0\.row_eig has shape"
    )
    wrong = tensors["chain.0.col_basis"].reshape(1, -1).clone()
    _refused(_rewrite(blktri, tmp_path / "w.safetensors", chain__0__col_basis=wrong), "do not make|has shape")
    _refused(_rewrite(blktri, tmp_path / "l.safetensors", chain__0__row_link=None), r"'chain\.0\.row_link'")


def test_malformed_metadata_is_refused_in_one_line(files, tmp_path):
    _, path = files["vadam"]
    cases = {
        "deep": ({"names": "[" * 100_000 + "]" * 100_000}, r"'names' is missing or not JSON"),
        "super2": ({"format_version": "²"}, "format_version '²'"),
        "namesdict": ({"names": '{"a": 1}'}, "names and shapes do not pair up"),
        "nameints": ({"names": "[1, 2, 3, 4]"}, "'names' must be a list of strings"),
        "shapestr": ({"shapes": '["a", "b", "c", "d"]'}, "'shapes' must be lists of sizes"),
        "point": ({"point": '["x"]'}, "'point' must list parameter indices"),
        "structure": ({"structure": "[]"}, "'structure' must be a JSON object"),
        "hyper": ({"hyperparameters": "7"}, "'hyperparameters' must be a list"),
        "dtypes": ({"dtypes": "[1]"}, "'dtypes' must name one dtype per parameter"),
        "buffers": ({"buffers": '["a", "a"]'}, "'buffers' lists 'a' twice"),
    }
    for key, (meta, match) in cases.items():
        _refused(_rewrite(path, tmp_path / f"{key}.safetensors", meta), match)


# -- item 12: a model frozen for inference -------------------------------------------------------------------
def test_a_model_frozen_for_inference_loads(files):
    _, path = files["vadam"]
    frozen = ENTRIES["vadam"].model(3, dtype=torch.float64).eval().requires_grad_(False)
    post = ngvi.load_posterior(path, model=frozen)
    sampler = ngvi.PosteriorSampler(frozen, post, seed=0)
    assert all(torch.equal(p, m) for p, m in zip(frozen.parameters(), post.mean, strict=True))
    x, _ = ENTRIES["vadam"].batch(3)
    assert ngvi.predict(frozen, sampler, x, 3).std(0).gt(0).all()  # draws reach the frozen weights
    draws = ngvi.predict(frozen, sampler, x, 400, vectorize=True, generator=torch.Generator().manual_seed(0))
    loop = ngvi.predict(frozen, sampler, x, 400)
    assert draws.std(0).gt(0).all()  # the vectorised draws reach them too, with the loop's spread
    torch.testing.assert_close(draws.std(0), loop.std(0), rtol=0.2, atol=0)
    # a trainable parameter the posterior does not cover is still refused
    deeper = nn.Sequential(*ENTRIES["vadam"].model(3, dtype=torch.float64), nn.Linear(1, 1).double())
    deeper[:3].requires_grad_(False)
    _refused(path, r"the model's trainable parameter '3\.weight' is not in the posterior", deeper)


# -- item 8: text from a file never reaches a report ---------------------------------------------------------
ATTACKS = {
    "html": "<script>alert(1)</script>",
    "image": "![x](https://tracker.example/beacon.png)",
    "row": "IVON\n| accuracy | 1.0000 | forged |",
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_rule_that_is_not_a_class_name_is_refused(attack, files, tmp_path):
    _, path = files["vadam"]
    bad = _rewrite(path, tmp_path / "r.safetensors", {"rule": ATTACKS[attack]})
    _refused(bad, "is not an optimizer's class name")  # one line: the rule repr'd (newlines escaped), cut
    with pytest.raises(ValueError, match="rule must be a class name"):
        ngvi.DiagonalGaussian([torch.zeros(2)], [torch.ones(2)]).annotate(rule=ATTACKS[attack])


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_the_report_escapes_a_rule_it_did_not_check(attack, tmp_path):
    """A posterior whose rule was set past :meth:`annotate`'s check: the card shows it as text."""
    pytest.importorskip("matplotlib")
    model = nn.Sequential(nn.Linear(3, 2))
    params = [p.detach() for p in model.parameters()]
    post = ngvi.DiagonalGaussian(params, [torch.full_like(p, 0.01) for p in params])
    post.annotate(names=["0.weight", "0.bias"])
    post.buffers, post.rule = {}, ATTACKS[attack]  # the model has no buffers; the rule unchecked
    sampler = ngvi.PosteriorSampler(model, post, seed=0)
    x, y = torch.randn(20, 3), torch.randint(0, 2, (20,))
    card = ngvi.uncertainty_report(model, sampler, (x, y), out=tmp_path / "card", samples=2)
    text = card.markdown.read_text()
    assert "<script>" not in text and "![x](" not in text and "| forged |" not in text
    rows = [line for line in text.splitlines() if line.startswith("| accuracy")]
    assert len(rows) == 1 and "forged" not in rows[0]


# -- the fuzz: every mutated file loads finite and well-shaped, or is refused naming itself ------------------
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_KEYS = ("format_version", "family", "names", "shapes", "dtypes", "point", "structure", "rule", "buffers")
_VALUES = st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -1.0, 1e-300, 1e300, 3.0])


def _mutation():
    metadata = st.tuples(
        st.just("meta"), st.sampled_from(_KEYS), _JSON.map(json.dumps) | st.text(max_size=12)
    )
    values = st.tuples(st.just("value"), st.integers(0, 10**6), _VALUES)
    reshape = st.tuples(st.just("shape"), st.integers(0, 10**6), st.integers(0, 3))
    dtype = st.tuples(st.just("dtype"), st.integers(0, 10**6),
                      st.sampled_from([torch.float16, torch.float32, torch.int32, torch.bool]))  # fmt: skip
    drop = st.tuples(st.just("drop"), st.integers(0, 10**6), st.none())
    flip = st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255))
    return st.lists(st.one_of(metadata, values, reshape, dtype, drop, flip), min_size=1, max_size=3)


def _mutate(path: Path, out: Path, mutations) -> Path:
    meta, tensors = _contents(path)
    raw_flips = []
    for kind, where, what in mutations:
        keys = sorted(tensors)
        key = keys[where % len(keys)] if keys and isinstance(where, int) else None
        if kind == "meta":
            meta[where] = what
        elif (
            kind == "value" and key is not None and tensors[key].numel() and tensors[key].is_floating_point()
        ):
            t = tensors[key].clone()
            t.view(-1)[where % t.numel()] = torch.tensor(what, dtype=torch.float64).to(t.dtype)  # 1e300: inf
            tensors[key] = t
        elif kind == "shape" and key is not None:
            t = tensors[key].reshape(-1)
            tensors[key] = t[: max(t.numel() - what, 0)].clone() if what else t.clone()
        elif kind == "dtype" and key is not None:
            tensors[key] = tensors[key].to(what)
        elif kind == "drop" and key is not None:
            tensors.pop(key)
        elif kind == "flip":
            raw_flips.append((where, what))
    save_file(tensors, str(out), metadata=meta)
    if raw_flips:
        data = bytearray(out.read_bytes())
        for where, what in raw_flips:
            data[where % len(data)] ^= what
        out.write_bytes(bytes(data))
    return out


def _check_loaded(post: ngvi.GaussianPosterior) -> None:
    assert len(post.names) == len(post.mean) == len(post.variance)
    family, _ = post._file_tensors()
    for m, v in zip(post.mean, post.variance, strict=True):
        assert m.shape == v.shape
        assert torch.isfinite(m).all() and torch.isfinite(v).all()
    assert all(torch.isfinite(t).all() for t in family.values())


@pytest.mark.parametrize("name", list(FAMILIES))
def test_fuzz_the_loader(name, files, tmp_path):
    """Mutated files (metadata values of any JSON or text, tensor values NaN/inf/huge, truncated or
    reshaped tensors, other dtypes, dropped tensors, flipped bytes): each load returns a finite, well-shaped
    posterior or raises one ValueError naming the file, never anything else (45 files per family)."""
    _, path = files[name]
    out = tmp_path / "fuzzed.safetensors"

    @settings(max_examples=45, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(_mutation())
    def check(mutations):
        bad = _mutate(path, out, mutations)
        try:
            post = ngvi.load_posterior(bad)
        except ValueError as err:
            assert str(bad) in str(err) and "\n" not in str(err), str(err)
            return
        _check_loaded(post)
        meta, _ = _contents(bad)
        assert [list(m.shape) for m in post.mean] == json.loads(meta["shapes"])  # as the file says

    check()
