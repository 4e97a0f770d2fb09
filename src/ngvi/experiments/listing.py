"""``ngvi list``: the optimizers, baselines and data sets available."""

from __future__ import annotations

import argparse

import ngvi

OPTIMIZERS = {
    "Vadam": "Adam with weight perturbation (Khan et al. 2018)",
    "Vprop": "RMSprop with weight perturbation (Khan et al. 2018)",
    "VadaGrad": "variational optimisation with an AdaGrad-like rule (Khan et al. 2018, App. F)",
    "VON": "variational online-Newton, Price or Hutchinson Hessian (Khan et al. 2018)",
    "IVON": "improved variational online-Newton (Shen et al. 2024)",
    "NoisyAdam": "noisy Adam, fully factorised NNG (Zhang et al. 2018)",
    "BAdam": "Adam read as a Laplace posterior (BADAM)",
    "VOGN": "variational online Gauss-Newton with per-example gradients (Khan et al. 2018)",
    "NoisyKFAC": "noisy K-FAC, matrix-variate Gaussian (Zhang et al. 2018)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def main(args: argparse.Namespace) -> None:
    print("Optimizers (ngvi.<name>):")
    for name, text in OPTIMIZERS.items():
        mark = "" if hasattr(ngvi, name) else "  [not in this build]"
        print(f"  {name:10s} {text}{mark}")
