"""`soba-nb capsule export SESSION CHECKPOINT OUT [--force] [--format capsule|agents-md]`:
write a capsule as a portable `.capsule.md` file (the default), or as a plain Markdown
handoff another coding agent reads as project instructions (`agents-md`: no front matter;
a folder OUT gets `AGENTS.md`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from soba_nb.cli.session import load_session, notebook_folder, session_argument
from soba_nb.cli.table import EXIT_OK, PROG, CommandError, subcommand

FORMATS = ("capsule", "agents-md")
"""`soba_nb.capsule_files.export.EXPORT_FORMATS`, not imported here: the CLI imports the capsule
modules (and the tokenizer) only when the command runs."""


def capsule_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="capsule_action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="write a capsule to a .capsule.md file")
    session_argument(export)
    export.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="checkpoint id (ck_…) of a capsule"
    )
    export.add_argument("out", metavar="OUT", type=Path, help="the file (or folder) to write")
    export.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    export.add_argument(
        "--format",
        choices=FORMATS,
        default="capsule",
        help="capsule: a .capsule.md soba-nb loads back (default); "
        "agents-md: a Markdown handoff for another coding agent (e.g. AGENTS.md)",
    )


@subcommand(
    "capsule", "portable capsules: `capsule export SESSION CHECKPOINT OUT`", capsule_arguments
)
def capsule_command(args: argparse.Namespace) -> int:
    from soba_nb.capsule_files.export import export_capsule
    from soba_nb.capsule_files.handoff_lookup import handoff_entry, handoff_file
    from soba_nb.layout import project_root_for

    transcript = load_session(args.session)
    root = project_root_for(notebook_folder(transcript))
    try:
        # The capsule `%capsule create` wrote is named by the id it printed, as in the notebook.
        handoff = handoff_file(transcript, args.checkpoint, root)
        # A path outside the project is allowed only when given explicitly (absolute).
        written = export_capsule(
            transcript,
            args.checkpoint,
            args.out,
            project_root=root,
            force=args.force,
            allow_outside=args.out.expanduser().is_absolute(),
            export_format=args.format,
            entry=handoff_entry(args.checkpoint, *handoff) if handoff else None,
        )
    except (ValueError, OSError) as error:
        raise CommandError(f"{PROG} capsule export: {error}") from None
    kind = " as a Markdown handoff for another agent" if args.format == "agents-md" else ""
    print(f"exported {args.checkpoint} to {written}{kind}")
    return EXIT_OK
