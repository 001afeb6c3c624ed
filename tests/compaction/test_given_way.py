"""The capsule gives way entirely (SPEC §17, §12): in a window that takes the system prompt, the
tool schemas and the request being worked on but not the bare capsule, the continuation is made
to fit with a capsule of one line naming its checkpoint, or with none; only a request that
cannot fit even alone is refused, and the refusal says so. Each window here is measured (the
fakes' system prompt and tools are 37 tokens, the request 197 or 307 and its calls 117)."""

from __future__ import annotations

import pytest
from compaction.test_fitting import after_a_capsule_the_request_grows, capsule_of
from compaction_support import make_compactor, open_transcript, thresholds, words

from soba_nb.capsule_files.export import CapsuleExportError, export_capsule
from soba_nb.capsule_files.memory import should_mirror
from soba_nb.cli.verify import integrity_problems
from soba_nb.compaction.compactor import HardLimitExceeded
from soba_nb.compaction.deterministic import BARE_NOTE
from soba_nb.compaction.given_way import as_capsule, given_way_form, model_text
from soba_nb.compaction.outcomes import Outcome
from soba_nb.compaction.requests import split_goal
from soba_nb.compaction.triggers import TurnState
from soba_nb.transcript.entries import CapsuleEntry, MessageEntry, ToolCallEntry, ToolResultEntry
from soba_nb.transcript.store import Transcript

REQUEST = "What now? " + words(190)


def request_in_the_tail(tmp_path, hard: int):
    """A session whose request being worked on is its last message (the kept tail holds it),
    compacted at the preflight in a window of `hard` tokens."""
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="Load the data. " + words(100)))
    t.append(MessageEntry(role="assistant", content=words(200)))
    for index in range(5):
        t.append(MessageEntry(role="user", content=f"unanswered {index} " + words(60)))
    t.append(MessageEntry(role="user", content=REQUEST))
    engine = make_compactor(t, thresholds(hard=hard, keep=hard - 50, min_tokens=100, min_reclaimable=50))
    result = engine.preflight(TurnState(soft_attempted=True))
    assert result is not None
    return t, engine, result


def test_where_the_bare_capsule_does_not_fit_a_capsule_of_one_line_does(tmp_path):
    t, engine, result = request_in_the_tail(tmp_path, hard=350)  # the bare capsule made 402
    assert result.outcome is Outcome.COMPLETED, result.reason
    capsule = capsule_of(t)
    assert given_way_form(capsule.content) == "one line" and capsule.quality == "degraded"
    assert capsule.content.count("\n") == 1  # one line: the tail holds the request
    assert "it is one line" in result.reason
    sent = engine.request_for_sending()
    assert sent.tokens <= 350
    first, last = sent.messages
    assert first.role == "user" and first.content.startswith(f"Context Capsule {capsule.checkpoint_id}: ")
    assert "Work on the newest user request." in first.content and BARE_NOTE not in first.content
    assert last.content == REQUEST  # whole, after the line


def request_in_the_capsule(tmp_path, hard: int):
    """A session whose request being worked on made three steps (a call each) before the
    preflight: in a window of `hard` tokens only the last step is kept, and the capsule carries
    the request (SPEC §5: whole)."""
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="Load the data. " + words(100)))
    t.append(MessageEntry(role="assistant", content=words(200)))
    request = "Compute the totals. " + words(100)
    t.append(MessageEntry(role="user", content=request))
    for n in range(3):
        t.append(MessageEntry(role="assistant", content=f"Step {n}."))
        t.append(ToolCallEntry(call_id=f"c{n}", name="python", arguments='{"code": "x"}'))
        t.append(ToolResultEntry(call_id=f"c{n}", name="python", content=words(80)))
    engine = make_compactor(t, thresholds(hard=hard, keep=hard - 50, min_tokens=100, min_reclaimable=50))
    result = engine.preflight(TurnState(soft_attempted=True))
    assert result is not None and result.outcome is Outcome.COMPLETED, result.reason
    return t, engine, request


def test_a_one_line_capsule_carries_the_request_it_replaces_whole(tmp_path):
    t, engine, request = request_in_the_capsule(tmp_path, hard=360)
    sent = engine.request_for_sending()
    capsule = capsule_of(t)
    assert given_way_form(capsule.content) == "one line"
    assert sent.tokens <= 360
    line = sent.messages[0].content
    assert line.startswith(f"Context Capsule {capsule.checkpoint_id}: ")
    assert f"1. in progress:\n\n```text\n{request}\n```" in line
    assert [(m.role, m.content) for m in sent.messages[1:2]] == [("assistant", "Step 2.")]  # the last step, whole
    assert [m.role for m in sent.messages] == ["user", "assistant", "tool"]
    # The next compaction rolls it up: read as a capsule, its Goal section holds the request.
    requests, _ = split_goal(as_capsule(capsule.content).goal_and_constraints)
    assert [r.text for r in requests.items] == [request]


def test_where_not_even_one_line_fits_no_capsule_is_sent(tmp_path):
    t, engine, result = request_in_the_tail(tmp_path, hard=260)  # one line made 285
    assert result.outcome is Outcome.COMPLETED, result.reason
    capsule = capsule_of(t)
    assert given_way_form(capsule.content) == "none"
    assert "no capsule is sent" in result.reason
    sent = engine.request_for_sending()
    assert sent.tokens <= 260
    assert [(m.role, m.content) for m in sent.messages] == [("user", REQUEST)]  # nothing else
    assert engine.measure().effective <= 260


def test_with_no_capsule_the_request_it_carries_is_sent_as_the_user_sent_it(tmp_path):
    t, engine, request = request_in_the_capsule(tmp_path, hard=300)
    sent = engine.request_for_sending()
    capsule = capsule_of(t)
    assert given_way_form(capsule.content) == "none" and model_text(capsule.content) == request
    assert sent.tokens <= 300
    assert [(m.role, m.content) for m in sent.messages[:2]] == [("user", request), ("assistant", "Step 2.")]
    assert [m.role for m in sent.messages] == ["user", "assistant", "tool"]


def test_only_when_system_tools_and_request_alone_are_over_is_it_refused(tmp_path):
    _, _, result = request_in_the_tail(tmp_path, hard=230)  # 37 + 197 = 234
    assert result.outcome is Outcome.FAILED
    assert result.reason == (
        "the request being worked on cannot fit even alone: with no capsule at all the continuation is 234 tokens "
        "(system prompt and tools 37, the request 197), above hardLimit 230"
    )


def test_a_request_whose_own_calls_leave_no_room_even_without_a_capsule_is_refused(tmp_path):
    t, engine, _ = after_a_capsule_the_request_grows(tmp_path, hard=450)  # 37 + 307 + 117
    with pytest.raises(HardLimitExceeded) as raised:
        engine.request_for_sending()
    message = str(raised.value)
    assert "cannot fit even alone: with no capsule at all" in message
    assert "(system prompt and tools 37, the request 307, the calls it made since 117)" in message


@pytest.mark.parametrize("hard, form", [(350, "one line"), (260, "none")])
def test_a_capsule_that_gave_way_is_read_for_what_it_is(tmp_path, hard, form):
    """Transcript readers: it reopens and verifies; project memory never mirrors it (not even
    one claiming `full` from a `%compact`); export refuses it in one line, saying what it is."""
    t, engine, _ = request_in_the_tail(tmp_path, hard=hard)
    capsule = capsule_of(t)
    assert given_way_form(capsule.content) == form
    reopened = Transcript.load(t.file)
    assert isinstance(reopened.get(capsule.id), CapsuleEntry) and integrity_problems(reopened) == []
    forged = CapsuleEntry(**{**{f: getattr(capsule, f) for f in capsule.__struct_fields__}, "quality": "full", "trigger": "user"})
    assert not should_mirror(forged, explicit_compact=True)
    with pytest.raises(CapsuleExportError) as raised:
        export_capsule(t, capsule.checkpoint_id, tmp_path, project_root=tmp_path)
    what = "is one line" if form == "one line" else "is no capsule"
    assert str(raised.value).startswith(f"capsule {capsule.checkpoint_id} cannot be exported: it {what}")
    assert not list(tmp_path.glob("*.capsule.md"))
