"""Check and correct a capsule before it counts (SPEC §14): `%capsule diff`, `%capsule edit`
and `%%capsule amend`.

`diff` lists what a capsule replaced — the user's requests, the tool calls, the files read and
written — and marks what the capsule does not mention (`soba_nb.compaction.capsule_diff`).
`edit` puts the capsule's Markdown into the next cell under `%%capsule amend CHECKPOINT`
(IPython's `set_next_input`: JupyterLab, Notebook 7 and VS Code insert a cell below, a
terminal pre-fills the next prompt; the labextension leaves such a cell alone, it removes only
the copy of a cell the agent proposed). Running that cell appends the corrected capsule, which
the next request carries (`soba_nb.capsule_files.amend`). Each handler has the signature of
`capsule_commands.COMMANDS`; `amend` also takes the cell.
"""

# IPython's magic_arguments are untyped.
# mypy: allow-untyped-calls, allow-untyped-decorators

from __future__ import annotations

from IPython.core.magic_arguments import argument, magic_arguments

from soba_nb.agent.session import AgentSession
from soba_nb.capsule_files.amend import amend_capsule, amendable
from soba_nb.capsule_files.export import find_capsule
from soba_nb.compaction.capsule import render_capsule
from soba_nb.compaction.capsule_diff import CapsuleDiff, ItemKind, capsule_diff
from soba_nb.compaction.given_way import as_capsule, given_way_form
from soba_nb.notebook.arguments import parse
from soba_nb.notebook.holder import SessionHolder
from soba_nb.printable import printable
from soba_nb.transcript.entries import CapsuleEntry, CheckpointEntry, Entry
from soba_nb.transcript.store import Transcript

NOT_MENTIONED = "✗ not in capsule"
SECTIONS: tuple[tuple[ItemKind, str, str], ...] = (
    ("request", "requests", "request"),
    ("tool call", "tool calls", "tool call"),
    ("file read", "files read", "file read"),
    ("file written", "files written", "file written"),
)
"""The listing's sections, in order: (item kind, heading, one of them)."""
AMEND_LINE = "%%capsule amend {checkpoint}\n"


def named_or_latest(agent: AgentSession, checkpoint: str | None) -> CapsuleEntry | None:
    """The capsule `checkpoint` names (an error when it names none), else the latest on the
    path; None when the path has none."""
    if checkpoint:
        return find_capsule(agent.transcript, checkpoint)
    capsules = agent.capsules()
    return capsules[-1] if capsules else None


def capsule_diff_command(holder: SessionHolder, agent: AgentSession, rest: str) -> None:
    args = parse(_diff_arguments, rest)
    capsule = named_or_latest(agent, args.checkpoint)
    if capsule is None:
        print("no capsules on the current path")
        return
    path = path_to(agent.transcript, capsule)
    print("\n".join(diff_lines(capsule_diff(path, len(path) - 1))))


def path_to(transcript: Transcript, entry: Entry) -> list[Entry]:
    """Root → `entry`: the current path's start when it is on it, else its own branch."""
    path = transcript.path_view()
    for index in range(len(path) - 1, -1, -1):
        if path[index].id == entry.id:
            return list(path[: index + 1])
    chain: list[Entry] = []
    current: Entry | None = entry
    while current is not None:
        chain.append(current)
        current = transcript.get(current.parent_id) if current.parent_id is not None else None
    return chain[::-1]


def diff_lines(diff: CapsuleDiff) -> list[str]:
    """`%capsule diff`'s lines: a summary line, the items under their headings (each the
    capsule does not mention marked), and what to do about it. Escaped: no raw control
    character of a request or a path reaches the cell."""
    checkpoint = diff.capsule.checkpoint_id
    counts = [
        f"{len(items)} {heading if len(items) != 1 else one}" for kind, heading, one in SECTIONS if (items := diff.of_kind(kind))
    ]
    if not diff.items:
        return [f"{checkpoint} replaced {diff.replaced} entries: no requests, tool calls or files"]
    missing = len(diff.missing)
    lines = [
        f"{checkpoint} replaced {diff.replaced} entries: {', '.join(counts)} · "
        + (f"{missing} not in the capsule" if missing else "the capsule mentions each of them")
    ]
    for kind, heading, _ in SECTIONS:
        items = diff.of_kind(kind)
        if not items:
            continue
        lines.append(heading)
        for item in items:
            text = f'"{item.text}"' if kind == "request" else item.text
            lines.append(f"  {printable(text)}" + ("" if item.mentioned else f"  {NOT_MENTIONED}"))
    if missing:
        lines.append(f"%capsule edit {checkpoint} puts the capsule in the next cell to correct it")
    return lines


def capsule_edit(holder: SessionHolder, agent: AgentSession, rest: str) -> None:
    args = parse(_edit_arguments, rest)
    capsule = amendable(agent.transcript, args.checkpoint)
    # A capsule that gave way to a small window (one line, or none) is put there with its 13
    # sections, the request it carries in the first: `%%capsule amend` reads those.
    content = render_capsule(as_capsule(capsule.content)) if given_way_form(capsule.content) else capsule.content
    text = AMEND_LINE.format(checkpoint=capsule.checkpoint_id) + content
    try:
        holder.shell.set_next_input(text, replace=False)
    except Exception:  # a shell without a next input (a script): the cell to run is shown
        print(printable(text, lines=True))
        return
    print(
        f"{capsule.checkpoint_id} is in the next cell as %%capsule amend {capsule.checkpoint_id}: "
        "correct it there and run that cell; the next request carries the amended capsule"
    )


def capsule_amend(holder: SessionHolder, agent: AgentSession, rest: str, cell: str) -> None:
    args = parse(_amend_arguments, rest)
    entry = amend_capsule(agent.transcript, args.checkpoint, cell, counter=agent.counter)
    parent = agent.transcript.get(entry.parent_id) if entry.parent_id else None
    before = parent.checkpoint_id if isinstance(parent, CheckpointEntry | CapsuleEntry) else entry.parent_id
    print(
        f"{entry.checkpoint_id} amends {entry.amends} (by {printable(entry.author or '')} · "
        f"{entry.tokens_after:,} tokens · quality {entry.quality}); the next request carries it"
        + (f" · %rewind {before} goes back to {entry.amends}" if before else "")
    )
    holder.refresh_monitor()


@magic_arguments(name="capsule diff")
@argument("checkpoint", nargs="?", help="Checkpoint id of a capsule; default: the latest capsule on the path.")
def _diff_arguments() -> None:
    """List what a capsule replaced (requests, tool calls, files), marking what it does not mention."""


@magic_arguments(name="capsule edit")
@argument("checkpoint", nargs="?", help="Checkpoint id of the latest capsule on the path (the default).")
def _edit_arguments() -> None:
    """Put the capsule's Markdown into the next cell as %%capsule amend CHECKPOINT."""


@magic_arguments(name="capsule amend")
@argument("checkpoint", help="Checkpoint id of the capsule the cell corrects (the latest on the path).")
def _amend_arguments() -> None:
    """Append the cell's Markdown (all 13 headings) as the corrected capsule."""
