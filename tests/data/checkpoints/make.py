"""Write the checkpoints of ``tests/optim/test_old_checkpoints.py``: an optimizer and its model saved by an
older ngvi, with the parameters that ngvi reached three steps after the save.

Run it with the older checkout's package first on the path, e.g. for ``pre_flat.pt`` (main before the flat
buffers, 1546982)::

    mkdir -p ../ngvi-1546982 && git archive 1546982 src | tar -x -C ../ngvi-1546982
    PYTHONPATH=../ngvi-1546982/src python tests/data/checkpoints/make.py tests/data/checkpoints/pre_flat.pt
"""

from __future__ import annotations

import copy
import sys

import torch
from torch import nn

import ngvi

#: rule → options; Vprop's antithetic default is saved mid-pair (three draws), IVON keeps ε for its ĥ
RULES = {"Vadam": {}, "Vprop": {}, "IVON": {}, "VON": {"lr": 0.01}, "NoisyAdam": {}, "BAdam": {}}


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1)).double()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(16, 3, generator=gen, dtype=torch.float64)
    return x, torch.sin(x.sum(1, keepdim=True))


def train(net: nn.Module, opt, steps: int) -> None:
    x, y = batch()

    def closure():
        opt.zero_grad()
        loss = 0.5 * (net(x) - y).square().mean()
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)


def main(path: str) -> None:
    out = {"version": ngvi.__version__}
    for name, options in RULES.items():
        net = model()
        opt = getattr(ngvi, name)(net.parameters(), data_size=64, seed=5, **options)
        train(net, opt, 3)
        out[name] = {
            "model": {k: v.clone() for k, v in net.state_dict().items()},
            "optimizer": copy.deepcopy(opt.state_dict()),  # not the live state tensors
        }
        train(net, opt, 3)
        out[name]["continued"] = [p.detach().clone() for p in net.parameters()]
    torch.save(out, path)


if __name__ == "__main__":
    main(sys.argv[1])
