r"""Evaluating a trained classifier: the Bayesian model average and the mean weights, side by side.

:func:`evaluate_classifier` predicts a test set with ``samples`` posterior draws and returns, for both

* the **Bayesian model average** (BMA), p(y|x) ≈ (1/S) Σₛ softmax(f(x; θₛ)), θₛ ~ q, and
* the **mean weights**, p(y|x) = softmax(f(x; μ)),

the accuracy, the NLL (−(1/N) Σₙ log p(yₙ|xₙ)), the expected calibration error over 15 equal-width confidence
bins (Guo et al. 2017; :func:`ngvi.metrics.ece`), the Brier score and the reliability bins, plus the
predictive probabilities themselves (for entropies and out-of-distribution scores). The test set is
processed in batches of ``batch_size`` points; the samples of one batch come from :func:`ngvi.predict`
(``vectorize=True`` evaluates them in batched passes). Works with every ngvi optimizer and baseline; for a
point estimate (``ngvi.baselines.MAP``) the two columns coincide.

**Token-level outputs** (a language model's [N, T, V] logits): ``x`` may be a Mapping batch (``model(**x)``,
see :func:`ngvi.predict`), ``y`` is then [N, T], the label of each output position (for a causal LM the
next token: :func:`ngvi.integrations.hf.next_token_labels`), and every metric is per token over the
positions that count: ``y != -100`` (Hugging Face's ignore index) and, for a Mapping ``x``, its
``attention_mask`` ≠ 0 (padding). ``probs_bma``/``probs_mean`` then hold those tokens' rows, [M, V].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from . import metrics
from .predict import OutputSelector, batch_size_of, predict, take

#: labels of the token positions that do not count (Hugging Face's ignore index)
IGNORE_INDEX = -100

__all__ = ["ClassifierEvaluation", "classification_metrics", "evaluate_classifier", "predictive_probs"]


@dataclass
class ClassifierEvaluation:
    """What :func:`evaluate_classifier` measured.

    ``bma`` and ``mean``: {"accuracy", "nll", "ece", "brier"} as floats; ``reliability``: the bins of each
    (:func:`ngvi.metrics.reliability`); ``probs_bma``/``probs_mean``: [N, C] predictive probabilities;
    ``samples``: the number of posterior draws averaged.
    """

    bma: dict[str, float]
    mean: dict[str, float]
    probs_bma: Tensor
    probs_mean: Tensor
    reliability: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    samples: int = 0


def classification_metrics(probs: Tensor, y: Tensor, n_bins: int = 15) -> dict[str, float]:
    """Accuracy, NLL, ECE (``n_bins`` bins) and Brier score of predictive probabilities [N, C].

    Args:
        probs: class probabilities [N, C].
        y: class indices [N].
        n_bins: the ECE's bins.

    Returns:
        ``{"accuracy", "nll", "ece", "brier"}`` as floats.

    Raises:
        ValueError: as :func:`ngvi.metrics.check_classification`.
    """
    metrics.check_classification(probs, y)
    p = probs.double()
    picked = p.gather(1, y.long().view(-1, 1)).squeeze(1)
    return {
        "accuracy": metrics.accuracy(p, y),
        "nll": float(-picked.clamp_min(torch.finfo(torch.float64).tiny).log().mean()),
        "ece": metrics.ece(p, y, n_bins),
        "brier": metrics.brier(p, y),
    }


@torch.no_grad()
def predictive_probs(
    model: nn.Module,
    opt: Any,
    x: Tensor | Mapping[str, Any],
    samples: int = 32,
    *,
    batch_size: int = 1000,
    vectorize: bool = False,
    generator: torch.Generator | None = None,
    output: OutputSelector = None,
) -> tuple[Tensor, Tensor]:
    """The Bayesian model average's class probabilities and those of the mean weights.

    Args:
        model: the classifier.
        opt: an ngvi optimizer or baseline (or a wrapper of one, or a :class:`~ngvi.PosteriorSampler`).
        x: the inputs [N, ...], or a Mapping batch (``model(**x)``).
        samples: posterior draws S.
        batch_size: points per forward pass.
        vectorize: draw in batched ``torch.func.vmap`` passes (:func:`ngvi.predict`).
        generator: seeds the draws of ``vectorize=True``.
        output: picks the logits of a non-tensor output.

    Returns:
        (BMA probabilities over ``samples`` draws, probabilities at the mean weights), each [N, C] float64
        ([N, T, V] for token-level outputs).

    Raises:
        ValueError: ``samples`` or ``batch_size`` not a positive int, no points, non-finite inputs, or outputs
            that are not [N, C] or [N, T, V] logits.
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive int, got {samples!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    n = _check_inputs(x)
    if getattr(opt, "deterministic", False) is True:
        samples = 1  # every draw is the same network
    bma, at_mean, bad_points, bad_logits = [], [], 0, 0
    for start in range(0, n, batch_size):
        xb = take(x, slice(start, start + batch_size))
        logits = predict(model, opt, xb, samples, vectorize=vectorize, generator=generator, output=output)
        if logits.dim() not in (3, 4):
            raise ValueError(
                "a classifier's outputs must be [N, C] logits (or token-level [N, T, V]), got "
                f"{tuple(logits.shape[1:])}"
            )
        mean_logits = predict(model, opt, xb, 0, output=output)
        bad = ~torch.isfinite(torch.cat([logits, mean_logits]))  # [S + 1, B, (T,) C]
        bad_points += int(bad.flatten(2).any(-1).any(0).sum())
        bad_logits += int(bad.sum())
        bma.append(torch.softmax(logits.double(), -1).mean(0))
        at_mean.append(torch.softmax(mean_logits[0].double(), -1))
    if bad_points:
        c = bma[0][0].numel()
        raise ValueError(
            f"the model's outputs are NaN or Inf for {bad_points} of {n} test points ({bad_logits} of "
            f"{n * c * (samples + 1)} logits over {samples} posterior sample(s) and the mean weights): the "
            "model or its posterior produced them (did training diverge? see opt.diagnostics()), so no "
            "metric of them would mean anything"
        )
    return torch.cat(bma), torch.cat(at_mean)


def _check_inputs(x: Any) -> int:
    """The number of test points of ``x`` (a tensor or a Mapping batch), after checking it is usable."""
    if isinstance(x, Mapping):
        tensors = [v for v in x.values() if isinstance(v, Tensor)]
        n = batch_size_of(x) if tensors else 0
    else:
        tensors = [x]
        n = x.shape[0] if isinstance(x, Tensor) and x.dim() > 0 else 0
    if n == 0:
        shape = list(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must be a tensor of at least one test point, shaped [N, ...], got {shape}")
    bad = sum(int((~torch.isfinite(t)).sum()) for t in tensors if t.is_floating_point())
    if bad:
        raise ValueError(f"x holds {bad} NaN or Inf values")
    return n


def token_rows(probs: Tensor, y: Tensor, x: Any = None) -> tuple[Tensor, Tensor]:
    """Token-level probabilities [N, T, V] and labels [N, T] → the rows that count, ([M, V], [M]): labels
    ≠ −100 and, for a Mapping ``x`` with an ``attention_mask``, not padding."""
    if y.shape != probs.shape[:2]:
        raise ValueError(
            f"token-level outputs {list(probs.shape)} need labels shaped [N, T] = {list(probs.shape[:2])}, "
            f"got {list(y.shape)}"
        )
    keep = y != IGNORE_INDEX
    mask = x.get("attention_mask") if isinstance(x, Mapping) else None
    if mask is not None:
        keep &= mask.to(keep.device).bool()
    if not bool(keep.any()):
        raise ValueError("no token counts: every label is -100 or padding")
    return probs[keep], y[keep]


def evaluate_classifier(
    model: nn.Module,
    opt: Any,
    x: Tensor | Mapping[str, Any],
    y: Tensor,
    samples: int = 32,
    *,
    n_bins: int = 15,
    batch_size: int = 1000,
    vectorize: bool = False,
    generator: torch.Generator | None = None,
    output: OutputSelector = None,
) -> ClassifierEvaluation:
    """Metrics of the BMA over ``samples`` posterior draws and of the mean weights (see the module doc);
    per token for token-level outputs.

    Args:
        model: the classifier.
        opt: an ngvi optimizer or baseline (or a wrapper of one, or a :class:`~ngvi.PosteriorSampler`).
        x: the test inputs [N, ...], or a Mapping batch (``model(**x)``).
        y: class indices [N] ([N, T] for token-level outputs, −100 and padding not counted).
        samples: posterior draws S.
        n_bins: the ECE's and the reliability diagram's bins.
        batch_size: points per forward pass.
        vectorize: draw in batched ``torch.func.vmap`` passes (:func:`ngvi.predict`).
        generator: seeds the draws of ``vectorize=True``.
        output: picks the logits of a non-tensor output.

    Returns:
        A :class:`ClassifierEvaluation`.

    Raises:
        ValueError: ``x`` and ``y`` of different lengths, labels that fail
            :func:`ngvi.metrics.check_labels`, or as :func:`predictive_probs`.
    """
    n = _check_inputs(x)
    if n != y.shape[0]:
        raise ValueError(f"x has {n} points but y has {y.shape[0]} labels")
    probs_bma, probs_mean = predictive_probs(
        model, opt, x, samples, batch_size=batch_size, vectorize=vectorize, generator=generator, output=output
    )
    if probs_bma.dim() == 3:
        (probs_bma, _), (probs_mean, y) = token_rows(probs_bma, y, x), token_rows(probs_mean, y, x)
    return ClassifierEvaluation(
        bma=classification_metrics(probs_bma, y, n_bins),
        mean=classification_metrics(probs_mean, y, n_bins),
        probs_bma=probs_bma,
        probs_mean=probs_mean,
        reliability={
            "bma": metrics.reliability(probs_bma, y, n_bins),
            "mean": metrics.reliability(probs_mean, y, n_bins),
        },
        samples=samples,
    )
