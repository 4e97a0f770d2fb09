r"""``ngvi charlm``: do adaptive methods generalise worse than SGD on a character-level language model, and
does VadaGrad's weight noise fix it? (Khan et al. 2018, App. M, Fig. 8, repeating Wilson et al. 2017,
Fig. 2b.)

**Protocol.** A ``--layers``-layer LSTM with ``--hidden`` units (Wilson et al. used torch-rnn's 2 × 128),
an embedding of ``EMBEDDING``, no dropout, trained on non-overlapping chunks of ``SEQ_LENGTH`` characters in
minibatches of ``BATCH_SIZE`` chunks (a fresh permutation each epoch; no hidden state carried across
chunks) to minimise the mean cross-entropy per character. The text is the King James Version (the stand-in
for War and Peace, MANIFEST.md §5), split contiguously: training characters from the start of the first
90%, test characters from the start of the last 10%. Each method's settings: :mod:`.methods`.

**Reported**, after every epoch and at the start, at the mean of q for the variational methods: the test
loss (cross-entropy, nats per character; what Wilson et al. plot) and the test error (the fraction of
test characters whose most probable prediction is wrong).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from ..core import args as types
from ..core import training
from ..core.runner import Experiment, Job, Run
from ..data import load_text
from . import methods
from .model import CharLSTM, Corpus, char_loss, evaluate

METHOD_NAMES = tuple(methods.OPTIONS)
SEQ_LENGTH = 50  # torch-rnn's default (recalled), as Wilson et al.
BATCH_SIZE = 50  # idem
EMBEDDING = 64  # idem (torch-rnn's wordvec_size)
TRAIN_FRACTION = 0.9  # the contiguous split of MANIFEST.md §5
#: the sizes an option sets, with their defaults, and --quick's (a smoke run for CI: seconds on one core)
DEFAULTS = {
    "train_chars": 200_000,
    "test_chars": 50_000,
    "hidden": 128,
    "layers": 2,
    "epochs": 50,
    "seeds": 1,
}
QUICK = {"train_chars": 80_000, "test_chars": 5_000, "hidden": 32, "layers": 1, "epochs": 5, "seeds": 1}
#: --quick's embedding (no option sets it)
QUICK_EMBEDDING = 16


def load_corpus(train_chars: int, test_chars: int, data_dir: str | None) -> Corpus:
    text = load_text("kjv", data_dir)
    cut = int(TRAIN_FRACTION * len(text))
    if train_chars > cut or test_chars > len(text) - cut:
        raise ValueError(
            f"the text has {cut} training and {len(text) - cut} test characters; lower --train-chars or "
            "--test-chars"
        )
    return Corpus.from_text(text[:train_chars], text[cut : cut + test_chars], SEQ_LENGTH)


def train_run(spec: dict[str, Any]) -> dict[str, Any]:
    """One method, one seed: the test curves per epoch (epoch 0: before training)."""
    corpus = load_corpus(spec["train_chars"], spec["test_chars"], spec["data_dir"])
    name, epochs, seed = spec["method"], spec["epochs"], spec["seed"]
    torch.manual_seed(seed)
    model = CharLSTM(len(corpus.vocab), spec["hidden"], spec["layers"], spec["embedding"])
    trainer = methods.build(name, model, corpus.train_chars, seed, spec.get("vadagrad_init_prec"))
    scale = methods.loss_scale(name, corpus.train_chars)
    steps_per_epoch = -(-corpus.x_train.shape[0] // BATCH_SIZE)
    curves: dict[str, list[float]] = {"test_loss": [], "test_error": [], "train_loss": []}

    def test() -> None:
        loss, error = evaluate(model, corpus.x_test, corpus.y_test)
        curves["test_loss"].append(loss)
        curves["test_error"].append(error)

    test()
    start, diverged = time.process_time(), None
    for epoch in range(epochs):
        for group in trainer.param_groups:
            group["lr"] = methods.step_size(name, epoch, epochs)
        try:
            step_losses = training.train(
                model,
                trainer,
                corpus.x_train,
                corpus.y_train,
                lambda output, y: scale * char_loss(output, y),
                epochs=1,
                batch_size=BATCH_SIZE,
                generator=torch.Generator().manual_seed(1000 * seed + epoch),
            )
        except FloatingPointError:  # ngvi.NonFiniteGradientError: the curve ends here
            diverged = epoch + 1
            break
        curves["train_loss"].append(sum(step_losses) / len(step_losses) / scale)
        test()
    return {
        **curves,
        "diverged_in_epoch": diverged,
        "unigram_entropy": corpus.unigram_entropy(),
        "train_seconds": time.process_time() - start,
        "steps_per_epoch": steps_per_epoch,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


class CharLM(Experiment):
    name = "charlm"
    help = "a character-level LSTM trained with SGD, AdaGrad, Adam, VadaGrad, Vadam, IVON (App. M, Fig. 8)"
    examples = (
        "ngvi charlm --quick --jobs 1    # a smoke run in seconds",
        "ngvi charlm --jobs 1    # docs/results/charlm (its defaults; about 30 min on one core)",
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        types.add_subset(parser, "--methods", METHOD_NAMES)
        for flag, what in (
            ("--train-chars", "training characters, from the start of the text"),
            ("--test-chars", "test characters, from the start of the last 10%% of the text"),
            ("--hidden", "LSTM units per layer (Wilson et al.: 128)"),
            ("--layers", "LSTM layers (Wilson et al.: 2)"),
            ("--epochs", "epochs (Wilson et al.: 200); K of Table 4 is scaled by epochs/200"),
            ("--seeds", "seeds per method (initialisation, minibatch order, noise)"),
        ):
            key = flag[2:].replace("-", "_")
            parser.add_argument(
                flag,
                type=types.positive_int,
                default=None,
                help=f"{what} (default {DEFAULTS[key]}; --quick: {QUICK[key]})",
            )
        parser.add_argument(
            "--vadagrad-init-prec",
            type=types.positive_float,
            default=None,
            help="VadaGrad's initial precision s₁ (default 1e4; App. M's 1e-4 makes the first sample's "
            "gradient non-finite)",
        )
        types.add_quick(
            parser,
            "80k training characters, 5k test, 1 layer of 32 (embedding 16), 5 epochs, 1 seed: a smoke run "
            "(options given explicitly win)",
        )
        types.add_data_dir(parser)

    def config(self, args: argparse.Namespace) -> dict[str, Any]:
        config = {
            "methods": list(args.methods),
            **types.with_quick(args, DEFAULTS, QUICK),  # an explicit option wins over --quick
            "embedding": QUICK_EMBEDDING if args.quick else EMBEDDING,
        }
        if args.vadagrad_init_prec is not None:  # only when given: the committed runs' configs still match
            config["vadagrad_init_prec"] = args.vadagrad_init_prec
        return config

    def jobs(self, args: argparse.Namespace, run: Run) -> list[Job]:
        config = self.config(args)
        shared = {k: v for k, v in config.items() if k not in ("methods", "seeds")}
        return [
            Job(f"{name}/seed{seed}", {**shared, "method": name, "seed": seed, "data_dir": args.data_dir})
            for name in config["methods"]
            for seed in range(config["seeds"])
        ]

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        return train_run(spec)

    def report(self, args: argparse.Namespace, run: Run) -> None:
        from .report import write_report

        write_report(self.config(args), run)


EXPERIMENT = CharLM()
