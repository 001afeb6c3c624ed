"""A steer sent into a running turn (SPEC §18) is part of the request being worked on, not a
new request: capsules quote it with that request, and the current request stays the one that
started the turn (SPEC §14)."""

from __future__ import annotations

from soba_nb.compaction.capsule import parse_capsule, render_capsule
from soba_nb.compaction.deterministic import build_deterministic_capsule
from soba_nb.compaction.planner import current_request
from soba_nb.compaction.requests import STEER_MARK, split_goal
from soba_nb.transcript.entries import (
    EditDecision,
    Entry,
    MessageEntry,
    ToolCallEntry,
    ToolResultEntry,
)

REQUEST = "count the orders by city"
STEER = "use the region column, not the city"


def quoted(entries: list[Entry], **options: object) -> list[tuple[str, str]]:
    capsule = build_deterministic_capsule(entries, **options)  # type: ignore[arg-type]
    requests, _ = split_goal(parse_capsule(render_capsule(capsule)).goal_and_constraints)  # type: ignore[union-attr]
    return [(request.status, request.text) for request in requests.items]


def step(number: int, result: str = "ok") -> list[Entry]:
    call = f"call_{number}"
    return [
        MessageEntry(role="assistant", content=""),
        ToolCallEntry(call_id=call, name="python", arguments='{"code": "x"}'),
        ToolResultEntry(call_id=call, name="python", content=result),
    ]


def steer(text: str = STEER) -> MessageEntry:
    return MessageEntry(role="user", content=text, steer=True)


def test_a_steer_is_quoted_with_the_request_it_steered_not_as_a_new_one():
    entries = [MessageEntry(role="user", content=REQUEST), *step(1), steer(), *step(2)]
    assert quoted(entries) == [("in progress", f"{REQUEST}\n\n{STEER_MARK}{STEER}")]
    answered = [*entries, MessageEntry(role="assistant", content="By region: 4 regions.")]
    assert quoted(answered) == [("done", f"{REQUEST}\n\n{STEER_MARK}{STEER}")]


def test_the_current_request_is_the_one_that_started_the_turn_not_the_steer():
    request = MessageEntry(role="user", content=REQUEST)
    decision = EditDecision(call="call_9", execution_count=4, decision="accepted")
    edit = MessageEntry(role="user", content="The user accepted your proposed edit of In [4]", edit=decision)
    path: list[Entry] = [request, *step(1), steer(), *step(2), edit]
    assert current_request(path) is request


def test_an_edit_decision_is_no_request():
    decision = EditDecision(call="call_9", execution_count=4, decision="rejected")
    edit = MessageEntry(role="user", content="The user rejected your proposed edit of In [4]", edit=decision)
    entries = [MessageEntry(role="user", content=REQUEST), *step(1), edit, *step(2)]
    assert quoted(entries) == [("in progress", REQUEST)]


def test_a_steer_after_a_capsule_joins_the_request_that_capsule_left_in_progress():
    request = MessageEntry(role="user", content=REQUEST)
    first = build_deterministic_capsule([request, *step(1)])
    later = [*step(2), steer("and mind the nulls"), *step(3)]
    rolled = quoted(later, previous=first, current=request)
    assert rolled == [("in progress", f"{REQUEST}\n\n{STEER_MARK}and mind the nulls")]
    # Rolled up again: the request once, with both steers, in order.
    second = build_deterministic_capsule(later, previous=first, current=request)
    again = quoted([*step(4), steer(), *step(5)], previous=second, current=request)
    assert again == [("in progress", f"{REQUEST}\n\n{STEER_MARK}and mind the nulls\n\n{STEER_MARK}{STEER}")]
