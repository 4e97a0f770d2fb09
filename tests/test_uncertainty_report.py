"""ngvi.uncertainty_report: every number against a direct computation on the same predictive samples, the
AUROC against a hand-computed case, the coverage against an analytic one, HF-style Mapping batches."""

from __future__ import annotations

import math
import sys

import pytest
import torch
import torch.nn.functional as F
from matplotlib.image import imread
from torch import nn

import ngvi
from ngvi import metrics
from ngvi.baselines import MAP
from ngvi.evaluation import classification_metrics, token_rows


def blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centres = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])
    y = torch.randint(0, 3, (n,), generator=g)
    return centres[y] + 0.9 * torch.randn(n, 2, generator=g), y


@pytest.fixture(scope="module")
def classifier():
    torch.manual_seed(0)
    x, y = blobs(120, 0)
    model = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = ngvi.Vadam(model.parameters(), data_size=120, lr=0.05, seed=0)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    for _ in range(30):
        opt.step(closure)
    return model, opt


def test_classification_numbers_are_the_metrics_of_the_same_samples(classifier, tmp_path):
    model, opt = classifier
    x, y = blobs(90, 1)
    x_ood = torch.randn(40, 2, generator=torch.Generator().manual_seed(2)) * 0.3 + 6.0
    report = ngvi.uncertainty_report(
        model, opt, (x, y), ood=x_ood, out=tmp_path / "card", samples=8, vectorize=True,
        generator=torch.Generator().manual_seed(0), batch_size=50,
    )  # fmt: skip
    g = torch.Generator().manual_seed(0)  # the same draws, in the same order: two batches, then the OOD set
    logits = torch.cat([ngvi.predict(model, opt, x[s], 8, vectorize=True, generator=g) for s in (slice(0, 50),
                        slice(50, 90))], dim=1)  # fmt: skip
    ood_logits = ngvi.predict(model, opt, x_ood, 8, vectorize=True, generator=g)
    probs = metrics.predictive_probs(logits)
    expected = classification_metrics(probs, y, 15)
    for key in ("accuracy", "nll", "ece", "brier"):  # equal up to the order of float64 sums
        assert report.metrics[key] == pytest.approx(expected[key], rel=1e-12, abs=1e-15), key
    assert report.metrics["nll"] == pytest.approx(metrics.categorical_nll(logits, y), rel=1e-12)
    auroc = metrics.entropy_auroc(probs, metrics.predictive_probs(ood_logits))
    assert report.metrics["ood_auroc"] == pytest.approx(auroc, rel=1e-12)
    assert torch.equal(report.curve["count"], metrics.reliability(probs, y)["count"])
    text = report.markdown.read_text()
    assert f"| ECE | {expected['ece']:.4f} |" in text and f"| OOD AUROC | {auroc:.4f} |" in text
    assert (
        "`Vadam` (DiagonalGaussian over 51 weights)" in text
        and "![Reliability diagram](reliability.png)" in text
    )
    image = imread(report.figure)
    assert image.shape[0] > 500 and image.shape[1] > 400  # a real figure, written by the Agg canvas


def test_ood_auroc_by_entropy_matches_a_hand_computed_case(tmp_path):
    """A fixed network (identity logits, a MAP point estimate): in-distribution logits [4, 0] and [2, 0],
    OOD [0, 0] and [3, 0]. Entropy falls as the margin grows: H(0) > H(2) > H(3) > H(4). Of the four
    (OOD, in) pairs the OOD point has the higher entropy in three ((0,4), (0,2), (3,4)), not in (3,2): 3/4."""
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
        model.bias.zero_()
    opt = MAP(model.parameters(), data_size=2)
    x_in, x_ood = torch.tensor([[4.0, 0.0], [2.0, 0.0]]), torch.tensor([[0.0, 0.0], [3.0, 0.0]])
    report = ngvi.uncertainty_report(model, opt, (x_in, torch.tensor([0, 1])), ood=x_ood, out=tmp_path)
    assert report.metrics["ood_auroc"] == 0.75
    assert report.metrics["samples"] == 1  # a point estimate: one draw is all of them
    assert report.metrics["accuracy"] == 0.5


def _constant_regressor():
    """f(x) = 0 for every weight draw: the predictive is exactly N(0, noise_std²)."""
    model = nn.Linear(1, 1)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    return model, MAP(model.parameters(), data_size=1)


@pytest.mark.parametrize("scale", [1.0, 2.0, 0.5])
def test_regression_coverage_matches_the_analytic_value(scale, tmp_path):
    """y ~ N(0, s²) against the predictive N(0, 1): the central p-interval ±z_p covers y with probability
    2Φ(z_p/s) − 1. With 20,000 points the s.e. of a coverage is at most 0.0036; the tolerance is 0.015."""
    model, opt = _constant_regressor()
    g = torch.Generator().manual_seed(3)
    y = scale * torch.randn(20_000, 1, generator=g)
    x = torch.zeros(20_000, 1)
    report = ngvi.uncertainty_report(model, opt, (x, y), out=tmp_path, task="regression", noise_std=1.0,
                                     batch_size=8192)  # fmt: skip
    normal = torch.distributions.Normal(0.0, 1.0)

    def truth(p: float) -> float:
        return float(2 * normal.cdf(normal.icdf(torch.tensor((1 + p) / 2)) / scale) - 1)

    assert report.metrics["coverage_95"] == pytest.approx(truth(0.95), abs=0.015)
    for p, observed in zip(report.curve["level"].tolist(), report.curve["observed"].tolist(), strict=True):
        assert observed == pytest.approx(truth(p), abs=0.015)
    # NLL of N(0, 1) at y ~ N(0, s²): ½ log 2π + s²/2 (s.e. ≈ s²/√(2N) ≤ 0.02)
    assert report.metrics["nll"] == pytest.approx(0.5 * math.log(2 * math.pi) + scale**2 / 2, abs=0.06)
    assert report.metrics["rmse"] == pytest.approx(scale, rel=0.02)
    assert (report.metrics["calibration_error"] < 0.01) == (scale == 1.0)


def test_regression_numbers_are_the_metrics_of_the_same_samples(tmp_path):
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, 60)[:, None]
    y = torch.sin(2 * x) + 0.2 * torch.randn(60, 1)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = ngvi.Vadam(model.parameters(), data_size=60, lr=0.03, seed=0)
    for _ in range(40):

        def closure():
            opt.zero_grad()
            loss = (model(x) - y).square().mean() / (2 * 0.04)
            loss.backward()
            return loss

        opt.step(closure)
    x_ood = torch.linspace(5, 8, 10)[:, None]
    report = ngvi.uncertainty_report(model, opt, (x, y), ood=x_ood, out=tmp_path, task="regression",
                                     noise_std=0.2, samples=16, vectorize=True,
                                     generator=torch.Generator().manual_seed(4))  # fmt: skip
    g = torch.Generator().manual_seed(4)
    f = ngvi.predict(model, opt, x, 16, vectorize=True, generator=g)
    f_ood = ngvi.predict(model, opt, x_ood, 16, vectorize=True, generator=g)
    assert report.metrics["rmse"] == pytest.approx(metrics.rmse(f.double().mean(0), y), rel=1e-12)
    assert report.metrics["nll"] == pytest.approx(
        -metrics.gaussian_log_likelihood(f, y, 1 / 0.2**2), rel=1e-12
    )
    u = torch.special.ndtr((y.double() - f.double()) / 0.2).mean(0).reshape(-1)  # the mixture's CDF at y
    low, high = 0.025, 0.975
    assert report.metrics["coverage_95"] == pytest.approx(float(((u >= low) & (u <= high)).double().mean()))

    def sd(s):
        return (s.double().var(0, unbiased=False) + 0.04).sqrt().reshape(-1)

    labels = torch.cat([torch.zeros(60), torch.ones(10)])
    assert report.metrics["ood_auroc"] == pytest.approx(metrics.auroc(torch.cat([sd(f), sd(f_ood)]), labels))
    assert "| 95% coverage |" in report.markdown.read_text()


class TinyLM(nn.Module):
    """A Hugging Face-style causal LM: ``model(**batch)`` returns a dict with [N, T, V] logits."""

    def __init__(self, vocab: int = 7):
        super().__init__()
        self.embed = nn.Embedding(vocab, 6)
        self.head = nn.Linear(6, vocab)

    def forward(self, input_ids, attention_mask=None):
        return {"logits": self.head(torch.tanh(self.embed(input_ids)))}


def test_mapping_batches_with_per_token_logits(tmp_path):
    torch.manual_seed(0)
    model = TinyLM()
    opt = ngvi.Vadam(model.parameters(), data_size=10, seed=0)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 7, (5, 4), generator=g)
    mask = torch.ones(5, 4, dtype=torch.long)
    mask[0, 3] = 0  # padding
    labels = torch.randint(0, 7, (5, 4), generator=g)
    labels[1, 0] = -100  # ignored
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    ood = {"input_ids": torch.randint(0, 7, (3, 4), generator=g), "attention_mask": torch.ones(3, 4)}
    report = ngvi.uncertainty_report(model, opt, [batch], ood=ood, out=tmp_path, samples=4, vectorize=True,
                                     generator=torch.Generator().manual_seed(0))  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    x = {"input_ids": ids, "attention_mask": mask}
    probs = metrics.predictive_probs(
        ngvi.predict(model, opt, x, 4, vectorize=True, generator=gen).flatten(1, 2)
    )
    rows, ys = token_rows(probs.reshape(5, 4, 7), labels, x)
    expected = classification_metrics(rows, ys)
    assert report.metrics["points"] == 18  # 20 tokens less one pad, less one ignored label
    for key in ("accuracy", "nll", "ece", "brier"):
        assert report.metrics[key] == pytest.approx(expected[key], rel=1e-12, abs=1e-15), key
    assert 0.0 <= report.metrics["ood_auroc"] <= 1.0 and report.metrics["ood_points"] == 3
    assert "held-out" not in report.markdown.read_text() and "18 tokens" in report.markdown.read_text()


def test_bad_arguments_are_refused_in_one_line(classifier, tmp_path, monkeypatch):
    model, opt = classifier
    x, y = blobs(10, 1)
    cases = [
        (dict(task="ranking"), ValueError, "task must be 'classification' or 'regression'"),
        (dict(task="regression"), ValueError, "needs noise_std=, the Gaussian likelihood's noise s.d."),
        (dict(samples=0), ValueError, "samples must be a positive int"),
    ]
    for kwargs, exc, match in cases:
        with pytest.raises(exc, match=match) as err:
            ngvi.uncertainty_report(model, opt, (x, y), out=tmp_path, **kwargs)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="needs its labels under 'labels'"):
        ngvi.uncertainty_report(model, opt, [{"x": x}], out=tmp_path)
    with pytest.raises(TypeError, match="data must be"):
        ngvi.uncertainty_report(model, opt, [x], out=tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        ngvi.uncertainty_report(model, opt, (x, y), out=tmp_path / "no_mpl")


def test_a_saved_and_loaded_posterior_gives_the_same_report(classifier, tmp_path):
    model, opt = classifier
    x, y = blobs(60, 3)
    path = ngvi.save_posterior(model, opt, tmp_path / "q.safetensors")
    fresh = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 3))
    sampler = ngvi.PosteriorSampler(fresh, ngvi.load_posterior(path, model=fresh))

    def report(m, o, where):
        g = torch.Generator().manual_seed(9)
        return ngvi.uncertainty_report(
            m, o, (x, y), ood=x + 5.0, out=tmp_path / where, samples=6, vectorize=True, generator=g
        ).metrics

    assert report(fresh, sampler, "loaded") == report(model, opt, "trained")
    assert "`Vadam` (DiagonalGaussian" in (tmp_path / "loaded" / "report.md").read_text()  # the file's rule
