"""The ``ngvi`` command line: ``ngvi demo``, ``ngvi list``, ... (``ngvi <command> --help`` explains each).

Every command either runs or exits with one line that says what is wrong and what to do: bad arguments
(exit 2), a results folder that cannot be used (exit 2), Ctrl-C or SIGTERM (exit 130, with how to resume).
"""

from __future__ import annotations

import sys

from .experiments import COMMANDS, command
from .experiments.core.args import Parser
from .experiments.core.runner import Interrupted, run


def build_parser() -> Parser:
    parser = Parser(
        prog="ngvi",
        description="Natural-gradient variational inference for PyTorch: run the papers' experiments.",
        epilog="Each command writes a results folder (results.json, table.md, PNG figures); reruns resume.",
    )
    sub = parser.add_subparsers(dest="command", metavar="command", required=True)
    for name in COMMANDS:
        cmd = command(name)
        sub_parser = sub.add_parser(name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(sub_parser)
        if getattr(cmd, "default_out", None):
            _common_arguments(sub_parser, cmd)
    return parser


def _common_arguments(parser: Parser, experiment) -> None:
    from .experiments.core import args as types

    parser.add_argument(
        "--out", default=experiment.default_out, help=f"results folder (default: {experiment.default_out})"
    )
    if experiment.parallel:
        parser.add_argument(
            "--jobs", type=types.positive_int, default=2, help="worker processes (default: 2)"
        )


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help, or a bad argument (one line already printed)
        return int(done.code or 0)
    prog = f"ngvi {args.command}"
    cmd = command(args.command)
    try:
        if hasattr(cmd, "run_job"):
            run(cmd, args)
        else:
            cmd.main(args)
    except Interrupted as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
