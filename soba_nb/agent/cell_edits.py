"""The user's decision on a cell edit the agent proposed (`edit_cell`, SPEC §18), as an entry.

A decision is a user `message` whose content tells the model what became of its proposal, with
the `edit` field naming the call, the cell and the decision. It arrives through the session
folder's inbox while a turn runs or when the kernel is idle (`agent.steering`), or as the
sidebar's `edit` control request (`notebook.controls`); both make it here, so the model reads
one wording.

An accepted edit changes nothing in the kernel: the frontend replaced the cell's source, not
run. The recorded cell — what `read_cells` and the cells block show — is the run that was, so
the content says so; the edited cell reaches the model when the user runs it, as a new In [n].
"""

from __future__ import annotations

import json
from typing import Literal

from soba_nb.transcript.entries import EditDecision, MessageEntry, ToolCallEntry
from soba_nb.transcript.store import Transcript

Decision = Literal["accepted", "rejected"]
DECISIONS: tuple[Decision, ...] = ("accepted", "rejected")
TOOL = "edit_cell"
MAX_CALL_ID_CHARS = 200
ACCEPTED = (
    "The user accepted your proposed edit of In [{n}]: the cell now holds it (not run yet; "
    "read_cells shows In [{n}] as it ran, and its next run gets a new number)."
)
REJECTED = "The user rejected your proposed edit of In [{n}]; the cell keeps its source."


class DecisionError(ValueError):
    """A decision that names no proposal of this session, or is not one; one line."""


def decision_text(execution_count: int, decision: Decision) -> str:
    """What the model is told of the user's decision."""
    return (ACCEPTED if decision == "accepted" else REJECTED).format(n=execution_count)


def decision_entry(call: str, execution_count: int, decision: Decision) -> MessageEntry:
    """The user message a decision becomes."""
    edit = EditDecision(call=call, execution_count=execution_count, decision=decision)
    return MessageEntry(role="user", content=decision_text(execution_count, decision), edit=edit)


def record_decision(transcript: Transcript, call: object, execution_count: object, decision: object) -> MessageEntry:
    """Append the decision on the `edit_cell` call `call` that proposed an edit of In
    [execution_count], after checking each field, that the call is one on the session's path
    and that it was not decided already; the entry appended. Raises `DecisionError`."""
    if not isinstance(call, str) or not call.strip() or len(call) > MAX_CALL_ID_CHARS:
        raise DecisionError("edit: give call, the id of the edit_cell call")
    if not isinstance(execution_count, int) or isinstance(execution_count, bool) or execution_count < 0:
        raise DecisionError(f"edit: executionCount must be a cell's In [n], not {execution_count!r}")
    if decision not in DECISIONS:
        raise DecisionError(f"edit: decision must be accepted or rejected, not {decision!r}")
    proposed: ToolCallEntry | None = None
    decided: str | None = None
    for entry in transcript.path_view():  # the latest call of that id (a server may reuse ids)
        if isinstance(entry, ToolCallEntry) and entry.call_id == call and entry.name == TOOL:
            proposed, decided = entry, None
        elif isinstance(entry, MessageEntry) and entry.edit and entry.edit.call == call:
            decided = entry.edit.decision
    if proposed is None:
        raise DecisionError(f"edit: no edit_cell call {call} in this session")
    if _count_of(proposed) != execution_count:
        raise DecisionError(f"edit: call {call} proposed an edit of In [{_count_of(proposed)}], not In [{execution_count}]")
    if decided is not None:
        raise DecisionError(f"edit: the edit of In [{execution_count}] ({call}) was already {decided}")
    entry = decision_entry(call, execution_count, decision)
    transcript.append(entry)
    return entry


def _count_of(call: ToolCallEntry) -> object:
    """The execution count an `edit_cell` call named (None when its arguments do not say)."""
    try:
        arguments = json.loads(call.arguments, strict=False)
    except (ValueError, RecursionError):
        return None
    return arguments.get("execution_count") if isinstance(arguments, dict) else None
