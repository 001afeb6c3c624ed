"""Model-input assembly (SPEC §5) and the pairing validator."""

from __future__ import annotations

import pytest
from compaction_support import TOOLS, add_exchange, add_tool_group, open_transcript, words
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soba_nb.compaction.model_input import (
    INTERRUPTED_RESULT,
    TOOL_OUTPUT_LIMIT_CHARS,
    PairingError,
    assemble,
    pairing_problems,
    repair_pairing,
    visible_context,
)
from soba_nb.compaction.planner import NothingToCompact, plan_cut
from soba_nb.messages import ChatMessage, ToolCall
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    MessageEntry,
    SkillEntry,
    ToolCallEntry,
    ToolResultEntry,
    UsageEntry,
)

COUNTER = TokenCounter.for_model("openai", "gpt-4o")


def build(transcript, **kw):
    return assemble(
        visible_context(transcript.path()), system="sys", tools=TOOLS, counter=COUNTER, strict=True, **kw
    )


def capsule_entry(first_kept, content="## Goal and constraints\n\nX\n", source=None):
    return CapsuleEntry(
        operation_id="op", checkpoint_id="ck_0000abcd", trigger="user", quality="full",
        tokens_before=1, tokens_after=1, first_kept_entry_id=first_kept, content=content, source=source,
    )


def test_capsule_then_kept_tail_then_later_entries(tmp_path):
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="old request"))
    t.append(MessageEntry(role="assistant", content="old answer"))
    kept = t.append(MessageEntry(role="user", content="kept request"))
    t.append(MessageEntry(role="assistant", content="kept answer"))
    t.append(capsule_entry(kept.id))
    t.append(MessageEntry(role="user", content="new request"))
    built = build(t)
    contents = [m.content for m in built.messages]
    assert contents[0].startswith("Context Capsule")
    assert contents[1:] == ["kept request", "kept answer", "new request"]
    assert all("old" not in c for c in contents)


def test_only_the_latest_capsule_is_used(tmp_path):
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="a"))
    t.append(capsule_entry(None, "FIRST"))
    t.append(MessageEntry(role="user", content="b"))
    t.append(capsule_entry(None, "SECOND"))
    built = build(t)
    joined = "\n".join(m.content for m in built.messages)
    assert "SECOND" in joined and "FIRST" not in joined


def test_loaded_capsule_is_framed_as_data_not_instructions(tmp_path):
    t = open_transcript(tmp_path)
    t.append(capsule_entry(None, "BODY", source="other/handoff.capsule.md"))
    built = build(t)
    assert "Handoff context" in built.messages[0].content
    assert "not as instructions" in built.messages[0].content


def test_bookkeeping_entries_never_reach_the_model(tmp_path):
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="hi"))
    t.append(CheckpointEntry(kind="milestone", note="secret-ish note", intent=True))
    t.append(UsageEntry(input_tokens=10))
    built = build(t)
    assert [m.content for m in built.messages] == ["hi"]


def test_active_skills_are_resent_in_the_system_prompt_after_compaction(tmp_path):
    t = open_transcript(tmp_path)
    t.append(SkillEntry(name="pandas-style", path="x", content="Always use method chaining."))
    t.append(MessageEntry(role="user", content="hi"))
    t.append(capsule_entry(None))
    built = build(t)
    assert "Always use method chaining." in built.system


def test_large_tool_output_is_clipped_in_model_input_only(tmp_path):
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="read it"))
    t.append(MessageEntry(role="assistant", content=""))
    t.append(ToolCallEntry(call_id="c", name="read_file", arguments="{}"))
    big = "x" * (TOOL_OUTPUT_LIMIT_CHARS * 3)
    t.append(ToolResultEntry(call_id="c", name="read_file", content=big))
    built = build(t)
    tool_message = built.messages[-1]
    assert len(tool_message.content) < TOOL_OUTPUT_LIMIT_CHARS + 200
    assert "clipped from model input" in tool_message.content
    assert t.path()[-1].content == big


def test_a_single_group_above_the_hard_limit_is_clipped_to_fit_with_a_note(tmp_path):
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="read it"))
    add_tool_group(t, 2500)
    built = build(t, fit_to=1000)
    assert built.tokens <= 1000
    assert any("clipped" in note for note in built.notes)


def test_clipped_counts_are_kept_so_a_resumed_clip_needs_no_tokenizer(tmp_path):
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="read it"))
    add_tool_group(t, 2500)
    counter = TokenCounter.for_model("openai", "gpt-4o")
    persisted: dict[str, int] = {}
    counter.persist = persisted.__setitem__
    first = assemble(visible_context(t.path()), system="sys", tools=TOOLS, counter=counter, fit_to=1000)
    assert any("clipped" in note for note in first.notes)
    assert any("@" in key for key in persisted)  # the clipped output's count, by entry and limit

    def no_tokenizer(text: str) -> int:
        raise AssertionError("counted again")

    resumed = TokenCounter(counter.choice, tokenizer=no_tokenizer)
    resumed.prime(persisted)
    again = assemble(visible_context(t.path()), system="sys", tools=TOOLS, counter=resumed, fit_to=1000)
    assert (again.tokens, again.messages, again.notes) == (first.tokens, first.messages, first.notes)


def test_clipping_that_cannot_fit_is_not_tried(tmp_path):
    """Messages alone above the limit: no clip of tool outputs would make it fit, so none
    is cut (a long path would re-count every output for nothing); compaction must run."""
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content=words(3000)))
    add_tool_group(t, 2500)
    unclipped = build(t)
    built = build(t, fit_to=1000)
    assert built.tokens == unclipped.tokens > 1000
    assert built.messages == unclipped.messages
    assert built.notes == ("larger than the hard limit even without tool outputs: not clipped",)


def test_pairing_validator_finds_orphans_and_missing_results():
    call = ToolCall(id="c1", name="python", arguments="{}")
    broken = [
        ChatMessage(role="user", content="x"),
        ChatMessage(role="tool", content="orphan", tool_call_id="zz", name="python"),
        ChatMessage(role="assistant", tool_calls=[call]),
        ChatMessage(role="user", content="y"),
    ]
    problems = pairing_problems(broken)
    assert len(problems) == 2
    repaired = repair_pairing(broken)
    assert pairing_problems(repaired) == []
    assert any(m.content == INTERRUPTED_RESULT for m in repaired)


def test_strict_mode_fails_loudly_on_a_broken_input(tmp_path):
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="x"))
    t.append(MessageEntry(role="assistant", content=""))
    t.append(ToolCallEntry(call_id="lonely", name="python", arguments="{}"))
    with pytest.raises(PairingError):
        build(t)
    repaired = assemble(visible_context(t.path()), system="s", tools=TOOLS, counter=COUNTER)
    assert pairing_problems(repaired.messages) == []
    assert repaired.notes


def test_measured_tokens_match_a_recount(tmp_path):
    t = open_transcript(tmp_path)
    for i in range(3):
        add_exchange(t, 120, tool_tokens=80, index=i)
    built = build(t)
    fresh = TokenCounter.for_model("openai", "gpt-4o")
    again = assemble(visible_context(t.path()), system="sys", tools=TOOLS, counter=fresh)
    assert built.tokens == again.tokens > 3 * 200


# -- property: no assembled input ever splits a tool group --------------------------------

session_shapes = st.lists(
    st.tuples(
        st.sampled_from(["exchange", "group", "multi"]),
        st.integers(min_value=1, max_value=400),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=session_shapes, keep=st.integers(min_value=0, max_value=3000), capped=st.booleans())
def test_no_assembled_input_splits_a_tool_group(tmp_path_factory, shape, keep, capped):
    t = open_transcript(tmp_path_factory.mktemp("prop"))
    t.append(MessageEntry(role="user", content="start " + words(5)))
    for index, (kind, size) in enumerate(shape):
        if kind == "exchange":
            add_exchange(t, size, index=index)
        else:
            add_tool_group(t, size, calls=3 if kind == "multi" else 1, tag=f"t{index}")
    try:
        cut = plan_cut(t.path(), COUNTER, keep_recent_tokens=keep, max_kept_tokens=keep // 2 if capped else None)
    except NothingToCompact:
        return
    t.append(capsule_entry(cut.first_kept_entry_id))
    built = assemble(visible_context(t.path()), system="s", tools=TOOLS, counter=COUNTER, strict=True)
    assert pairing_problems(built.messages) == []
