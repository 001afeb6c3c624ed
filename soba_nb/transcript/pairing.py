"""Which result answers which tool call, by their order on the path.

A call id is unique within one answer, not within a session: servers that number the calls
of each answer (`call_0` in every answer: llama.cpp builds, LM Studio, test servers) reuse ids
turn after turn. A result answers the latest call before it with its id that has no result yet,
so readers that pair calls and results across a session (the capsule's scan, the provenance of
variables) go by this, never by a dictionary of call ids.
"""

from __future__ import annotations

from collections.abc import Iterable

from soba_nb.transcript.entries import Entry, ToolCallEntry, ToolResultEntry


def results_by_call(entries: Iterable[Entry]) -> dict[str, ToolResultEntry]:
    """Each answered call's result, keyed by the call ENTRY's id (`ToolCallEntry.id`)."""
    found: dict[str, ToolResultEntry] = {}
    waiting: dict[str, str] = {}
    for entry in entries:
        if type(entry) is ToolCallEntry:
            waiting[entry.call_id] = entry.id
        elif type(entry) is ToolResultEntry:
            call = waiting.pop(entry.call_id, None)
            if call is not None:
                found[call] = entry
    return found
