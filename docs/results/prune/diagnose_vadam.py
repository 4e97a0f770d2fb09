"""Why Vadam's |μ|/σ ranks MNIST weights as |μ| does: its precision N·s against the prior λ and the Fisher.

Trains the prune experiment's Vadam (λ = 10³) and, for comparison, Vadam with λ = 1 for ``EPOCHS`` epochs,
then prints quantiles over the weights of
  N·s          Vadam's data term of the precision (s: the EMA of squared *minibatch* gradients ĝ²),
  N·F          the empirical Fisher at the same μ, F = mean over 2,000 training images of the squared
               *per-example* gradients (what VOGN estimates),
  σ            Vadam's posterior standard deviation 1/√(N·s + λ),
and the test accuracy of the mean network. Run from the repository root:
    NGVI_DATA=../shared/data .venv/bin/python docs/results/prune/diagnose_vadam.py
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from ngvi.experiments import prune
from ngvi.experiments.core import training
from ngvi.experiments.core.methods import METHODS
from ngvi.experiments.data.mnist import load_mnist

EPOCHS = 2
N = prune.DATA_SIZE
Q = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)


def quantiles(tensors) -> list[float]:
    flat = torch.cat([t.reshape(-1) for t in tensors]).double()
    return [float(f"{v:.3g}") for v in torch.quantile(flat[torch.randperm(flat.numel())[:1_000_000]], Q)]


def empirical_fisher(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    model.eval()  # dropout off: the Fisher of the mean network
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        return nn.functional.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    total = {k: torch.zeros_like(v) for k, v in params.items()}
    for xb, yb in zip(x.split(100), y.split(100), strict=True):
        for k, g in vmap(grad(loss), in_dims=(None, 0, 0))(params, xb, yb).items():
            total[k] += g.square().sum(0)
    return [t / len(x) for t in total.values()]


def main() -> None:
    torch.set_num_threads(1)
    x, y = load_mnist("train", flatten=True, normalize="unit")
    x_test, y_test = load_mnist("test", flatten=True, normalize="unit")
    for prior_prec in (1e3, 1.0):
        torch.manual_seed(0)
        model = prune.network(0.2)
        opt = METHODS["vadam"].build(model, N, seed=0, **{**prune.OPTIONS["vadam"], "prior_prec": prior_prec})
        training.train(model, opt, x, y, nn.functional.cross_entropy, epochs=EPOCHS, batch_size=128,
                       generator=torch.Generator().manual_seed(0))  # fmt: skip
        s = [opt.state[p]["exp_avg_sq"] for p in model.parameters()]
        fisher = empirical_fisher(model, x[:2000], y[:2000])
        accuracy = prune.accuracy(model, x_test, y_test)
        print(
            f"λ = {prior_prec:g}: test accuracy {accuracy:.4f}; quantiles 10/50/90%: "
            f"N·s {quantiles([N * t for t in s])}, N·F {quantiles([N * f for f in fisher])}, "
            f"σ {quantiles(opt.posterior().std)}"
        )


if __name__ == "__main__":
    main()
