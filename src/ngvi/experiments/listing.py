"""``ngvi list``: the optimizers, baselines, benchmark methods and data sets available."""

from __future__ import annotations

import argparse

import ngvi
from ngvi.experiments.data import UCI_DATASETS

OPTIMIZERS = {
    "Vadam": "Adam with weight perturbation (Khan et al. 2018)",
    "Vprop": "RMSprop with weight perturbation (Khan et al. 2018)",
    "VadaGrad": "variational optimisation with an AdaGrad-like rule (Khan et al. 2018, App. F)",
    "VON": "variational online-Newton, Price or Hutchinson Hessian (Khan et al. 2018)",
    "VOGN": "variational online Gauss-Newton with per-example gradients (Khan et al. 2018)",
    "IVON": "improved variational online-Newton (Shen et al. 2024)",
    "NoisyAdam": "noisy Adam, fully factorised NNG (Zhang et al. 2018)",
    "NoisyKFAC": "noisy K-FAC, matrix-variate Gaussian (Zhang et al. 2018)",
    "BAdam": "Adam read as a Laplace posterior (BADAM)",
}
BASELINES = {
    "BBVI": "Bayes by Backprop with local reparameterisation (Blundell et al. 2015)",
    "MCDropout": "MC dropout (Gal & Ghahramani 2016)",
    "MAP": "Adam with weight decay from the prior",
}
OTHER_DATA = {
    "toy regression": "BADAM App. D.1, generated (ngvi.experiments.data.toy_regression)",
    "australian_scale, breast_cancer_scale": "LIBSVM binary classification (data.load_libsvm)",
    "mnist": "MNIST digits (ngvi.experiments.data.load_mnist)",
    "usps": "USPS digits, 3-vs-5 task (ngvi.experiments.data.load_usps_3vs5)",
    "mushroom, statlog shuttle, adult": "contextual bandits (ngvi.experiments.data.load_bandit)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def _mark(owner, name: str) -> str:
    return "" if hasattr(owner, name) else "  [not in this build]"


def main(args: argparse.Namespace) -> None:
    from .uci.methods import METHODS

    print("Optimizers (ngvi.<name>):")
    for name, text in OPTIMIZERS.items():
        print(f"  {name:10s} {text}{_mark(ngvi, name)}")
    print("\nBaselines (ngvi.baselines.<name>):")
    for name, text in BASELINES.items():
        print(f"  {name:10s} {text}{_mark(ngvi.baselines, name)}")
    print("\nMethods of `ngvi uci --methods`:")
    for name, m in METHODS.items():
        print(f"  {name:12s} {m.label}{'' if m.available() else '  [not in this build]'}")
    print("\nUCI regression sets of `ngvi uci --datasets` (N, D, splits):")
    for name, (n, d, splits) in UCI_DATASETS.items():
        print(f"  {name:28s} {n:6d} {d:3d} {splits:3d}")
    print("\nOther data sets:")
    for name, text in OTHER_DATA.items():
        print(f"  {name:38s} {text}")
