"""The `soba-nb` command: look at a session transcript from outside a notebook, or in CI.

    soba-nb inspect SESSION [--json]   entries, leaf, checkpoints, capsules, token figures
    soba-nb verify SESSION             integrity check; exit 1 with the first problem
    soba-nb budget SESSION [--json]    hardLimit / softLimit and effective tokens
    soba-nb capsule export SESSION CHECKPOINT OUT [--force]
                                       write a capsule as a portable .capsule.md file
    soba-nb code SESSION [OUT] [--force]
                                       the agent's successful python calls as a script/notebook
    soba-nb demo [FOLDER]              the quick-start session, offline, on the embedded model
    soba-nb doctor [FOLDER]            which model would be used, and why; the limits

SESSION is a `.jsonl` transcript, or a notebook or its `.soba` folder: the session written last.

Subcommands live in one table, `SUBCOMMANDS`: each is a small function decorated with
`@subcommand(...)` in its family's module (`inspect.py`, `verify.py`, `budget.py`,
`capsule.py`, `demo.py` for demo and doctor; `session.py` holds what they share), so adding
one touches nothing else but, for a new family, one import line at the end of this file.
Exit codes: 0 ok, 1 a bad transcript (or config), 2 a usage error. Every error is one line
on stderr; a transcript problem reads `SESSION:LINE: problem`.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Sequence

from soba_nb.cli.table import EXIT_USAGE, PROG, SUBCOMMANDS, CommandError, OneLineParser
from soba_nb.cli.table import subcommand as subcommand  # re-exported: tests add commands


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; `only`: with that subcommand alone (what `main` parses a
    command line naming it with: each subcommand's parser costs a few lookups of argparse's
    message translations, about 2 ms for all of them, paid by every command)."""
    parser = OneLineParser(prog=PROG, description="Inspect and check soba-nb session transcripts.")
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in SUBCOMMANDS.values():
        if only in (None, command.name):
            command.arguments(commands.add_parser(command.name, help=command.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `soba-nb` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    named = next((word for word in argv if not word.startswith("-")), None)
    parser = build_parser(named if named in SUBCOMMANDS else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse has printed its one-line usage error
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    try:
        return SUBCOMMANDS[args.command].run(args)
    except CommandError as error:
        print(error, file=sys.stderr)
        return error.exit_code
    except BrokenPipeError:
        # `soba-nb inspect S | head`: the reader has gone, which is no error of ours. Output
        # still buffered must not fail again at exit (Python's own advice for SIGPIPE).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def console() -> int:
    """Entry point of the `soba-nb` console script: `main`, then an exit without the
    interpreter's last cycle collections.

    When `main` returns, the command has done its work and closed what it wrote (every file is
    written in a `with` block, most by rename). What is left for the interpreter's exit is its
    modules, and the collections it runs over them found nothing to collect and cost more than
    `soba-nb budget` itself (about 10 ms of a 75 ms process here: docs/performance.md): the
    objects are frozen (`gc.freeze`), so those passes skip them. Freed by their counts as
    before; only a cycle left behind is never collected, in a process about to end."""
    exit_code = main()
    gc.freeze()
    return exit_code


EXIT_BROKEN_PIPE = 128 + 13
"""What a command killed by SIGPIPE exits with (the shell's convention, as `yes | head`)."""


class _VersionAction(argparse.Action):
    """`--version`: prints it on stdout (`v=$(soba-nb --version)` holds it) and exits 0, the
    package metadata read only then (argparse's own action takes the text when the parser is
    built: 10 ms of every command)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0,
                         help="show the version and exit")  # fmt: skip

    def __call__(self, parser: argparse.ArgumentParser, *_args: object, **_kwargs: object) -> None:
        print(f"{PROG} {_version()}", flush=True)
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("soba-nb")
    except PackageNotFoundError:
        return "(not installed)"


# -- the subcommands, one module per family --------------------------------------------------
# Importing a module registers its commands (hence the unused imports), and the order here is
# the order of `soba-nb --help`, so isort must not sort these lines.
# isort: off
from soba_nb.cli import inspect  # noqa: E402, F401
from soba_nb.cli import verify  # noqa: E402, F401
from soba_nb.cli import budget  # noqa: E402, F401
from soba_nb.cli import capsule  # noqa: E402, F401
from soba_nb.cli import code  # noqa: E402, F401
from soba_nb.cli import demo  # noqa: E402, F401
# isort: on
from soba_nb.cli.session import model_of as model_of  # noqa: E402  (re-exported: benchmarks use it)
