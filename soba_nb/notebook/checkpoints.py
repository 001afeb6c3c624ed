"""Checkpoints as a person uses them: `%checkpoint`, the list `%rewind` shows, Tab completion.

A checkpoint is a named point on the path (SPEC §7): every finished turn records one
(`turn`), the agent records `milestone` / `plan_pivot` ones with its `checkpoint` tool, a
person records `user` ones with `%checkpoint NOTE`, and every capsule carries one. The list
shows the recent ones of the whole session, newest last, with their local time and note (a
turn's note is the request that started it), and says which are on another branch (after
a `%rewind`), so any of them can be returned to.
"""

from __future__ import annotations

from datetime import datetime

from soba_nb.compaction.requests import is_request
from soba_nb.printable import note_line
from soba_nb.transcript.entries import CapsuleEntry, CheckpointEntry, Entry, MessageEntry
from soba_nb.transcript.store import Transcript

LISTED = 20
"""Checkpoints `%rewind` lists; earlier ones are counted."""
KINDS = ("milestone", "plan_pivot")
"""Kinds `%checkpoint` accepts before the note (otherwise the kind is `user`)."""

Marked = CheckpointEntry | CapsuleEntry


def checkpoints(transcript: Transcript) -> list[Marked]:
    """Every checkpoint and capsule in the session, oldest first."""
    return [e for e in transcript.entries if isinstance(e, CheckpointEntry | CapsuleEntry)]


def checkpoint_ids(transcript: Transcript) -> list[str]:
    """Checkpoint ids, newest first (what Tab offers after `%rewind`)."""
    return list(dict.fromkeys(e.checkpoint_id for e in reversed(checkpoints(transcript))))


def checkpoint_lines(transcript: Transcript, limit: int = LISTED) -> list[str]:
    """`ck_1a2b3c4d · turn · 14:02 · "clean df in place"` lines, newest last."""
    marked = checkpoints(transcript)
    on_path = {entry.id for entry in transcript.path_view()}
    lines = [] if len(marked) <= limit else [f"… {len(marked) - limit} earlier"]
    for entry in marked[-limit:]:
        kind = entry.kind if isinstance(entry, CheckpointEntry) else f"capsule ({entry.trigger})"
        parts = [entry.checkpoint_id, kind, local_time(entry.timestamp)]
        if note := _note(transcript, entry):
            parts.append(note)
        if entry.id not in on_path:
            parts.append("other branch")
        lines.append(" · ".join(parts))
    return lines


def local_time(timestamp: str) -> str:
    """`14:02` today, `Dec 02 14:02` on another day (local time)."""
    try:
        moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00")).astimezone()
    except ValueError:
        return timestamp
    today = datetime.now().astimezone().date()
    return moment.strftime("%H:%M" if moment.date() == today else "%b %d %H:%M")


def _note(transcript: Transcript, entry: Marked) -> str:
    if isinstance(entry, CapsuleEntry):
        return note_line(entry.title or "")
    if entry.note:
        return note_line(entry.note)
    if entry.kind == "turn":
        request = _request_of(transcript, entry)
        return f'"{note_line(request)}"' if request else ""
    return ""


def _request_of(transcript: Transcript, entry: Entry) -> str | None:
    """The user message that started the turn `entry` ends (walking up its parents; a steer
    sent into the turn is part of it, not its request)."""
    current: Entry | None = entry
    while current is not None and current.parent_id is not None:
        current = transcript.get(current.parent_id)
        if isinstance(current, MessageEntry) and is_request(current):
            return current.content
        if isinstance(current, CheckpointEntry) and current.kind == "turn":
            return None
    return None


def resume_line(transcript: Transcript, session_id: str) -> str:
    """What a new kernel says at its first turn on a session from before: which one, how
    much it holds, and when it was last used (issue 26: resuming is never silent)."""
    path = transcript.path_view()
    turns = sum(1 for entry in path if isinstance(entry, CheckpointEntry) and entry.kind == "turn")
    last = local_time(path[-1].timestamp) if path else "-"
    return (
        f"resumed session {session_id} ({turns} turn{'' if turns == 1 else 's'}, last at {last}); "
        "%soba --new starts a new one"
    )

