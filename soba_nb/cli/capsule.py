"""`soba-nb capsule export SESSION CHECKPOINT OUT [--force]`: write a capsule as a portable
.capsule.md file."""

from __future__ import annotations

import argparse
from pathlib import Path

from soba_nb.cli import EXIT_OK, PROG, CommandError, subcommand
from soba_nb.cli.session import load_session, notebook_folder, session_argument


def capsule_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="capsule_action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="write a capsule to a .capsule.md file")
    session_argument(export)
    export.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="checkpoint id (ck_…) of a capsule"
    )
    export.add_argument("out", metavar="OUT", type=Path, help="the .capsule.md file to write")
    export.add_argument("--force", action="store_true", help="overwrite OUT if it exists")


@subcommand(
    "capsule", "portable capsules: `capsule export SESSION CHECKPOINT OUT`", capsule_arguments
)
def capsule_command(args: argparse.Namespace) -> int:
    from soba_nb.capsules.export import export_capsule
    from soba_nb.capsules.memory import project_root_for

    transcript = load_session(args.session)
    try:
        # A path outside the project is allowed only when given explicitly (absolute).
        written = export_capsule(
            transcript,
            args.checkpoint,
            args.out,
            project_root=project_root_for(notebook_folder(transcript)),
            force=args.force,
            allow_outside=args.out.expanduser().is_absolute(),
        )
    except (ValueError, OSError) as error:
        raise CommandError(f"{PROG} capsule export: {error}") from None
    print(f"exported {args.checkpoint} to {written}")
    return EXIT_OK
