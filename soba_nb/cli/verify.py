"""`soba-nb verify SESSION`: integrity check; exit 1 with the first problem."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from soba_nb.cli.session import load_session, session_argument
from soba_nb.cli.table import EXIT_OK, EXIT_USAGE, PROG, CommandError, subcommand
from soba_nb.transcript.entries import CapsuleEntry
from soba_nb.transcript.store import Transcript


def integrity_problems(transcript: Transcript) -> list[tuple[int, str]]:
    """(line, problem) for what loading accepts but a sound session must not contain."""
    problems: list[tuple[int, str]] = []
    by_id = {entry.id: entry for entry in transcript}
    for entry in transcript:
        if not isinstance(entry, CapsuleEntry) or entry.first_kept_entry_id is None:
            continue
        ancestor = entry.parent_id
        while ancestor is not None and ancestor != entry.first_kept_entry_id:
            ancestor = by_id[ancestor].parent_id
        if ancestor is None:
            problems.append(
                (
                    transcript.line_of(entry.id),
                    f"capsule firstKeptEntryId {entry.first_kept_entry_id!r} is not on its path",
                )
            )
    return sorted(problems)


def structure_warnings(transcript: Transcript) -> list[tuple[int, str]]:
    """(line, warning) for a file that is sound but unusual."""
    found: list[tuple[int, str]] = []
    entries = transcript.entries
    if entries and transcript.header is None:
        found.append((1, "the first entry is not a session header"))
    for entry in entries[1:]:
        if entry.parent_id is None:
            found.append((transcript.line_of(entry.id), f"entry {entry.id!r} starts a second root"))
    return found


def verify_arguments(parser: argparse.ArgumentParser) -> None:
    session_argument(parser)
    parser.add_argument(
        "--repair",
        action="store_true",
        help="write a repaired copy beside the file (SESSION.repaired.jsonl), leaving out bad lines; never in place",
    )


@subcommand(
    "verify", "check a transcript's integrity; exit 1 with the first problem", verify_arguments
)
def verify_command(args: argparse.Namespace) -> int:
    if args.repair:
        return _repair(args.session)
    transcript = load_session(args.session)
    if not len(transcript):
        raise CommandError(f"{args.session}: empty: no session entry, so no soba transcript")
    for line, warning in structure_warnings(transcript):
        print(f"{args.session}:{line}: warning: {warning}", file=sys.stderr)
    problems = integrity_problems(transcript)
    if problems:
        line, problem = problems[0]
        raise CommandError(f"{args.session}:{line}: {problem}")
    print(f"ok: {len(transcript)} entries, leaf {transcript.leaf or '-'}")
    return EXIT_OK


def _repair(path: Path) -> int:
    from soba_nb.transcript.repair import RepairError, repair

    if not path.is_file():
        raise CommandError(f"{path}: no such file", EXIT_USAGE)
    try:
        report = repair(path)
    except (RepairError, OSError) as error:
        raise CommandError(f"{PROG} verify --repair: {error}") from None
    for line, why in report.dropped:
        print(f"{path}:{line}: left out: {why}", file=sys.stderr)
    for line, parent, now in report.reattached:
        print(f"{path}:{line}: re-attached to the entry on line {now} (its parent {parent!r} was on a line left out)", file=sys.stderr)
    reattached = f", {len(report.reattached)} re-attached to the entry before a bad line" if report.reattached else ""
    left_out = f"{len(report.dropped)} line{'' if len(report.dropped) == 1 else 's'} left out"
    print(f"repaired copy: {report.output} ({report.kept} entries kept, {left_out}{reattached})")
    return EXIT_OK
