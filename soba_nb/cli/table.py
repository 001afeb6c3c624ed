"""The `soba-nb` subcommand table and what every subcommand shares: the program name,
exit codes, the one-line error, JSON output. The families' modules register here; the
package (`soba_nb.cli`) parses the command line and runs them (imports run one way: the
package imports the families, the families import this module).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any, NoReturn

from msgspec import Struct

PROG = "soba-nb"
EXIT_OK = 0
EXIT_BAD_TRANSCRIPT = 1
EXIT_USAGE = 2


class CommandError(Exception):
    """A subcommand failed; the message is the whole line printed on stderr."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_TRANSCRIPT):
        super().__init__(message)
        self.exit_code = exit_code


# -- the subcommand table ------------------------------------------------------------------


class Subcommand(Struct, frozen=True):
    """One `soba-nb NAME …` command."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    """Adds the command's arguments to its parser."""
    run: Callable[[argparse.Namespace], int]
    """Does the work; returns the exit code or raises `CommandError`."""


SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(
    name: str, help: str, arguments: Callable[[argparse.ArgumentParser], None]
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Register the decorated function as `soba-nb NAME`."""

    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        if name in SUBCOMMANDS:
            raise ValueError(f"subcommand {name!r} is registered twice")
        SUBCOMMANDS[name] = Subcommand(name, help, arguments, run)
        return run

    return register


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (with a pointer to --help), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))
