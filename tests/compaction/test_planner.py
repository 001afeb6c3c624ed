"""Cut-point planning (SPEC §5): kept tail size, tool groups intact, repeated compaction."""

from __future__ import annotations

import pytest
from compaction_support import add_exchange, add_tool_group, open_transcript, words

from soba_nb.compaction.planner import NothingToCompact, plan_cut, valid_cuts
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import (
    CapsuleEntry,
    MessageEntry,
    ToolCallEntry,
    ToolResultEntry,
)


@pytest.fixture
def counter():
    return TokenCounter.for_model("openai", "gpt-4o")


def test_kept_tail_is_about_keep_recent_tokens(tmp_path, counter):
    t = open_transcript(tmp_path)
    for i in range(10):
        add_exchange(t, 200, index=i)
    cut = plan_cut(t.path(), counter, keep_recent_tokens=600)
    assert 600 <= cut.kept_tokens < 600 + 250
    assert cut.summarized_tokens > 0
    assert isinstance(t.get(cut.first_kept_entry_id), MessageEntry)


def test_cut_never_separates_a_call_from_its_results(tmp_path, counter):
    t = open_transcript(tmp_path)
    add_exchange(t, 200, index=0)
    add_tool_group(t, 300, calls=3)
    t.append(MessageEntry(role="assistant", content=words(20)))
    # The budget boundary falls inside the run of three results: the cut moves earlier.
    cut = plan_cut(t.path(), counter, keep_recent_tokens=400)
    kept_calls = {e.call_id for e in cut.kept if isinstance(e, ToolCallEntry)}
    kept_results = {e.call_id for e in cut.kept if isinstance(e, ToolResultEntry)}
    assert kept_calls == kept_results and len(kept_calls) == 3
    assert cut.kept_tokens > 400


def test_nothing_to_compact_when_everything_fits_the_kept_window(tmp_path, counter):
    t = open_transcript(tmp_path)
    add_exchange(t, 100)
    with pytest.raises(NothingToCompact, match="nothing to compact"):
        plan_cut(t.path(), counter, keep_recent_tokens=5000)


def test_repeated_compaction_starts_from_the_previous_first_kept_entry(tmp_path, counter):
    t = open_transcript(tmp_path)
    for i in range(6):
        add_exchange(t, 200, index=i)
    first = plan_cut(t.path(), counter, keep_recent_tokens=500)
    capsule = t.append(
        CapsuleEntry(
            operation_id="op1", checkpoint_id="ck_00000001", trigger="user", quality="full",
            tokens_before=1, tokens_after=1, first_kept_entry_id=first.first_kept_entry_id, content="x",
        )
    )
    for i in range(6, 9):
        add_exchange(t, 200, index=i)
    second = plan_cut(t.path(), counter, keep_recent_tokens=500)
    assert second.previous is not None and second.previous.id == capsule.id
    summarized_ids = [e.id for e in second.summarize]
    # What the previous capsule kept is summarized now, not lost.
    assert summarized_ids[0] == first.first_kept_entry_id
    assert capsule.id not in summarized_ids


def test_forced_plan_may_keep_less_but_never_drops_the_last_group(tmp_path, counter):
    t = open_transcript(tmp_path)
    for i in range(4):
        add_exchange(t, 400, index=i)
    ids = add_tool_group(t, 1500)
    cut = plan_cut(t.path(), counter, keep_recent_tokens=3000, max_kept_tokens=100)
    kept_ids = {e.call_id for e in cut.kept if isinstance(e, ToolResultEntry)}
    assert kept_ids == set(ids)
    assert cut.kept_tokens < 3000


def test_valid_cuts_are_messages_with_every_call_answered(tmp_path):
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="a"))
    t.append(MessageEntry(role="assistant", content="b"))
    t.append(ToolCallEntry(call_id="c1", name="python", arguments="{}"))
    t.append(MessageEntry(role="assistant", content="interleaved, not a valid cut"))
    t.append(ToolResultEntry(call_id="c1", name="python", content="ok"))
    t.append(MessageEntry(role="user", content="c"))
    entries = t.path()
    assert [entries[i].content for i in valid_cuts(entries)] == ["a", "b", "c"]


def test_nothing_to_compact_says_what_is_kept_and_what_the_session_has(tmp_path, counter):
    """In plain words with both figures, never "empty" beside a token count."""
    t = open_transcript(tmp_path)
    add_exchange(t, 100)
    cut = plan_cut(t.path(), counter, keep_recent_tokens=10)
    total = cut.kept_tokens + cut.summarized_tokens
    with pytest.raises(NothingToCompact) as short:
        plan_cut(t.path(), counter, keep_recent_tokens=20_000)
    assert str(short.value) == (
        f"nothing to compact: the last 20,000 tokens are kept whole (compaction.keepRecentTokens) "
        f"and the session has {total:,}; nothing older to compact"
    )
    # a first request longer than the kept window: keeping it whole reaches back to the start
    t = open_transcript(tmp_path / "long")
    t.append(MessageEntry(role="user", content=words(3000)))
    t.append(MessageEntry(role="assistant", content=words(20)))
    with pytest.raises(NothingToCompact) as long:
        plan_cut(t.path(), counter, keep_recent_tokens=1000)
    said = str(long.value)
    assert said.startswith("nothing to compact: the session has 3,") and "keeping its last 1,000 whole reaches back to its start" in said
    assert "empty" not in said
