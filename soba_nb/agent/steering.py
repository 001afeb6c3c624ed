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

from soba_nb.agent.events import AgentEvent, Notice, Steered
from soba_nb.inbox import Edit, Steer, take
from soba_nb.transcript.entries import EditDecision, MessageEntry
from soba_nb.transcript.store import Transcript

ACCEPTED = "The user accepted your proposed edit of In [{n}]: the cell now holds it (not run yet)."
REJECTED = "The user rejected your proposed edit of In [{n}]; the cell keeps its source."


def decision_text(edit: Edit) -> str:
    """What the model is told of the user's decision."""
    return (ACCEPTED if edit.decision == "accepted" else REJECTED).format(n=edit.execution_count)


def entry_of(message: Steer | Edit) -> MessageEntry:
    """The transcript entry a message becomes."""
    if isinstance(message, Steer):
        return MessageEntry(role="user", content=message.text, steer=True)
    decision = EditDecision(call=message.call, execution_count=message.execution_count, decision=message.decision)
    return MessageEntry(role="user", content=decision_text(message), edit=decision)


def take_inbox(inbox: Path, transcript: Transcript, emit: Callable[[AgentEvent], None]) -> list[MessageEntry]:
    """Every message waiting in `inbox` (`SessionLayout.inbox`), appended to `transcript` in
    sending order; each steer is told (`Steered`), each file set aside said in one line. The
    entries appended."""
    taken = take(inbox)
    for problem in taken.problems:
        emit(Notice(problem, "warning"))
    appended = []
    for message in taken.messages:
        entry = entry_of(message)
        transcript.append(entry)
        appended.append(entry)
        if isinstance(message, Steer):
            emit(Steered(message.text))
    return appended

