"""`soba-nb code SESSION [OUT] [--force]`: the session's code on its current path — the cells
the user ran without an error and the agent's successful python calls, in the order they ran —
printed, or written to OUT (a notebook when OUT ends in `.ipynb`, else a percent-format script
that runs with `python`). The same as `%soba /code [OUT]`."""

from __future__ import annotations

import argparse
from pathlib import Path

from soba_nb.cli.session import load_session, session_argument
from soba_nb.cli.table import EXIT_OK, EXIT_USAGE, CommandError, subcommand


def _arguments(parser: argparse.ArgumentParser) -> None:
    session_argument(parser)
    parser.add_argument("out", nargs="?", type=Path, metavar="OUT", help="a .py script or an .ipynb notebook to write")
    parser.add_argument("--force", action="store_true", help="overwrite OUT if it exists")


@subcommand("code", "the session's code (your cells and the agent's python calls) as a script or notebook", _arguments)
def code_command(args: argparse.Namespace) -> int:
    from soba_nb.agent.code_export import CodeExportError, export_code

    transcript = load_session(args.session)
    try:
        export = export_code(
            transcript,
            args.out,
            title=f"soba session {transcript.file.stem}",
            force=args.force,
            base=transcript.file.parent.parent,  # the notebook's folder, where the code ran
        )
    except CodeExportError as error:
        raise CommandError(f"soba-nb code: {error}", EXIT_USAGE) from None
    print(export.text if export.written is None else export.receipt(), end="" if export.written is None else "\n")
    return EXIT_OK
