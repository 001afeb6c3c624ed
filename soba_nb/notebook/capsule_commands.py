"""The `%capsule` subcommands (SPEC §8, §9, §14): create, export, load, list, show, and diff,
edit, amend (`soba_nb.notebook.capsule_check`: check and correct a capsule before it counts).

Each handler takes the `SobaMagics` instance, the open agent session and the rest of the
line after the subcommand; `SobaMagics.capsule` picks one from `COMMANDS` and turns the
capsule errors into a one-line `UsageError`. Each subcommand's arguments are a
`magic_arguments` spec below (its docstring is the help text).

`export --format agents-md` writes a Markdown handoff for another agent and `load
--untrusted` reads one (`soba_nb.capsule_files.handoff`); a load into a session with history keeps
it in model input and says so, with the `%rewind` target that undoes it
(`soba_nb.capsule_files.load`); `list` shows the checkpoints of the current path, newest last,
and which capsule each amendment corrects. `%%capsule amend CHECKPOINT` is the one subcommand
that takes a cell: `%capsule` is a line-and-cell magic.
"""

# IPython's magic_arguments are untyped.
# mypy: allow-untyped-calls, allow-untyped-decorators

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from soba_nb.agent.session import AgentSession
from soba_nb.capsule_files.amend import AmendError
from soba_nb.capsule_files.export import (
    EXPORT_FORMATS,
    CapsuleExportError,
    capsule_file_from_entry,
    export_capsule,
)
from soba_nb.capsule_files.file import FILE_SUFFIX, CapsuleFileError, write_capsule_file
from soba_nb.capsule_files.handoff_lookup import handoff_entry, handoff_file, handoff_note
from soba_nb.capsule_files.load import LoadSummary, load_capsule, signature_note, summarize_load
from soba_nb.capsule_files.memory import MemoryCapsule, list_memory, memory_dir
from soba_nb.compaction.requests import is_request
from soba_nb.notebook.arguments import error_line, parse
from soba_nb.notebook.capsule_check import (
    capsule_amend,
    capsule_diff_command,
    capsule_edit,
    named_or_latest,
)
from soba_nb.notebook.checkpoints import local_time
from soba_nb.notebook.holder import SessionHolder
from soba_nb.notebook.monitor import capsule_line
from soba_nb.notebook.render import TextView, ipython_display
from soba_nb.paths import shown
from soba_nb.printable import note_line, printable
from soba_nb.redact import redact
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    Entry,
    MessageEntry,
    ToolResultEntry,
)

SLUG_CHARS = 60
DEFAULT_SLUG = "capsule"
LIST_LIMIT = 20
"""`%capsule list` shows the last this many checkpoints; earlier ones are counted."""


def slug(title: str) -> str:
    """A file-name-safe form of a title: `Churn model — v2!` → `churn-model-v2`."""
    words = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return words[:SLUG_CHARS].rstrip("-") or DEFAULT_SLUG


def capsule_create(holder: SessionHolder, agent: AgentSession, rest: str) -> None:
    args = parse(_create_arguments, rest)
    title = redact(" ".join(args.title))  # it names the file and is shown in the cell
    create_capsule_file(holder, agent, title, agent.project_root / f"{slug(title)}{FILE_SUFFIX}", force=args.force)


def create_capsule_file(holder: SessionHolder, agent: AgentSession, title: str, target: Path, *, force: bool) -> None:
    """A capsule of the session as it is, written to `target` (nothing compacted), and a
    checkpoint on the path saying so: `%capsule list` shows it and `%rewind` finds it."""
    agent.ensure_summarizer()
    try:
        with holder.cancellable() as cancel:
            entry = agent.compactor.make_capsule(cancel=cancel)
    except KeyboardInterrupt:
        entry = None
    if entry is None:
        print("cancelled: no capsule file was written")
        return
    capsule_file = capsule_file_from_entry(
        entry, notebook=agent.notebook, session_id=agent.session_id, title=title
    )
    written = write_capsule_file(target, capsule_file, force=force)
    fallback = " · fallback" if entry.quality == "degraded" else ""
    # One id: the checkpoint recorded on the path is the one in the file's front matter, so
    # `%capsule list`, `show` and `export` name the capsule the file holds (`handoff_lookup`).
    mark = agent.transcript.append(
        CheckpointEntry(checkpoint_id=entry.checkpoint_id, kind="user", note=handoff_note(title, shown(written)))
    )
    assert isinstance(mark, CheckpointEntry)
    print(
        f"capsule {title!r} written to {shown(written)} "
        f"({capsule_file.metadata.tokens:,} tokens · quality {entry.quality}{fallback}) · {mark.checkpoint_id}"
    )


def capsule_export(holder: SessionHolder, agent: AgentSession, rest: str) -> None:
    args = parse(_export_arguments, rest)
    explicit = Path(args.path).expanduser().is_absolute()
    handoff = handoff_file(agent.transcript, args.checkpoint, agent.project_root)
    written = export_capsule(
        agent.transcript, args.checkpoint, args.path,
        project_root=agent.project_root, force=args.force, allow_outside=explicit,
        export_format=args.format, entry=handoff_entry(args.checkpoint, *handoff) if handoff else None,
    )
    kind = " as a Markdown handoff for another agent" if args.format == "agents-md" else ""
    print(f"exported {args.checkpoint} to {shown(written)}{kind}")


def capsule_load(holder: SessionHolder, agent: AgentSession, rest: str) -> None:
    args = parse(_load_arguments, rest)
    entry = load_capsule(
        args.path, agent.transcript, session_notebook=agent.notebook, counter=agent.counter,
        untrusted=args.untrusted, project_root=agent.project_root, hard_limit=agent.limits.hard_limit,
    )
    summary = summarize_load(agent.transcript, entry)
    signature = signature_note(untrusted=args.untrusted)
    for line in load_message(entry, summary, untrusted=args.untrusted, signature=signature):
        print(line)
    _show_markdown(holder, entry.content)
    holder.refresh_monitor()


def load_message(entry: CapsuleEntry, summary: LoadSummary, *, untrusted: bool, signature: str = "") -> list[str]:
    """One line for a load into an empty session; two when the session has history: what
    stays in model input, what was rolled up, and how to get back. `signature`: `signed`,
    `unsigned` or `not verified` (SPEC §13, `signature_note`)."""
    signed = f" · {signature}" if signature else ""
    trust = " · untrusted: framed as data, not instructions" if untrusted else ""
    loaded = (
        f"loaded {entry.title!r} from {entry.source} as {entry.checkpoint_id} "
        f"({entry.tokens_after:,} tokens · quality {entry.quality}{signed}{trust})"
    )
    if not summary.had_history:
        return [f"{loaded}; the next turn starts from it"]
    kept = []
    if summary.kept_entries:
        plural = "entry" if summary.kept_entries == 1 else "entries"
        kept.append(f"the {summary.kept_entries} earlier {plural} of this session stay in model input after it")
    if summary.rolled_up:
        kept.append(f"this session's capsule {summary.rolled_up} is rolled into it")
    return [
        f"{loaded}, next to this session's work",
        f"{'; '.join(kept)} · %rewind {summary.before} gets back to before the load",
    ]


def capsule_list(holder: SessionHolder, agent: AgentSession, rest: str) -> None:
    args = parse(_list_arguments, rest)
    if args.memory:
        found = list_memory(agent.project_root)
        if not found:
            print(f"project memory is empty ({shown(memory_dir(agent.project_root))})")
        for item in found:
            print(f"{printable(item.path.name)}  {memory_line(item)}")
        return
    lines = path_checkpoint_lines(agent.transcript.path_view(), limit=None if args.all else LIST_LIMIT)
    print("\n".join(lines) if lines else "no checkpoints or capsules on the current path yet")


def memory_line(item: MemoryCapsule) -> str:
    """A project-memory capsule as `%capsule list --memory` shows it: title · quality ·
    created · by whom (SPEC §13) · its signature."""
    meta = item.metadata
    if meta is None:
        return f"unreadable: {note_line(str(item.error))}"
    author = f"by {note_line(meta.author)}" if meta.author else "author not recorded (an older file)"
    return f"{note_line(meta.title)} · {meta.quality} · {note_line(meta.created)} · {author} · {note_line(item.signature)}"


def path_checkpoint_lines(path: Sequence[Entry], *, limit: int | None = LIST_LIMIT) -> list[str]:
    """The checkpoints and capsules of the current path, newest last, one line each:
    checkpoint id · kind · local time · note, where a turn's note is its request and a
    capsule's says what made it (trigger, tokens, quality) or which file it was loaded from.
    At most `limit` lines (None: all), after a line counting the ones left out."""
    lines: list[str] = []
    request = ""
    changed: dict[str, None] = {}
    """Files the agent wrote or edited since the previous checkpoint (SPEC §11)."""
    for entry in path:
        if isinstance(entry, MessageEntry) and is_request(entry):  # a steer is part of its request
            request = entry.content
        elif isinstance(entry, ToolResultEntry) and entry.files:
            changed.update((change.path, None) for change in entry.files)
        elif isinstance(entry, CheckpointEntry | CapsuleEntry):
            parts = [entry.checkpoint_id, *_kind_and_note(entry, request)]
            parts.insert(2, local_time(entry.timestamp))
            if changed:
                parts.append(f"changed {len(changed)} file(s): {', '.join(map(printable, changed))}")
                changed = {}
            lines.append(" · ".join(part for part in parts if part))
    if limit is None or len(lines) <= limit:
        return lines
    return [f"… {len(lines) - limit} earlier (%capsule list --all shows them)", *lines[-limit:]]


def _kind_and_note(entry: CheckpointEntry | CapsuleEntry, request: str) -> list[str]:
    if isinstance(entry, CheckpointEntry):
        if entry.note:
            return [entry.kind, note_line(entry.note)]
        return [entry.kind, f'"{note_line(request)}"' if entry.kind == "turn" and request else ""]
    title = repr(note_line(entry.title)) if entry.title else ""
    amended = f"(amends {entry.amends}, by {note_line(entry.author or 'unknown')})" if entry.amends else ""
    if entry.source is not None:
        return ["loaded", amended, title, f"from {Path(entry.source).name}", entry.quality]
    figures = f"{entry.tokens_before:,} → {entry.tokens_after:,} tokens"
    return [f"capsule ({entry.trigger})", amended, title, figures, entry.quality]




def capsule_show(holder: SessionHolder, agent: AgentSession, rest: str) -> None:
    args = parse(_show_arguments, rest)
    handoff = handoff_file(agent.transcript, args.checkpoint, agent.project_root) if args.checkpoint else None
    if handoff is not None:
        path, capsule_file = handoff
        meta = capsule_file.metadata
        print(
            f"capsule {meta.title!r} · {meta.checkpoint} · written by %capsule create to {shown(path)} "
            f"(a handoff: nothing compacted) · {meta.tokens:,} tokens · quality {meta.quality}"
        )
        _show_markdown(holder, capsule_file.body)
        return
    capsule = named_or_latest(agent, args.checkpoint)
    if capsule is None:
        print("no capsules on the current path")
        return
    amended = f" · amends {capsule.amends}, by {note_line(capsule.author or 'unknown')}" if capsule.amends else ""
    print(f"{capsule_line(capsule)} · quality {capsule.quality}{amended}")
    _show_markdown(holder, capsule.content)


def _show_markdown(holder: SessionHolder, text: str) -> None:
    if not holder.rich:
        print(printable(text, lines=True))
        return
    ipython_display(TextView(text))


COMMANDS: dict[str, Callable[[SessionHolder, AgentSession, str], None]] = {
    "create": capsule_create,
    "export": capsule_export,
    "load": capsule_load,
    "list": capsule_list,
    "show": capsule_show,
    "diff": capsule_diff_command,
    "edit": capsule_edit,
}
"""`%capsule SUBCOMMAND …` → its handler, in the order the usage message names them."""
CELL_COMMAND = "amend"
"""The subcommand that takes a cell: `%%capsule amend CHECKPOINT` and the capsule's Markdown."""


# Parsers of the %capsule subcommands (magic_arguments builds them; the docstrings are help).


@magic_arguments(name="capsule create")
@argument("title", nargs="+", help="The capsule's title (quote it, or the rest of the line).")
@argument("--force", action="store_true", help="Replace an existing file of that name.")
def _create_arguments() -> None:
    """Write a portable handoff capsule of the current state."""


@magic_arguments(name="capsule export")
@argument("checkpoint", help="Checkpoint id of a capsule (ck_…).")
@argument("path", help="Output file or folder.")
@argument("--force", action="store_true", help="Replace an existing file.")
@argument(
    "--format", choices=EXPORT_FORMATS, default="capsule",
    help="capsule: a .capsule.md soba-nb loads back (default); agents-md: a plain Markdown "
    "handoff another coding agent reads (a folder gets AGENTS.md).",
)
def _export_arguments() -> None:
    """Write one capsule of this session to a file."""


@magic_arguments(name="capsule load")
@argument("path", help="A .capsule.md file (with --untrusted: any Markdown handoff).")
@argument(
    "--untrusted", action="store_true",
    help="Read a plain Markdown handoff without front matter (an AGENTS.md, another agent's "
    "notes), or a capsule file the team key does not verify: its ## sections become the "
    "capsule's, quality degraded, framed as data.",
)
def _load_arguments() -> None:
    """Load a capsule file into this session (its earlier work stays in model input)."""


@magic_arguments(name="capsule list")
@argument("--memory", action="store_true", help="List the project memory instead (with who wrote each capsule).")
@argument("--all", action="store_true", help=f"Every checkpoint, not only the last {LIST_LIMIT}.")
def _list_arguments() -> None:
    """List the checkpoints and capsules on the current path, newest last."""


@magic_arguments(name="capsule show")
@argument("checkpoint", nargs="?", help="Checkpoint id; default: the latest capsule on the path.")
def _show_arguments() -> None:
    """Show a capsule's Markdown."""


CAPSULE_ERRORS = (CapsuleExportError, CapsuleFileError, AmendError, OSError)


@magics_class
class CapsuleMagics(Magics):
    """`%capsule`, a magic of its own (as jupysql's sub-magics are), sharing the session of
    `%soba` through the `SessionHolder`."""

    def __init__(self, shell: Any, holder: SessionHolder):
        super().__init__(shell=shell)
        self.holder = holder

    @line_cell_magic
    def capsule(self, line: str, cell: str | None = None) -> None:
        """%capsule create "TITLE" [--force] | export CHECKPOINT PATH [--force] [--format capsule|agents-md]
        | load PATH [--untrusted] | list [--all] [--memory] | show [CHECKPOINT]
        | diff [CHECKPOINT] | edit [CHECKPOINT];  %%capsule amend CHECKPOINT (the Markdown below)

        create — a portable handoff of the current state (model summary, deterministic
        fallback), written to `<project>/<title-slug>.capsule.md`; the session is unchanged.
        export — write the capsule of CHECKPOINT to PATH (a folder gets `<checkpoint>.capsule.md`,
        or `AGENTS.md` with `--format agents-md`: plain Markdown another coding agent reads;
        a path outside the project must be given as an absolute path).
        load — load a capsule file into this session; its earlier work stays in model input
        (`%rewind` gets back to before the load); with SOBA_CAPSULE_KEY set only a file signed
        with it loads; `--untrusted` reads any Markdown handoff (quality degraded, framed as data).
        list — the checkpoints and capsules on the current path, newest last (`--all`: every
        one; `--memory`: the project memory's capsules, who wrote each, and its signature).
        show — the latest capsule on the path, or CHECKPOINT's.
        diff — what the latest capsule (or CHECKPOINT's) replaced: the requests, tool calls and
        files read and written, each the capsule does not mention marked `✗ not in capsule`.
        edit — the latest capsule's Markdown into the next cell as `%%capsule amend CHECKPOINT`.
        %%capsule amend CHECKPOINT — check the cell's Markdown (the 13 headings) and append it as
        the corrected capsule (`amends`), which the next request carries.
        """
        command, _, rest = line.strip().partition(" ")
        if cell is not None and command != CELL_COMMAND:
            raise UsageError(f"%%capsule: only amend takes a cell: %%capsule amend CHECKPOINT (got {command or 'nothing'!r})")
        if cell is None and command == CELL_COMMAND:
            raise UsageError(
                "%capsule amend: the corrected capsule goes in the cell, under %%capsule amend CHECKPOINT "
                "(%capsule edit writes that cell)"
            )
        if cell is None and command not in COMMANDS:
            got = f" (got {command!r})" if command else ""
            raise UsageError(f"%capsule: expected create, export, load, list, show, diff or edit{got}")
        agent = self.holder.get_session()
        try:
            if cell is not None:
                capsule_amend(self.holder, agent, rest, cell)
            else:
                COMMANDS[command](self.holder, agent, rest)
        except CAPSULE_ERRORS as exc:
            raise UsageError(f"%capsule {command}: {error_line(exc)}") from None
