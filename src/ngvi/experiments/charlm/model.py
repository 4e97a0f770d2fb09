"""The character-level language model and its data: a vocabulary, fixed-length chunks, an LSTM, and the
per-character test loss and error rate."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Corpus:
    """A text cut into ``seq_length + 1``-character chunks (inputs and next-character targets), each split
    contiguous: training chunks from ``train``, test chunks from ``test``."""

    vocab: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor

    @classmethod
    def from_text(cls, train: str, test: str, seq_length: int) -> Corpus:
        vocab = "".join(sorted(set(train) | set(test)))
        return cls(vocab, *chunks(train, vocab, seq_length), *chunks(test, vocab, seq_length))

    @property
    def train_chars(self) -> int:
        return self.y_train.numel()

    def unigram_entropy(self) -> float:
        """The test loss of the best context-free model fitted to the training characters, in nats:
        −Σ_c p_test(c) log p_train(c) (add-one smoothed); a language model must beat it."""
        size = len(self.vocab)
        p_train = (torch.bincount(self.y_train.flatten(), minlength=size) + 1.0) / (self.train_chars + size)
        p_test = torch.bincount(self.y_test.flatten(), minlength=size) / self.y_test.numel()
        return float(-(p_test * p_train.log()).sum())


def chunks(text: str, vocab: str, seq_length: int) -> tuple[Tensor, Tensor]:
    """``(x, y)`` of shape ``[len(text) // (seq_length + 1), seq_length]``: consecutive non-overlapping
    chunks, ``y`` the character after each of ``x``'s (the rest of the text is dropped)."""
    index = {c: i for i, c in enumerate(vocab)}
    codes = torch.tensor([index[c] for c in text], dtype=torch.long)
    rows = len(codes) // (seq_length + 1)
    if rows < 1:
        raise ValueError(f"a text of {len(codes)} characters holds no chunk of {seq_length + 1}")
    table = codes[: rows * (seq_length + 1)].view(rows, seq_length + 1)
    return table[:, :-1].contiguous(), table[:, 1:].contiguous()


class CharLSTM(nn.Module):
    """Embedding → ``layers``-layer LSTM (dropout between layers and before the read-out) → Linear, the
    torch-rnn layout; the logits are ``[batch, time, vocab]``."""

    def __init__(self, vocab: int, hidden: int, layers: int, embedding: int, dropout: float = 0.0):
        super().__init__()
        self.embed = nn.Embedding(vocab, embedding)
        self.lstm = nn.LSTM(embedding, hidden, layers, batch_first=True, dropout=dropout if layers > 1 else 0)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x: Tensor) -> Tensor:
        h, _ = self.lstm(self.embed(x))
        return self.out(self.drop(h))


def char_loss(logits: Tensor, y: Tensor) -> Tensor:
    """The mean cross-entropy per character, in nats."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


@torch.no_grad()
def evaluate(model: nn.Module, x: Tensor, y: Tensor, batch_size: int = 500) -> tuple[float, float]:
    """(mean cross-entropy in nats per character, error rate of the most probable next character) of
    ``model`` as it stands (eval mode: no dropout), over all chunks."""
    was_training = model.training
    model.eval()
    loss, wrong = 0.0, 0
    for xb, yb in zip(x.split(batch_size), y.split(batch_size), strict=True):
        logits = model(xb)
        loss += float(nn.functional.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="sum"))
        wrong += int((logits.argmax(-1) != yb).sum())
    model.train(was_training)
    n = y.numel()
    if not math.isfinite(loss):
        return math.inf, wrong / n
    return loss / n, wrong / n
