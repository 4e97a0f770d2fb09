r"""The uncertainty section of a model card: :func:`uncertainty_report` writes ``report.md`` and a reliability
diagram ``reliability.png`` for a trained posterior on held-out data.

The predictive is the Bayesian model average of ``samples`` posterior draws (:func:`ngvi.predict`), and every
number is one of :mod:`ngvi.metrics` on it:

* **classification**: accuracy, NLL −(1/N) Σ log p̄(yₙ|xₙ) with p̄ = (1/S) Σₛ softmax(fₛ), ECE over ``n_bins``
  equal-width confidence bins, Brier score; the diagram is accuracy against confidence per bin, with the
  number of points per bin below. Token-level outputs ([N, T, V] logits of a language model, a Mapping
  batch with ``labels``) count each token whose label is not −100 and that is not padding
  (:func:`ngvi.evaluation.token_rows`).
* **regression** (a Gaussian likelihood of noise s.d. ``noise_std``): RMSE of the predictive mean, NLL of
  the mixture (1/S) Σₛ N(fₛ(x), σ²), the coverage of the central 95% predictive interval and the
  calibration error of the central intervals, (1/L) Σ_p |observed(p) − p| over levels p = 0.05, 0.10, …,
  0.95 (Kuleshov et al. 2018). Both use the mixture's CDF at y, u = (1/S) Σₛ Φ((y − fₛ)/σ) (the PIT): y lies
  in the central p-interval exactly when |u − ½| ≤ p/2, so no quantile of the mixture is approximated. The
  diagram is observed against nominal coverage, with the PIT histogram below (flat when calibrated).
* **out-of-distribution** data (``ood``): AUROC of telling OOD inputs (positives) from the test inputs by the
  predictive entropy (classification; for token-level outputs its mean over a sequence's counted tokens)
  or the predictive s.d. (regression; mean over output dimensions), by the rank statistic
  :func:`ngvi.metrics.auroc` (0.5 is chance).

``data``: ``(x, y)`` with x a tensor or a Mapping batch (``model(**x)``), a Mapping batch holding its
``labels``, or an iterable of either (a DataLoader). ``ood``: inputs only, in the same forms (labels are
ignored). With ``vectorize=True`` the draws come from ``generator`` (reproducible); otherwise from the
optimizer's own noise, as in :func:`ngvi.predict`.

matplotlib is imported inside (``Figure`` and its Agg canvas, no pyplot and no global backend change).
"""

from __future__ import annotations

import html
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from . import metrics
from ._version import __version__
from .evaluation import classification_metrics, token_rows
from .posterior._format import is_rule_name
from .predict import OutputSelector, batch_size_of, predict, take
from .protocol import unwrap

__all__ = ["UncertaintyReport", "coverage_curve", "pit", "uncertainty_report"]

#: the nominal levels of the regression calibration curve
LEVELS = tuple(round(0.05 * k, 2) for k in range(1, 20))


@dataclass
class UncertaintyReport:
    """What :func:`uncertainty_report` computed and wrote: ``metrics`` (floats, keys as in the table),
    ``markdown`` and ``figure`` (the paths), ``curve`` (the diagram's data)."""

    metrics: dict[str, float]
    markdown: Path
    figure: Path
    curve: dict[str, Tensor]


def pit(samples: Tensor, y: Tensor, noise_std: float) -> Tensor:
    """u = (1/S) Σₛ Φ((y − fₛ)/σ): the predictive mixture's CDF at each target value, flattened [N·D].

    Args:
        samples: the outputs under S draws, [S, N, ...] (as :func:`ngvi.predict` gives).
        y: the targets, [N, ...].
        noise_std: σ, the Gaussian likelihood's noise s.d.

    Returns:
        The PIT values u, float64 [N·D]; calibrated predictions give uniform u.
    """
    f = samples.reshape(samples.shape[0], y.shape[0], -1).double()
    z = (y.reshape(1, y.shape[0], -1).double() - f) / noise_std
    return torch.special.ndtr(z).mean(0).reshape(-1)


def coverage_curve(u: Tensor, levels: Iterable[float] = LEVELS) -> Tensor:
    """Observed coverage of the central p-intervals for each level p, from PIT values u.

    Args:
        u: PIT values (:func:`pit`).
        levels: the nominal levels p in (0, 1].

    Returns:
        float64 [len(levels)]: the fraction of u with |u − ½| ≤ p/2, for each p.
    """
    return torch.tensor(
        [float(((u - 0.5).abs() <= p / 2).double().mean()) for p in levels], dtype=torch.float64
    )


# -- data in its forms -------------------------------------------------------------------------------------
def _split(item: Any, need_labels: bool) -> tuple[Any, Tensor | None]:
    if isinstance(item, Mapping):
        if "labels" in item:
            return {k: v for k, v in item.items() if k != "labels"}, item["labels"]
        if need_labels:
            raise ValueError("a Mapping batch of data needs its labels under 'labels'")
        return item, None
    if isinstance(item, list | tuple) and len(item) == 2 and isinstance(item[1], Tensor):
        return item[0], item[1]
    if isinstance(item, Tensor) and not need_labels:
        return item, None
    raise TypeError(
        "data must be (x, y), a Mapping batch with 'labels', or an iterable of them (a DataLoader); ood "
        f"may also be inputs alone; got {type(item).__name__}"
    )


def _batches(
    data: Any, need_labels: bool, batch_size: int, name: str = "data"
) -> list[tuple[Any, Tensor | None]]:
    """``data`` as (x, y) batches of at most ``batch_size`` rows, after checking it: a label (row of y) per
    input, finite floating inputs and targets, at least one point. ``name``: the argument, for messages."""
    single = isinstance(data, Mapping | Tensor) or (
        isinstance(data, list | tuple) and len(data) == 2 and isinstance(data[1], Tensor)
        and isinstance(data[0], Tensor | Mapping)
    )  # fmt: skip
    items = [data] if single else list(data)
    if not items:
        raise ValueError(f"{name} holds no batch")
    out = []
    for i, item in enumerate(items):
        x, y = _split(item, need_labels)
        n = batch_size_of(x)
        where = f"{name} (batch {i})" if len(items) > 1 else name
        if y is not None and (y.dim() == 0 or y.shape[0] != n):
            rows = "a scalar" if y.dim() == 0 else f"{y.shape[0]} rows"
            raise ValueError(
                f"{where}: {n} inputs but y has {rows}: x and y differ in size; give one label or target "
                "(row of y) per input"
            )
        inputs = x.values() if isinstance(x, Mapping) else [x]
        bad = sum(
            int((~torch.isfinite(t)).sum()) for t in inputs if isinstance(t, Tensor) and t.is_floating_point()
        )
        if bad:
            raise ValueError(f"{where}: the inputs hold {bad} NaN or inf values; remove or impute them")
        if y is not None and y.is_floating_point() and not bool(torch.isfinite(y).all()):
            bad = int((~torch.isfinite(y)).sum())
            raise ValueError(f"{where}: y holds {bad} NaN or inf values; remove those points")
        for start in range(0, n, batch_size):
            part = slice(start, start + batch_size)
            out.append((take(x, part), None if y is None else y[part]))
    if not out:
        raise ValueError(f"{name} holds no points (every batch is empty)")
    return out


# -- the predictive --------------------------------------------------------------------------------------
def _token_scores(probs: Tensor, x: Any) -> Tensor:
    """Predictive entropy per point; for token-level [B, T, V] its mean over a sequence's counted tokens."""
    h = metrics.predictive_entropy(probs)
    if h.dim() == 1:
        return h
    mask = x.get("attention_mask") if isinstance(x, Mapping) else None
    w = torch.ones_like(h) if mask is None else mask.to(h.device).double()
    return (h * w).sum(-1) / w.sum(-1).clamp_min(1.0)


def uncertainty_report(
    model: nn.Module,
    opt: Any,
    data: Any,
    ood: Any = None,
    out: str | os.PathLike[str] = "uncertainty",
    task: str = "classification",
    *,
    samples: int = 32,
    noise_std: float | None = None,
    n_bins: int = 15,
    batch_size: int = 1000,
    vectorize: bool = False,
    generator: torch.Generator | None = None,
    output: OutputSelector = None,
    title: str = "Uncertainty",
) -> UncertaintyReport:
    """Write ``out/report.md`` and ``out/reliability.png`` (see the module docstring) and return the numbers.

    Args:
        model: the network.
        opt: the trainer or posterior to sample: an ngvi optimizer or baseline, a wrapper of one, or a
            :class:`~ngvi.PosteriorSampler` for a loaded posterior.
        data: the held-out data: ``(x, y)``, a Mapping batch with ``labels``, or an iterable of either (a
            DataLoader); per-token logits count the tokens whose label is not −100 or padding.
        ood: out-of-distribution inputs (same forms, labels not needed): adds the OOD AUROC of the predictive
            entropy (classification) or s.d. (regression).
        out: the folder to write.
        task: ``"classification"`` (logits [N, C] or token-level [N, T, V]) or ``"regression"`` (outputs
            shaped like y).
        samples: posterior draws per batch (1 for a point estimate).
        noise_std: the Gaussian likelihood's noise s.d., required for regression.
        n_bins: reliability bins (classification).
        batch_size: points per forward pass when ``data`` is one batch.
        vectorize: draw in batched ``torch.func.vmap`` passes (:func:`ngvi.predict`).
        generator: seeds the draws of ``vectorize=True``.
        output: picks the tensor of a non-tensor output (:func:`ngvi.predict`).
        title: the report's heading.

    Returns:
        An :class:`UncertaintyReport`: the metrics, the paths of the two files and the reliability curve.

    Raises:
        ValueError: an unknown ``task``, regression without a positive ``noise_std``, ``samples`` not a
            positive int, or data in none of the forms above; refused before anything is written, in one
            line naming the argument: data with no points, a batch whose y has another number of rows than
            its inputs, NaN or inf inputs (``data`` or ``ood``) or targets, and ``samples``, ``batch_size``
            or ``n_bins`` that are not positive ints. A rule named by a loaded posterior reaches the card only
            as a class name; anything else is escaped.
        ModuleNotFoundError: matplotlib (the ``artefacts`` extra) is not installed.
    """
    if task not in ("classification", "regression"):
        raise ValueError(f"task must be 'classification' or 'regression', got {task!r}")
    if task == "regression" and not (isinstance(noise_std, int | float) and noise_std > 0):
        raise ValueError(
            f"task='regression' needs noise_std=, the Gaussian likelihood's noise s.d. > 0, got {noise_std}"
        )
    for key, value in (("samples", samples), ("batch_size", batch_size), ("n_bins", n_bins)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive int, got {value!r}")
    if getattr(opt, "deterministic", False) is True:
        samples = 1  # a point estimate: every draw is the same network

    def draws(x: Any) -> Tensor:
        return predict(model, opt, x, samples, vectorize=vectorize, generator=generator, output=output)

    batches = _batches(data, True, batch_size, "data")
    ood_batches = None if ood is None else _batches(ood, False, batch_size, "ood")
    if task == "classification":
        numbers, curve, in_scores, ood_scores = _classification(batches, ood_batches, draws, n_bins)
    else:
        assert noise_std is not None  # checked above
        numbers, curve, in_scores, ood_scores = _regression(batches, ood_batches, draws, float(noise_std))
    if ood_scores is not None:
        labels = torch.cat([torch.zeros(in_scores.numel()), torch.ones(ood_scores.numel())])
        numbers["ood_auroc"] = metrics.auroc(torch.cat([in_scores, ood_scores]), labels)
        numbers["ood_points"] = float(ood_scores.numel())
    numbers["samples"] = float(samples)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    figure = folder / "reliability.png"
    _plot(figure, task, curve, numbers)
    markdown = folder / "report.md"
    markdown.write_text(_markdown(title, task, numbers, _describe(opt), noise_std, n_bins))
    return UncertaintyReport(numbers, markdown, figure, curve)


def _classification(batches, ood_batches, draws, n_bins):
    probs, labels, scores, token_level = [], [], [], False
    for x, y in batches:
        p = torch.softmax(draws(x).double(), -1).mean(0)
        if p.dim() == 3:
            token_level = True
            rows, ys = token_rows(p, y, x)
            probs.append(rows)
            labels.append(ys)
        elif p.dim() == 2:
            probs.append(p)
            labels.append(y)
        else:
            raise ValueError(
                f"a classifier's outputs must be [N, C] or [N, T, V] logits, got {list(p.shape)}"
            )
        scores.append(_token_scores(p, x))
    p, y = torch.cat(probs), torch.cat(labels)
    numbers = classification_metrics(p, y, n_bins)
    numbers["points"] = float(y.numel())
    numbers["token_level"] = float(token_level)
    curve = metrics.reliability(p, y, n_bins)
    ood_scores = None
    if ood_batches is not None:
        ood_scores = torch.cat(
            [_token_scores(torch.softmax(draws(x).double(), -1).mean(0), x) for x, _ in ood_batches]
        )
    return numbers, curve, torch.cat(scores), ood_scores


def _regression(batches, ood_batches, draws, noise_std):
    f = [draws(x) for x, _ in batches]
    if any(fb.dim() < 2 for fb in f):
        raise ValueError("a regression model's outputs must be shaped [N, ...]")
    samples = torch.cat(f, dim=1)
    y = torch.cat([yb for _, yb in batches])
    if samples[0].numel() != y.numel():
        raise ValueError(f"the outputs {list(samples.shape[1:])} and y {list(y.shape)} differ in size")
    u = pit(samples, y, noise_std)
    observed = coverage_curve(u)
    levels = torch.tensor(LEVELS, dtype=torch.float64)

    def predictive_std(fs: Tensor) -> Tensor:
        flat = fs.reshape(fs.shape[0], fs.shape[1], -1).double()
        return (flat.var(0, unbiased=False) + noise_std**2).sqrt().mean(-1)

    numbers = {
        "rmse": metrics.rmse(samples.double().mean(0), y),
        "nll": -metrics.gaussian_log_likelihood(samples, y, 1.0 / noise_std**2),
        "coverage_95": float(((u - 0.5).abs() <= 0.475).double().mean()),
        "calibration_error": float((observed - levels).abs().mean()),
        "mean_predictive_std": float(predictive_std(samples).mean()),
        "points": float(y.shape[0]),
    }
    ood_scores = (
        None if ood_batches is None else torch.cat([predictive_std(draws(x)) for x, _ in ood_batches])
    )
    return numbers, {"level": levels, "observed": observed, "pit": u}, predictive_std(samples), ood_scores


# -- writing ---------------------------------------------------------------------------------------------
def _describe(opt: Any) -> str:
    try:
        inner = unwrap(opt)
    except TypeError:
        inner = opt
    rule = type(inner).__name__
    try:
        post = inner.posterior()
    except (NotImplementedError, AttributeError):
        return f"`{rule}`"
    rule = getattr(post, "rule", None) or rule  # a loaded posterior's: text from a file
    return f"{_code(rule)} ({type(post).__name__} over {post.numel():,} weights)"


def _code(text: Any) -> str:
    """``text`` as an inline code span when it is a class name (the rule as ngvi records it), otherwise as
    escaped plain text: no HTML, link, image, table cell or line break of it reaches the card."""
    text = str(text)
    if is_rule_name(text):
        return f"`{text}`"
    flat = " ".join(text.split())[:100]  # newlines and other whitespace: one space (no forged rows)
    escaped = html.escape(flat, quote=True)  # no raw HTML
    return "an unchecked name, " + "".join(f"\\{c}" if c in _MARKDOWN else c for c in escaped)


#: the characters that carry markdown syntax (links, images, emphasis, tables, code), escaped by a backslash
_MARKDOWN = frozenset("\\`*_{}[]()#+-.!|~<>")


def _markdown(
    title: str, task: str, m: dict[str, Any], describe: str, noise_std: float | None, n_bins: int
) -> str:
    unit = "tokens" if m.get("token_level") else "points"
    lines = [
        f"## {title}",
        "",
        f"Posterior: {describe}. Predictive: the average over {int(m['samples'])} posterior samples, "
        f"evaluated on {int(m['points']):,} {unit} of the data given.",
        "",
        "| metric | value | what it measures |",
        "|---|---|---|",
    ]
    if task == "classification":
        lines += [
            f"| accuracy | {m['accuracy']:.4f} | fraction whose most probable class is the label |",
            f"| NLL | {m['nll']:.4f} nats | −mean log p(y \\| x) of the predictive (lower is better) |",
            f"| ECE | {m['ece']:.4f} | expected calibration error, {n_bins} equal-width confidence bins |",
            f"| Brier | {m['brier']:.4f} | mean Σ_c (p_c − 1[y = c])² |",
        ]
        score = "predictive entropy"
    else:
        lines += [
            f"| RMSE | {m['rmse']:.4g} | of the predictive mean |",
            f"| NLL | {m['nll']:.4f} nats | −mean log p(y \\| x), Gaussian noise s.d. {noise_std:g} |",
            f"| 95% coverage | {m['coverage_95']:.4f} | share of y in the central 95% predictive interval |",
            f"| calibration error | {m['calibration_error']:.4f} | mean \\|observed − nominal\\| coverage, "
            "central intervals at 5%, 10%, …, 95% |",
            f"| mean predictive s.d. | {m['mean_predictive_std']:.4g} | sharpness (noise included) |",
        ]
        score = "predictive s.d."
    if "ood_auroc" in m:
        lines.append(
            f"| OOD AUROC | {m['ood_auroc']:.4f} | {score} telling {int(m['ood_points']):,} "
            "out-of-distribution inputs from the test inputs (0.5 is chance) |"
        )
    lines += [
        "",
        "![Reliability diagram](reliability.png)",
        "",
        (
            "The bars are each confidence bin's accuracy: on the diagonal the model is calibrated, below it "
            "overconfident. Below: how many predictions fall in each bin."
            if task == "classification"
            else "The curve is the observed coverage of each central predictive interval: on the diagonal "
            "the bands are calibrated, below it too narrow. Below: the PIT histogram (flat when calibrated)."
        ),
        "",
        f"_Written by `ngvi.uncertainty_report` (ngvi {__version__})._",
        "",
    ]
    return "\n".join(lines)


def _plot(path: Path, task: str, curve: dict[str, Tensor], m: dict[str, float]) -> None:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            'the reliability diagram needs matplotlib: pip install matplotlib (or "ngvi[artefacts]")'
        ) from None
    fig = Figure(figsize=(5.0, 6.4), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=task == "classification", height_ratios=[3, 1])
    top.plot([0, 1], [0, 1], ls="--", color="0.5", lw=1, label="perfectly calibrated")
    if task == "classification":
        count = curve["count"].numpy()
        bins = len(count)
        centres = (torch.arange(bins, dtype=torch.float64) + 0.5).numpy() / bins
        used = count > 0
        top.bar(centres[used], curve["accuracy"].numpy()[used], width=1 / bins, edgecolor="k", lw=0.5,
                color="tab:blue", alpha=0.8, label="accuracy in bin")  # fmt: skip
        top.plot(curve["confidence"].numpy()[used], curve["accuracy"].numpy()[used], "o", ms=3, color="k",
                 label="(mean confidence, accuracy)")  # fmt: skip
        top.set_ylabel("accuracy")
        top.set_title(f"Reliability: ECE {m['ece']:.3f}, accuracy {m['accuracy']:.3f}")
        bottom.bar(centres, count, width=1 / bins, color="0.6", edgecolor="k", lw=0.5)
        bottom.set_ylabel("predictions")
        bottom.set_xlabel("confidence (probability of the predicted class)")
    else:
        top.plot(curve["level"].numpy(), curve["observed"].numpy(), "o-", color="tab:blue", ms=4,
                 label="observed")  # fmt: skip
        top.set_ylabel("observed coverage")
        top.set_title(f"Calibration: 95% coverage {m['coverage_95']:.3f}, NLL {m['nll']:.3f}")
        bottom.hist(curve["pit"].numpy(), bins=20, range=(0, 1), color="0.6", edgecolor="k", lw=0.5)
        bottom.set_ylabel("targets")
        bottom.set_xlabel("PIT: predictive CDF at the target")
        bottom.set_xlim(0, 1)
        top.set_xlabel("nominal coverage of the central predictive interval")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    fig.legend(
        *top.get_legend_handles_labels(), loc="outside upper center", ncols=2, fontsize=8, frameon=False
    )
    top.grid(alpha=0.3)
    fig.savefig(path, dpi=120)
