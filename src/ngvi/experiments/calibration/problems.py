r"""The calibration problems: generated data with a known likelihood, not chosen to suit any method.

Each draw (``Problem.data(seed)``) holds a training set, a test set from the same distribution and the
*probes*: the test inputs moved away from the training data, x_c = m + c·(x − m) with m the training
inputs' mean and c ∈ :data:`SCALES` (c = 1 is the test set itself), where a posterior's predictive s.d.
should grow. The 1-D problem also probes the gap between its two clusters of inputs ("in-between"
uncertainty, Foong et al. 2019).

* ``regression_8d``: the issue's problem. x ~ N(0, I₈), y = sin(x·w/2) + ε, w ~ N(0, I₈), ε ~ N(0, 0.3²),
  1,000 training points; an MLP 8-64-64-1 (tanh).
* ``regression_gap``: x uniform on [−2, −0.5] ∪ [0.5, 2], y = sin(2x) + 0.2x² + ε, ε ~ N(0, 0.1²), 300
  training points; an MLP 1-32-32-1 (tanh).
* ``moons``: two interleaved half circles (radius 1, the second shifted by (1, −0.5)), Gaussian input noise
  of s.d. 0.15, 1,000 training points, 2 classes; an MLP 2-32-32-2 (tanh).
* ``gaussian_mixture``: 4 classes in 10-D, class means drawn from N(0, 0.8²·I), unit-variance isotropic
  clusters, 1,000 training points; an MLP 10-64-64-4 (tanh).

The test sets hold 2,000 points each. ``seed`` draws everything (the data, and in the experiment the
initialisation, the minibatch order and the optimizer's noise).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

#: the probes' distances from the training inputs' mean, in multiples of the test inputs' (1: the test set)
SCALES = (1.0, 2.0, 3.0, 4.0)
#: the probe whose s.d. is compared with the test set's ("far" in far/near)
FAR = 3.0
N_TEST = 2000


@dataclass(frozen=True)
class Draw:
    """One draw of a problem: training and test sets, and the probe inputs (name → [n, d])."""

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    probes: dict[str, Tensor]


@dataclass(frozen=True)
class Problem:
    name: str
    task: str  # "regression" or "classification"
    inputs: int
    hidden: int
    outputs: int  # 1 for regression, the number of classes for classification
    n_train: int
    #: the Gaussian likelihood's noise s.d. (regression; None for classification)
    noise_std: float | None
    #: (n, generator) -> (x, y); the task's parameters (weights, class means) come from the generator first
    sample: Callable[[int, torch.Generator], tuple[Tensor, Tensor]]
    description: str
    #: extra probes beside the scaled test inputs: name -> (n, generator) -> x
    extra_probes: tuple[tuple[str, Callable[[int, torch.Generator], Tensor]], ...] = ()

    def net(self) -> nn.Sequential:
        """``inputs``-hidden-hidden-``outputs``, tanh units (initialised from torch's global generator)."""
        return nn.Sequential(
            nn.Linear(self.inputs, self.hidden), nn.Tanh(),
            nn.Linear(self.hidden, self.hidden), nn.Tanh(),
            nn.Linear(self.hidden, self.outputs),
        )  # fmt: skip

    def weights(self) -> int:
        """The number of weights of :meth:`net`."""
        h = self.hidden
        return (self.inputs + 1) * h + (h + 1) * h + (h + 1) * self.outputs

    def data(self, seed: int, n_test: int = N_TEST) -> Draw:
        """The training and test sets and the probes of draw ``seed``."""
        gen = torch.Generator().manual_seed(1000 * seed + sum(map(ord, self.name)))
        x, y = self.sample(self.n_train + n_test, gen)
        x_train, y_train, x_test, y_test = (
            x[: self.n_train],
            y[: self.n_train],
            x[self.n_train :],
            y[self.n_train :],
        )
        centre = x_train.mean(0)
        probes = {f"x{c:g}": centre + c * (x_test - centre) for c in SCALES}
        probes |= {name: make(n_test, gen) for name, make in self.extra_probes}
        return Draw(x_train, y_train, x_test, y_test, probes)


def _regression_8d(n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    w = torch.randn(8, 1, generator=gen)
    x = torch.randn(n, 8, generator=gen)
    return x, torch.sin(x @ w / 2) + 0.3 * torch.randn(n, 1, generator=gen)


GAP = (-0.5, 0.5)


def _regression_gap(n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    side = torch.where(torch.rand(n, 1, generator=gen) < 0.5, -1.0, 1.0)
    x = side * (0.5 + 1.5 * torch.rand(n, 1, generator=gen))
    return x, torch.sin(2 * x) + 0.2 * x**2 + 0.1 * torch.randn(n, 1, generator=gen)


def _gap_inputs(n: int, gen: torch.Generator) -> Tensor:
    """Inputs in the middle of the gap, (−0.3, 0.3)."""
    return -0.3 + 0.6 * torch.rand(n, 1, generator=gen)


def _moons(n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    y = (torch.rand(n, generator=gen) < 0.5).long()
    angle = math.pi * torch.rand(n, generator=gen)
    upper = torch.stack([torch.cos(angle), torch.sin(angle)], 1)
    lower = torch.stack([1 - torch.cos(angle), 0.5 - torch.sin(angle)], 1)
    x = torch.where(y[:, None] == 0, upper, lower)
    return x + 0.15 * torch.randn(n, 2, generator=gen), y


def _gaussian_mixture(n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    means = 0.8 * torch.randn(4, 10, generator=gen)
    y = torch.randint(0, 4, (n,), generator=gen)
    return means[y] + torch.randn(n, 10, generator=gen), y


PROBLEMS: dict[str, Problem] = {
    p.name: p
    for p in (
        Problem(
            "regression_8d", "regression", 8, 64, 1, 1000, 0.3, _regression_8d,
            "8-D, y = sin(x·w/2) + N(0, 0.3²), 1,000 points, MLP 8-64-64-1 (the issue's)",
        ),
        Problem(
            "regression_gap", "regression", 1, 32, 1, 300, 0.1, _regression_gap,
            "1-D with a gap, y = sin(2x) + 0.2x² + N(0, 0.1²), 300 points, MLP 1-32-32-1",
            extra_probes=(("gap", _gap_inputs),),
        ),
        Problem(
            "moons", "classification", 2, 32, 2, 1000, None, _moons,
            "2-D two moons (input noise 0.15), 2 classes, 1,000 points, MLP 2-32-32-2",
        ),
        Problem(
            "gaussian_mixture", "classification", 10, 64, 4, 1000, None, _gaussian_mixture,
            "10-D mixture of 4 unit Gaussians, 4 classes, 1,000 points, MLP 10-64-64-4",
        ),
    )
}  # fmt: skip
