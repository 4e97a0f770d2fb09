"""The ``ngvi`` command line: ``ngvi demo``, ``ngvi list``, ... (``ngvi <command> --help`` explains each).

Every command either runs or exits with one line that says what is wrong and what to do: bad arguments
(exit 2), a results folder that cannot be used (exit 2), a missing ``experiments`` or ``cluster`` extra
(exit 2), jobs that failed (exit 1, after the report), Ctrl-C or SIGTERM (exit 130, with how to resume).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from . import COMMANDS, command
from .core.args import Parser, jobs, out_folder
from .core.backends import BACKENDS, CONNECT_TIMEOUT

# The import names of the `experiments` extra in pyproject.toml (pip install "ngvi[experiments]"; pyro-ppl
# imports as pyro): the library needs only torch and numpy, the experiments need these as well.
EXPERIMENTS_EXTRA = frozenset(
    {
        "scipy",
        "matplotlib",
        "tqdm",
        "optuna",
        "pyro",
        "gymnasium",
        "mujoco",
        "stable_baselines3",
        "sb3_contrib",
    }
)


# The import names of the `cluster` extra (pip install "ngvi[cluster]"): `--backend ray`.
CLUSTER_EXTRA = frozenset({"ray"})


def missing_extra_message(command: str, err: ModuleNotFoundError) -> str | None:
    """The one-line error for ``ngvi <command>`` when ``err`` names a package of the experiments (or
    cluster) extra.

    None for any other missing module (a bug or an optional tool, which the caller re-raises).
    """
    missing = (err.name or "").partition(".")[0]
    if missing in CLUSTER_EXTRA:
        return (
            f"ngvi {command}: error: --backend ray needs the cluster extra: "
            f'pip install "ngvi[cluster]" (missing: {missing})'
        )
    if missing not in EXPERIMENTS_EXTRA:
        return None
    return (
        f"ngvi {command}: error: this command needs the experiments extra: "
        f'pip install "ngvi[experiments]" (missing: {missing})'
    )


def os_error_message(err: OSError, options: dict[str, Any]) -> str:
    """``err`` in one line that names its path and the option that path came from: the option (``dest``
    in ``options``, as argparse names it) whose value is that path or a folder above it, the most specific
    one; else ``$NGVI_DATA`` where the path is in it. An OSError without a path keeps its own text."""
    if not err.strerror or not isinstance(err.filename, str | bytes | os.PathLike):  # none, or a descriptor
        return str(err)
    path = os.fsdecode(err.filename)
    second = err.filename2
    where = f"{path} -> {os.fsdecode(second)}" if isinstance(second, str | bytes | os.PathLike) else path
    found = _source_of(path, options)
    if found is None:
        return f"{err.strerror}: {where}"
    option, value = found
    if os.path.abspath(value) == os.path.abspath(path):
        return f"{option} {where}: {err.strerror}"
    return f"{option} {value}: {err.strerror}: {where}"


def _source_of(path: str, options: dict[str, Any]) -> tuple[str, str] | None:
    """(option, value) of the option whose value is ``path`` or a folder above it, the longest such."""
    given = [(f"--{dest.replace('_', '-')}", v) for dest, v in options.items() if dest != "command"]
    if os.environ.get("NGVI_DATA"):  # where --data-dir was left out, the data come from here
        given.append(("$NGVI_DATA", os.environ["NGVI_DATA"]))
    target = Path(os.path.abspath(path))
    best: tuple[str, str] | None = None
    for option, value in given:
        for v in value if isinstance(value, list) else [value]:
            if not isinstance(v, str | os.PathLike) or "://" in str(v) or not str(v).strip():
                continue
            folder = Path(os.path.abspath(v))
            if (target == folder or folder in target.parents) and (
                best is None or len(str(folder)) > len(os.path.abspath(best[1]))
            ):
                best = (option, os.fspath(v))
    return best


def _epilog(cmd: Any) -> dict[str, Any]:
    """An experiment's examples, and how it resumes, below its arguments in ``--help``."""
    examples = getattr(cmd, "examples", ())
    if not examples:
        return {}
    lines = ["examples:", *(f"  {e}" for e in examples)]
    lines.append("A killed run resumes: rerun the same command with the same --out.")
    return {"epilog": "\n".join(lines), "formatter_class": argparse.RawDescriptionHelpFormatter}


def build_parser() -> Parser:
    parser = Parser(
        prog="ngvi",
        description="Natural-gradient variational inference for PyTorch: run the papers' experiments.",
        epilog="Each command writes a results folder (results.json, table.md, PNG figures); reruns resume.",
    )
    sub = parser.add_subparsers(dest="command", metavar="command", required=True)
    for name in COMMANDS:
        try:
            cmd = command(name)
        except ModuleNotFoundError as err:
            message = missing_extra_message(name, err)
            if message is None:
                raise
            # still listed by `ngvi --help`; any use of it, --help included, prints the message (see main)
            help_text = 'needs the experiments extra: pip install "ngvi[experiments]"'
            sub.add_parser(name, help=help_text, add_help=False).set_defaults(missing_extra=message)
            continue
        sub_parser = sub.add_parser(name, help=cmd.help, description=cmd.help, **_epilog(cmd))
        cmd.add_arguments(sub_parser)
        if getattr(cmd, "default_out", None):
            _common_arguments(sub_parser, cmd)
    return parser


def _common_arguments(parser: Parser, experiment: Any) -> None:
    out = experiment.default_out
    parser.add_argument("--out", type=out_folder, default=out, help=f"results folder (default: {out})")
    if experiment.parallel:
        parser.add_argument(
            "--jobs", type=jobs, default=2, help="worker processes, or a local Ray's CPUs (default: 2)"
        )
        parser.add_argument(
            "--backend",
            choices=BACKENDS,
            default="local",
            help="local: worker processes on this machine; ray: Ray tasks (needs ngvi[cluster]; see "
            "docs/PROTOCOLS.md). A run resumes on either (default: local)",
        )
        parser.add_argument(
            "--ray-address",
            default=None,
            help="with --backend ray: a cluster to join, host:port, ray://host:port or auto (the one `ray "
            f"start` runs here), which must answer within {CONNECT_TIMEOUT:g} s; default: start a local "
            "Ray instance with --jobs CPUs, stopped at the end",
        )


def main(argv: list[str] | None = None) -> int:
    from .core.runner import Incomplete, Interrupted, run

    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        message = getattr(args, "missing_extra", None)
        if message is None and unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as done:  # --help, or a bad argument (one line already printed)
        return int(done.code or 0)
    prog = f"ngvi {args.command}"
    if message is None:
        try:
            cmd = command(args.command)
            if hasattr(cmd, "run_job"):
                missing = [m for m in cmd.requires if importlib.util.find_spec(m) is None]
                if missing:  # say so before any work, not after the first fits
                    raise ModuleNotFoundError(f"No module named {missing[0]!r}", name=missing[0])
                run(cmd, args)
            else:
                cmd.main(args)
        except ModuleNotFoundError as err:  # a package that the command imports only where it needs it
            message = missing_extra_message(args.command, err)
            if message is None:
                raise
        except Interrupted as err:
            print(f"{prog}: {err}", file=sys.stderr)
            return 130
        except Incomplete as err:
            print(f"{prog}: {err}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"{prog}: interrupted", file=sys.stderr)
            return 130
        except (ValueError, OSError) as err:  # the first line says what and what to do; details follow
            text = os_error_message(err, vars(args)) if isinstance(err, OSError) else str(err)
            message = f"{prog}: error: {text.strip().splitlines()[0]}"
    if message is not None:
        print(message, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
