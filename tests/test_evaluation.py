"""ngvi.evaluate_classifier and ngvi.predict(vectorize=True): against direct computations."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

import ngvi
from ngvi import metrics
from ngvi.baselines import MAP, MCDropout


def trained(cls=ngvi.Vadam, seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    opt = cls(model if cls in (ngvi.VOGN, ngvi.NoisyKFAC) else model.parameters(), 32, seed=seed, **kwargs)
    for _ in range(5):

        def closure():
            opt.zero_grad()
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            opt.backward(loss, out)
            return loss

        opt.step(closure)
    return model, opt, x, y


@pytest.mark.parametrize("cls", [ngvi.Vadam, ngvi.VOGN, ngvi.NoisyKFAC, ngvi.IVON])
def test_vectorized_samples_are_the_posterior_draws_through_the_model(cls):
    """vectorize=True evaluates posterior().sample(S, generator) in one vmap: the same outputs as a loop of
    functional calls on those draws."""
    model, opt, x, _ = trained(cls, init_prec=50.0) if cls in (ngvi.Vadam, ngvi.VOGN) else trained(cls)
    out = ngvi.predict(model, opt, x, 6, vectorize=True, chunk=4, generator=torch.Generator().manual_seed(5))
    post, gen = opt.posterior(), torch.Generator().manual_seed(5)
    names = [n for n, _ in model.named_parameters()]
    draws = post.sample(4, generator=gen), post.sample(2, generator=gen)  # the chunks, in order
    loop = [
        functional_call(model, {n: d[s] for n, d in zip(names, chunk, strict=True)}, (x,))
        for chunk in draws
        for s in range(chunk[0].shape[0])
    ]
    torch.testing.assert_close(out, torch.stack(loop))
    assert out.shape == (6, 32, 3) and out.std(0).mean() > 0  # the samples differ


def test_vectorized_point_estimate_and_dropout_masks():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x = torch.randn(5, 4)
    same = ngvi.predict(model, MAP(model, 10), x, 4, vectorize=True)
    assert same.shape == (4, 5, 3) and torch.equal(same[0], same[3])
    dropped = nn.Sequential(nn.Dropout(0.5), nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3))
    opt = MCDropout(dropped, 10)
    dropped.eval()
    out = ngvi.predict(dropped, opt, x, 7, vectorize=True, chunk=3)
    assert out.shape == (7, 5, 3) and out.std(0).min() > 0  # a fresh mask per sample and point
    assert not dropped[0].training  # dropout is off again outside the sample
    with pytest.raises(ValueError, match="vectorize"):
        ngvi.predict(dropped, opt, x, 2, vectorize=True, linearized=True)
    with pytest.raises(ValueError, match="chunk"):
        ngvi.predict(dropped, opt, x, 2, vectorize=True, chunk=0)


def test_evaluate_classifier_is_the_metrics_of_the_averaged_probabilities():
    model, opt, x, y = trained(ngvi.Vadam, init_prec=50.0)
    torch.manual_seed(1)
    ev = ngvi.evaluate_classifier(model, opt, x, y, samples=8, batch_size=10, vectorize=True)
    torch.manual_seed(1)  # the same draws, batch by batch: the BMA by hand
    probs = torch.cat(
        [
            metrics.predictive_probs(ngvi.predict(model, opt, x[i : i + 10], 8, vectorize=True))
            for i in range(0, 32, 10)
        ]
    )
    torch.testing.assert_close(ev.probs_bma, probs)
    torch.testing.assert_close(ev.probs_mean, torch.softmax(model(x).double(), -1))
    # the metrics are those of its own probabilities: the same computation, so equal to the last bit
    assert ev.bma == ngvi.evaluation.classification_metrics(ev.probs_bma, y, 15)
    assert ev.mean == ngvi.evaluation.classification_metrics(ev.probs_mean, y, 15)
    # and, up to rounding, those of the BMA by hand (other batchings of the arithmetic)
    picked = probs[torch.arange(32), y]
    assert ev.bma["nll"] == pytest.approx(float(-picked.log().mean()), rel=1e-12)
    assert ev.bma["accuracy"] == metrics.accuracy(probs, y)  # a count: no rounding
    assert ev.bma["ece"] == pytest.approx(metrics.ece(probs, y, 15), rel=1e-9, abs=1e-12)
    assert ev.bma["brier"] == pytest.approx(metrics.brier(probs, y), rel=1e-9)
    assert ev.reliability["bma"]["count"].sum() == 32 and ev.samples == 8
    # the default loop over the optimizer's own noise: same metric definitions, other draws; its one batch
    # of float32 logits at the mean rounds otherwise than ev's batches of 10
    loop = ngvi.evaluate_classifier(model, opt, x, y, samples=8)
    assert loop.mean == pytest.approx(ev.mean, rel=1e-6) and 0 <= loop.bma["ece"] <= 1
    with pytest.raises(ValueError, match="labels"):
        ngvi.evaluate_classifier(model, opt, x, y[:-1])
    with pytest.raises(ValueError, match="samples"):
        ngvi.evaluate_classifier(model, opt, x, y, samples=0)


def test_point_estimates_are_evaluated_once():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    x, y = torch.randn(9, 4), torch.randint(0, 3, (9,))
    ev = ngvi.evaluate_classifier(model, MAP(model, 9), x, y, samples=16)
    assert ev.bma == ev.mean and ev.samples == 16


class NaNForPositiveFirstInput(nn.Module):
    """A linear classifier whose class-0 logit is NaN wherever the first input is positive."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        out = self.linear(x)
        return torch.where((x[:, :1] > 0) & (torch.arange(3) == 0), float("nan"), out)


def test_evaluate_classifier_refuses_empty_input_and_nonfinite_outputs():
    """One clear ValueError each, instead of torch.cat's 'expected a non-empty list' or bincount's
    'non-negative integral inputs' from deep inside."""
    torch.manual_seed(0)
    model = NaNForPositiveFirstInput()
    x, y = torch.randn(9, 4), torch.randint(0, 3, (9,))
    positive = int((x[:, 0] > 0).sum())
    assert 0 < positive < 9
    with pytest.raises(ValueError, match=r"x must be a tensor of at least one test point.*got \[0, 4\]"):
        ngvi.evaluate_classifier(model, MAP(model, 9), x[:0], y[:0])
    # MAP: one draw (a point estimate) and the mean weights, each NaN at class 0 of the positive points
    with pytest.raises(
        ValueError,
        match=rf"NaN or Inf for {positive} of 9 test points \({2 * positive} of 54 logits over 1 posterior "
        r"sample\(s\) and the mean weights\): the model or its posterior produced them",
    ):
        ngvi.evaluate_classifier(model, MAP(model, 9), x, y, samples=16)
    bad_x = x.clone()
    bad_x[2, 1] = float("inf")
    with pytest.raises(ValueError, match="x holds 1 NaN or Inf values"):
        ngvi.evaluate_classifier(nn.Linear(4, 3), MAP(model, 9), bad_x, y)


def test_classification_metrics_refuse_labels_shaped_n_by_1():
    probs = torch.full((5, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"got \[5, 1\]: use y\.squeeze\(-1\)"):
        ngvi.evaluation.classification_metrics(probs, torch.zeros(5, 1, dtype=torch.long))
