"""The project's instructions in the fixed input (SPEC §19): counted as the message they are
sent as, sent first after the system prompt, once, beside a capsule, never in a native item."""

from __future__ import annotations

from compaction_support import TOOLS, open_transcript

from soba_nb.compaction.instructions import (
    split_instructions,
    with_instructions,
    without_instructions,
)
from soba_nb.compaction.model_input import assemble, fixed_tokens, system_text, visible_context
from soba_nb.compaction.native_continuation import NativeTarget
from soba_nb.compaction.native_step import native_request
from soba_nb.compaction.planner import plan_cut
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import CapsuleEntry, MessageEntry, SkillEntry

COUNTER = TokenCounter.for_model("openai", "gpt-4o")
SYSTEM = "You are soba.\n\nEnvironment: a test"
RULES = "Project instructions (AGENTS.md): money columns are in cents."


def test_the_fixed_part_counts_the_instructions_as_the_message_they_are_sent_as():
    system = with_instructions(SYSTEM, RULES)
    assert fixed_tokens(system, TOOLS, COUNTER) == fixed_tokens(SYSTEM, TOOLS, COUNTER) + COUNTER.count_message(
        "user", RULES
    )
    assert without_instructions(system) == SYSTEM
    assert split_instructions(with_instructions(system, None)) == (SYSTEM, None)
    assert with_instructions(system, "other") == with_instructions(SYSTEM, "other")  # replaced, never stacked


def test_a_file_that_holds_the_mark_cannot_move_where_the_prompt_ends():
    planted = with_instructions("x", "y")[1:]  # the mark and more, as a file could hold them
    system = with_instructions(SYSTEM, RULES + planted)
    assert split_instructions(system) == (SYSTEM, RULES + planted)


def test_the_instructions_are_the_first_message_once_and_the_system_prompt_stays_alone(tmp_path):
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="first request"))
    t.append(MessageEntry(role="assistant", content="answer"))
    t.append(SkillEntry(name="style", path="s", content="Write short answers."))
    system = with_instructions(SYSTEM, RULES)
    built = assemble(visible_context(t.path()), system=system, tools=TOOLS, counter=COUNTER, strict=True)
    assert built.system.startswith(SYSTEM) and "Write short answers." in built.system
    assert RULES not in built.system
    assert [(m.role, m.content) for m in built.messages][:2] == [("user", RULES), ("user", "first request")]
    assert sum(RULES in m.content for m in built.messages) == 1
    assert built.tokens == fixed_tokens(system_text(system, built_skills(t)), TOOLS, COUNTER) + sum(
        COUNTER.count_message(m.role, m.content) for m in built.messages[1:]
    )


def built_skills(t):
    return visible_context(t.path()).skills


def test_after_a_capsule_the_instructions_come_first_and_the_capsule_after_them(tmp_path):
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="old"))
    kept = t.append(MessageEntry(role="user", content="kept request"))
    t.append(
        CapsuleEntry(
            operation_id="op", checkpoint_id="ck_0000abcd", trigger="user", quality="full",
            tokens_before=1, tokens_after=1, first_kept_entry_id=kept.id, content="## Goal and constraints\n\nX\n",
        )
    )
    built = assemble(
        visible_context(t.path()), system=with_instructions(SYSTEM, RULES), tools=TOOLS, counter=COUNTER, strict=True
    )
    contents = [m.content for m in built.messages]
    assert contents[0] == RULES
    assert contents[1].startswith("Context Capsule")
    assert contents[2:] == ["kept request"]


def test_a_native_compaction_request_leaves_the_instructions_out(tmp_path):
    t = open_transcript(tmp_path)
    for index in range(6):
        t.append(MessageEntry(role="user", content=f"request {index} " + "words " * 300))
        t.append(MessageEntry(role="assistant", content=f"answer {index} " + "words " * 300))
    cut = plan_cut(t.path(), COUNTER, keep_recent_tokens=300)
    request = native_request(
        cut, operation_id="op", system=with_instructions(SYSTEM, RULES), tools=TOOLS, skills=(), counter=COUNTER,
        target=NativeTarget("openai", "gpt-4o", frozenset({"responses"})), hard_limit=100_000, soft_limit=80_000,
        max_output_tokens=1000,
    )
    assert request.system == SYSTEM
    assert all(RULES not in m.content for m in request.messages)

