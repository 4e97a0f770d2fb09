"""The ``ngvi`` command line: ``ngvi demo``, ``ngvi list``, ... (``ngvi <command> --help`` explains each)."""

from __future__ import annotations

import argparse
import importlib
import sys

# The import names of the `experiments` extra in pyproject.toml (pip install "ngvi[experiments]"): the
# library needs only torch and numpy, the experiments need these as well.
EXPERIMENTS_EXTRA = frozenset({"scipy", "matplotlib", "tqdm", "optuna"})


def missing_extra_message(command: str, err: ModuleNotFoundError) -> str | None:
    """The one-line error for ``ngvi <command>`` when ``err`` names a package of the experiments extra.

    None for any other missing module (a bug or an optional tool, which the caller re-raises).
    """
    missing = (err.name or "").partition(".")[0]
    if missing not in EXPERIMENTS_EXTRA:
        return None
    return (
        f"ngvi {command}: error: this command needs the experiments extra: "
        f'pip install "ngvi[experiments]" (missing: {missing})'
    )


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
        try:
            add_arguments = importlib.import_module(f"ngvi.experiments.{module}").add_arguments
        except ModuleNotFoundError as err:
            message = missing_extra_message(name, err)
            if message is None:
                raise
            # still listed by `ngvi --help`; any use of it, --help included, prints the message (see main)
            sub.add_parser(name, help=help_text, add_help=False).set_defaults(missing_extra=message)
            continue
        add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    message = getattr(args, "missing_extra", None)
    if message is None:
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        try:
            importlib.import_module(f"ngvi.experiments.{COMMANDS[args.command][0]}").main(args)
        except ModuleNotFoundError as err:  # a package that the command imports only where it needs it
            message = missing_extra_message(args.command, err)
            if message is None:
                raise
        except (ValueError, FileNotFoundError) as err:
            message = f"ngvi {args.command}: error: {err}"
    if message is not None:
        print(message, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
