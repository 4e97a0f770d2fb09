"""The ``ngvi`` command line: ``ngvi demo``, ``ngvi list``, ... (``ngvi <command> --help`` explains each)."""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module under ngvi.experiments, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "train every optimizer on a 1-D toy regression and plot the predictive bands (~2 min)"),
    "uci": ("uci", "the UCI regression benchmark (Khan et al. 2018 and Zhang et al. 2018, Table 1)"),
    "list": ("listing", "list the methods and data sets ngvi knows"),
    "bench": ("bench", "step time and peak memory of every optimizer against torch.optim.Adam (~15 min)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ngvi",
        description="Natural-gradient variational inference for PyTorch: run the papers' experiments.",
        epilog="Each command writes a results folder (results.json, table.md, PNG figures); reruns resume.",
    )
    sub = parser.add_subparsers(dest="command", metavar="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(f"ngvi.experiments.{module}").add_arguments(cmd)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module = importlib.import_module(f"ngvi.experiments.{COMMANDS[args.command][0]}")
    try:
        module.main(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"ngvi {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
