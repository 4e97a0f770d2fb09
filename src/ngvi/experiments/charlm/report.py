"""``ngvi charlm``'s table (ours beside the paper's finding) and figure (test curves per epoch)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.report import figure, fmt_mean_se, markdown_table, mean_se, save_figure
from ..core.runner import Run
from . import methods

COLORS = {
    "sgd": "black",
    "adagrad": "tab:orange",
    "adam": "tab:blue",
    "vadagrad": "tab:red",
    "vadam": "tab:purple",
    "ivon": "tab:green",
}
#: App. M (Fig. 8) reports no numbers, only this reading of its figure
PAPER_FINDING = {
    "sgd": "best, with VadaGrad",
    "adagrad": "worse than SGD",
    "adam": "worse than SGD",
    "vadagrad": "as SGD",
    "vadam": "(not in the paper)",
    "ivon": "(not in the paper)",
}


def _curves(runs: dict[str, Any], name: str, seeds: int, metric: str) -> list[list[float]]:
    return [runs[f"{name}/seed{k}"][metric] for k in range(seeds)]


def _cell(values: list[float]) -> str:
    mean, se, n = mean_se(values)
    return fmt_mean_se(mean, se) if n > 1 else f"{mean:.3f}"


def table(config: dict[str, Any], runs: dict[str, Any]) -> str:
    seeds, rows = config["seeds"], []
    for name in config["methods"]:
        loss = _curves(runs, name, seeds, "test_loss")
        error = _curves(runs, name, seeds, "test_error")
        train = _curves(runs, name, seeds, "train_loss")
        best = [int(np.argmin(c)) for c in loss]
        diverged = [runs[f"{name}/seed{k}"]["diverged_in_epoch"] for k in range(seeds)]
        rows.append(
            [
                methods.OPTIONS[name].label,
                _cell([c[-1] for c in loss]),
                _cell([c[-1] for c in error]),
                _cell([min(c) for c in loss]) + f" (epoch {', '.join(map(str, best))})",
                _cell([c[-1] for c in train]),
                PAPER_FINDING[name],
                ", ".join(f"epoch {d}" for d in diverged if d) or "—",
            ]
        )
    header = [
        "method",
        "final test loss [nats/char]",
        "final test error",
        "best test loss (at epoch)",
        "final train loss",
        "App. M, Fig. 8",
        "diverged",
    ]
    first = runs[f"{config['methods'][0]}/seed0"]
    return (
        "# ngvi charlm: character-level LSTM language model (Khan et al. 2018, App. M, Fig. 8; "
        "Wilson et al. 2017, Fig. 2b)\n\n"
        f"KJV text (stand-in for War and Peace): {config['train_chars']} training and {config['test_chars']} "
        f"test characters; LSTM {config['layers']} × {config['hidden']} ({first['parameters']} parameters), "
        f"{config['epochs']} epochs, {config['seeds']} seed(s) (mean ± s.e. over seeds). Test loss: "
        "cross-entropy per character at the mean; test error: the fraction of wrong most-probable "
        f"next characters. The unigram entropy of the test slice is {first['unigram_entropy']:.3f} nats. "
        "Figure: `charlm.png`.\n\n" + markdown_table(header, rows)
    )


PANELS = (
    ("test_loss", "test loss [nats per character]", "test loss (the metric of Wilson et al.'s Fig. 2b)"),
    ("test_error", "test error (wrong next character)", "test error (App. M's Fig. 8 says 'test error')"),
)


def plot(config: dict[str, Any], runs: dict[str, Any], path: Any) -> None:
    fig, axes = figure(2, cols=2, size=(5.6, 4.2))
    for ax, (metric, ylabel, title) in zip(axes, PANELS, strict=True):
        finals, lowest = [], []
        for name in config["methods"]:
            curves = _curves(runs, name, config["seeds"], metric)
            length = min(len(c) for c in curves)
            values = np.array([c[:length] for c in curves])
            epochs = np.arange(length)
            ax.plot(epochs, values.mean(0), color=COLORS[name], lw=1.6, label=methods.OPTIONS[name].label)
            if len(values) > 1:
                ax.fill_between(epochs, values.min(0), values.max(0), color=COLORS[name], alpha=0.15, lw=0)
            finals.append(values.mean(0)[-1])
            lowest.append(values.mean(0).min())
        if all(np.isfinite(finals)):  # zoom on the end, where the methods part (and every curve's minimum)
            low, high = min(lowest), max(finals)
            top = high + 1.5 * (high - low) + 0.1
            ax.set_ylim(low - 0.1 * (high - low) - 0.02, min(top, 1.0) if metric == "test_error" else top)
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"Fig. 8 on the KJV: LSTM {config['layers']} × {config['hidden']}, {config['train_chars']} training "
        f"characters, {config['seeds']} seed(s) (at the mean of q)",
        fontsize=10,
    )
    save_figure(fig, path, legend_from=axes[0], dpi=110)


def write_report(config: dict[str, Any], run: Run) -> None:
    runs = run.results["runs"]
    text = table(config, runs)
    (run.out / "table.md").write_text(text)
    plot(config, runs, run.out / "charlm.png")
    print(text)
    print(f"wrote {run.out / 'table.md'}, {run.out / 'charlm.png'} and {run.out / 'results.json'}")
