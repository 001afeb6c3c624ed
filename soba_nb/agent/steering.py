"""The session folder's mailbox taken into the transcript (SPEC §18, `soba_nb.inbox`).

What the sidebar sent while a turn ran becomes entries the next request carries: a steer is a
user `message` with `steer: true` (part of the request being worked on: it reaches the model
after the results of the step that ran, without interrupting a call); an edit decision is a
user `message` telling the model what became of its proposed cell edit, with `edit`. The turn
loop takes the mailbox as a turn starts and at every tool boundary (before each request that
follows tool results); the sidebar's `inbox` control takes it when the kernel is idle.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from soba_nb.agent.cell_edits import decision_entry
from soba_nb.agent.events import AgentEvent, Notice, Steered
from soba_nb.inbox import Edit, Steer, take
from soba_nb.transcript.entries import MessageEntry
from soba_nb.transcript.store import Transcript


def entry_of(message: Steer | Edit) -> MessageEntry:
    """The transcript entry a message becomes."""
    if isinstance(message, Steer):
        return MessageEntry(role="user", content=message.text, steer=True)
    return decision_entry(message.call, message.execution_count, message.decision)


def take_inbox(inbox: Path, transcript: Transcript, emit: Callable[[AgentEvent], None]) -> list[MessageEntry]:
    """Every message waiting in `inbox` (`SessionLayout.inbox`), appended to `transcript` in
    sending order; each steer is told (`Steered`), each file set aside said in one line. The
    entries appended. A message is removed only once its entry is written: a transcript that
    cannot be written (`TranscriptWriteError`) leaves it for next time."""
    appended: list[MessageEntry] = []

    def accept(message: Steer | Edit) -> None:
        entry = entry_of(message)
        transcript.append(entry)
        appended.append(entry)
        if isinstance(message, Steer):
            emit(Steered(message.text))

    for problem in take(inbox, accept).problems:
        emit(Notice(problem, "warning"))
    return appended
