r"""Generated toy data (no files needed).

:func:`toy_regression` is the 1-D regression problem of BADAM App. D.1 (after Blundell et al. 2015):

.. math::
    y = x + 0.3\sin(2\pi(x+\epsilon)) + 0.3\sin(4\pi(x+\epsilon)) + \epsilon,
    \qquad \epsilon\sim\mathcal N(0, 0.02^2),

with 200 training inputs drawn uniformly from (0, 0.5) and test inputs spread over (−0.5, 1.2), so the test
set probes both interpolation and extrapolation. The paper writes N(0, 0.02); we read 0.02 as the standard
deviation. Because ε also enters inside the sines, the effective observation noise is larger than 0.02
(the spread of y around the noise-free curve on (0, 0.5) has a standard deviation of about 0.062,
estimated from 10⁵ draws; :data:`TOY_NOISE_STD` is what models of this data assume).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

#: observation-noise standard deviation assumed by models of the toy data (a Monte-Carlo estimate
#: of the spread of y around its noise-free curve on the training range)
TOY_NOISE_STD = 0.062


@dataclass(frozen=True)
class ToyRegression:
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor

    @staticmethod
    def curve(x: Tensor, eps: Tensor | float = 0.0) -> Tensor:
        """The generating function; ``eps = 0`` gives the noise-free curve."""
        return x + 0.3 * torch.sin(2 * math.pi * (x + eps)) + 0.3 * torch.sin(4 * math.pi * (x + eps)) + eps


def toy_regression(
    n_train: int = 200,
    n_test: int = 400,
    noise_std: float = 0.02,
    train_range: tuple[float, float] = (0.0, 0.5),
    test_range: tuple[float, float] = (-0.5, 1.2),
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> ToyRegression:
    """BADAM's toy regression set; tensors are shaped [n, 1]. Test inputs are an even grid (for plots)."""
    if n_train < 1 or n_test < 1:
        raise ValueError(f"n_train and n_test must be positive, got {n_train}, {n_test}")
    if not noise_std >= 0:
        raise ValueError(f"noise_std must be >= 0, got {noise_std}")
    gen = torch.Generator().manual_seed(seed)
    lo, hi = train_range
    x_train = lo + (hi - lo) * torch.rand(n_train, 1, generator=gen, dtype=torch.float64)
    x_test = torch.linspace(*test_range, n_test, dtype=torch.float64).unsqueeze(1)
    y_train = ToyRegression.curve(
        x_train, noise_std * torch.randn(n_train, 1, generator=gen, dtype=torch.float64)
    )
    y_test = ToyRegression.curve(
        x_test, noise_std * torch.randn(n_test, 1, generator=gen, dtype=torch.float64)
    )
    return ToyRegression(*(t.to(dtype) for t in (x_train, y_train, x_test, y_test)))
