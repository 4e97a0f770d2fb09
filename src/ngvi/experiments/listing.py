"""``ngvi list``: the methods, the experiments and the data sets, read from their registries."""

from __future__ import annotations

import argparse

from .core.methods import METHODS
from .data import UCI_DATASETS

OTHER_DATA = {
    "toy regression": "BADAM App. D.1, generated (data.toy_regression)",
    "australian_scale, breast_cancer_scale": "LIBSVM binary classification (data.load_libsvm)",
    "mnist": "MNIST digits (data.load_mnist)",
    "usps": "USPS digits, 3-vs-5 task (data.load_usps_3vs5)",
    "fashion-mnist": "OOD set of classify, Debian's dataset-fashion-mnist (data.fashion_mnist)",
    "cifar10": "CIFAR-10 python batches from --cifar-dir, if you have them (data.cifar10)",
    "mushroom, statlog shuttle, adult": "contextual bandits (data.load_bandit)",
    "wheel": "the wheel bandit of Riquelme et al. 2018, generated (data.wheel_bandit)",
    "covertype, census, jester, financial": "bandits read from a folder of your own (data.load_user_bandit)",
    "kjv": "the King James Version, the stand-in for War and Peace of charlm (data.load_text)",
}


class Listing:
    name = "list"
    help = "list the methods, experiments and data sets ngvi knows"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        del parser  # no options

    def main(self, args: argparse.Namespace) -> None:
        from . import COMMANDS, command

        print("Methods (`--methods` of every experiment; the class under ngvi.):")
        for name, m in METHODS.items():
            mark = "" if m.available() else "  [not in this build]"
            print(f"  {name:11s} {m.cls:20s} {m.reference}{mark}")
        print("\nExperiments (`ngvi <name> --help`):")
        for name in COMMANDS:
            if name != self.name:
                print(f"  {name:11s} {command(name).help}")
        print("\nUCI regression sets of `ngvi uci --datasets` (N, D, splits):")
        for name, (n, d, splits) in UCI_DATASETS.items():
            print(f"  {name:28s} {n:6d} {d:3d} {splits:3d}")
        print("\nOther data sets (ngvi.experiments.<loader>):")
        for name, text in OTHER_DATA.items():
            print(f"  {name:38s} {text}")


COMMAND = Listing()
