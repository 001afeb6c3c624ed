"""The budget tracker measured as a session grows (a preflight per step) gives what a fresh
tracker gives on the whole path, and the totals a plain walk of the path gives."""

from __future__ import annotations

import tempfile
from pathlib import Path

from compaction_support import make_compactor, open_transcript, words
from hypothesis import example, given, settings
from hypothesis import strategies as st

from soba_nb.compaction.budget import BudgetTracker
from soba_nb.compaction.budget_state import state_path
from soba_nb.compaction.compactor import Compactor
from soba_nb.compaction.model_input import (
    SKILLS_HEADING,
    VISIBLE_TYPES,
    capsule_tokens,
    entry_tokens,
    fixed_tokens,
)
from soba_nb.compaction.triggers import LoopGuard
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    CompactionEntry,
    Entry,
    MessageEntry,
    SkillEntry,
    ToolCallEntry,
    ToolResultEntry,
    UsageEntry,
)
from soba_nb.transcript.store import Transcript

STEP = st.sampled_from(
    ["user", "assistant", "call", "result", "usage", "truncated usage", "compaction usage", "intent", "soft compaction",
     "skill a", "skill b", "capsule", "capsule keeping", "rewind", "measure"]
)  # fmt: skip


def apply(t: Transcript, step: str, n: int) -> None:
    calls = [e.call_id for e in t.path_view() if isinstance(e, ToolCallEntry)]
    if step in ("user", "assistant"):
        t.append(MessageEntry(role=step, content=words(1 + n % 40)))
    elif step == "call":
        t.append(ToolCallEntry(call_id=f"c{n}_{len(t)}", name="python", arguments='{"code": "x = 1"}'))
    elif step == "result" and calls:
        t.append(ToolResultEntry(call_id=calls[n % len(calls)], name="python", content=words(5 + n % 90)))
    elif step == "compaction usage":  # a summary request's figure: its prompt, not the path
        t.append(UsageEntry(input_tokens=100_000 + n, operation="compaction", operation_id=f"op{n}"))
    elif step.endswith("usage"):
        t.append(UsageEntry(input_tokens=100 + 37 * n, truncated=step.startswith("truncated")))
    elif step == "intent":
        t.append(CheckpointEntry(kind="turn", note="done", intent=True))
    elif step == "soft compaction":
        intents = [e.checkpoint_id for e in t.path_view() if isinstance(e, CheckpointEntry) and e.intent]
        t.append(CompactionEntry(operation_id=f"op{n}", trigger="auto_threshold", outcome="skipped", reason="roi",
                                 consumed=intents[: n % 3], tokens_before=500 + n))  # fmt: skip
    elif step.startswith("skill"):
        t.append(SkillEntry(name=step[-1], path=f"skills/{step[-1]}.md", content=words(3 + n % 20)))
    elif step.startswith("capsule"):
        path = t.path_view()
        kept = path[len(path) // 2].id if step == "capsule keeping" and len(path) > 2 else None
        t.append(CapsuleEntry(operation_id=f"op{n}", checkpoint_id=f"ck_{n:08x}", trigger="user", quality="full",
                              tokens_before=900, tokens_after=300, estimated_before=800 + n % 2 * 100,
                              first_kept_entry_id=kept, content="## Goal and constraints\n" + words(4)))  # fmt: skip
    elif step == "rewind" and len(t.path_view()) > 2:
        path = t.path_view()
        t.rewind(path[1 + n % (len(path) - 1)].id)


def play(folder: Path, steps: list[tuple[str, int]]) -> tuple[Transcript, Compactor]:
    """A session made of `steps` in `folder`, measured (and its state saved) at each "measure"."""
    t = open_transcript(folder)
    engine = make_compactor(t)
    for step, n in steps:
        if step == "measure":
            engine.measure()
        else:
            apply(t, step, n)
    return t, engine


def state(tracker: BudgetTracker, path: list[Entry]) -> tuple[object, ...]:
    measurement = tracker.measure(path)
    return (
        measurement, tracker.guard, tracker.capsule_index, tracker.region_facts,
        [i.checkpoint_id for i in tracker.pending_intents], [s.name for s in tracker.skills],
        tracker._before_last_assistant,
    )  # fmt: skip


def plain_walk(tracker: BudgetTracker, path: list[Entry]) -> tuple[int, int, str | None]:
    """(estimated without usage, region tokens, first open call) by walking the path."""
    at = max((i for i, e in enumerate(path) if isinstance(e, CapsuleEntry)), default=None)
    start, estimated = 0, tracker.fixed
    if at is not None:
        capsule = path[at]
        assert isinstance(capsule, CapsuleEntry)
        estimated += capsule_tokens(capsule, tracker.counter, None)
        ids = [e.id for e in path[:at]]
        start = ids.index(capsule.first_kept_entry_id) if capsule.first_kept_entry_id in ids else at + 1
    region = [e for i, e in enumerate(path[start:], start) if i != at and isinstance(e, VISIBLE_TYPES)]
    tokens = sum(entry_tokens(e, tracker.counter) for e in region)
    active: dict[str, SkillEntry] = {}
    for entry in path:
        if isinstance(entry, SkillEntry):
            active.pop(entry.name, None)
            active[entry.name] = entry
    skills = sum(tracker.counter.count_text(f"{SKILLS_HEADING}## Skill: {s.name}\n\n{s.content}") for s in active.values())
    calls = [e.call_id for e in region if isinstance(e, ToolCallEntry)]
    answered = {e.call_id for e in region if isinstance(e, ToolResultEntry)}
    first_open = next((c for c in calls if c not in answered), None)
    return estimated + tokens + skills, tokens, first_open


def guard_and_intents(path: list[Entry]) -> tuple[LoopGuard, list[str]]:
    """Soft compactions that came to nothing and intents not consumed, since the latest capsule."""
    at = max((i for i, e in enumerate(path) if isinstance(e, CapsuleEntry)), default=-1)
    since = path[at + 1 :]
    soft = [e for e in since if isinstance(e, CompactionEntry) and e.tokens_before is not None]
    consumed = {c for e in since if isinstance(e, CompactionEntry) for c in e.consumed}
    intents = [e.checkpoint_id for e in since if isinstance(e, CheckpointEntry) and e.intent]
    just_completed = at >= 0 and not any(isinstance(e, VISIBLE_TYPES) for e in since)
    last = soft[-1].tokens_before if soft else 0
    assert last is not None
    return LoopGuard(len(soft), last, just_completed), [i for i in intents if i not in consumed]


def effective_after_usage(tracker: BudgetTracker, path: list[Entry], estimated: int) -> int:
    """SPEC §2 on a path without capsules or skills: the last usage figure that measured what
    was sent, plus our count of what came after the assistant message it produced."""
    usages = [
        i for i, e in enumerate(path) if isinstance(e, UsageEntry) and not e.truncated and e.operation == "inference"
    ]
    if not usages:
        return estimated
    usage = path[usages[-1]]
    assert isinstance(usage, UsageEntry)
    answers = [i for i, e in enumerate(path[: usages[-1]]) if isinstance(e, MessageEntry) and e.role == "assistant"]
    before = path[: answers[-1]] if answers else []
    offset = tracker.fixed + sum(entry_tokens(e, tracker.counter) for e in before if isinstance(e, VISIBLE_TYPES))
    return usage.input_tokens + estimated - offset


@settings(max_examples=200, deadline=None)
@example([("call", 1), ("result", 1)])
@example([("call", 1), ("call", 2), ("result", 1), ("measure", 0), ("result", 0)])
@example([("user", 1), ("assistant", 2), ("usage", 3), ("measure", 0), ("user", 4), ("assistant", 5)])
@example([("assistant", 1), ("measure", 0), ("skill a", 3), ("user", 2), ("skill b", 1), ("skill a", 2)])
@example([("user", 1), ("intent", 0), ("soft compaction", 1), ("capsule keeping", 2), ("user", 3), ("measure", 0), ("intent", 1)])
@given(st.lists(st.tuples(STEP, st.integers(0, 1000)), max_size=40))
def test_a_tracker_kept_up_to_date_agrees_with_a_fresh_one_and_a_plain_walk(steps: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        t, engine = play(Path(folder), steps)
        path = t.path()
        kept_up = state(engine.tracker, path)
        state_path(t.file).unlink(missing_ok=True)  # counted afresh, not resumed (test_budget_state)
        fresh = make_compactor(t).tracker
        assert state(fresh, path) == kept_up and fresh.restores == 0
        estimated, region, first_open = plain_walk(fresh, path)
        assert fresh.region_facts.tokens == region
        assert fresh.region_facts.first_open_call == first_open
        assert fresh.measure(path).estimated == estimated
        assert (fresh.guard, [i.checkpoint_id for i in fresh.pending_intents]) == guard_and_intents(path)
        if not any(isinstance(e, SkillEntry | CapsuleEntry) for e in path):
            assert fresh.measure(path).effective == effective_after_usage(fresh, path, estimated)
        assert fresh.fixed == fixed_tokens("You are a test agent.", engine.tools, fresh.counter)


def test_a_compaction_requests_usage_leaves_the_budget_figure_as_it_was(tmp_path: Path) -> None:
    """Its input is the summary prompt: taken as the path's figure, it would move the budget
    (SPEC §2 measures the path; SPEC §11 prices the request all the same)."""
    t = open_transcript(tmp_path)
    engine = make_compactor(t)
    t.append(MessageEntry(role="user", content=words(30)))
    t.append(MessageEntry(role="assistant", content=words(30)))
    t.append(UsageEntry(input_tokens=700, operation="inference"))
    before = engine.measure()
    assert before.source == "provider_usage" and before.reported_input_tokens == 700
    t.append(UsageEntry(input_tokens=90_000, output_tokens=900, operation="compaction", operation_id="op_1"))
    assert engine.measure() == before
    state_path(t.file).unlink(missing_ok=True)
    assert make_compactor(t).measure() == before  # measured afresh (a resumed session): the same

    t.append(CapsuleEntry(operation_id="op_2", checkpoint_id="ck_00000002", trigger="user", quality="full",
                          tokens_before=900, tokens_after=300, estimated_before=900, first_kept_entry_id=None,
                          content="## Goal and constraints\n" + words(4)))  # fmt: skip
    after_capsule = engine.measure()
    assert after_capsule.source == "estimated" and after_capsule.reported_input_tokens is None
    t.append(UsageEntry(input_tokens=90_000, operation="compaction", operation_id="op_2"))
    assert engine.measure() == after_capsule


def test_other_tool_schemas_move_the_next_request_by_their_difference(tmp_path: Path) -> None:
    """A small window gets compact tool schemas mid-session: the next request is smaller by
    what they save, even when the last figure is the provider's (it measured the old ones)."""
    from soba_nb.agent.tools import COMPACT_TOOL_SCHEMAS, TOOL_SCHEMAS

    t = open_transcript(tmp_path)
    engine = make_compactor(t)
    engine.set_tools(TOOL_SCHEMAS)
    t.append(MessageEntry(role="user", content=words(30)))
    t.append(MessageEntry(role="assistant", content=words(30)))
    t.append(UsageEntry(input_tokens=5_000, operation="inference"))
    before = engine.measure()
    full = engine.tracker.fixed
    engine.set_tools(COMPACT_TOOL_SCHEMAS)
    saved = full - engine.tracker.fixed
    after = engine.measure()
    assert saved > 100
    assert (after.effective, after.estimated) == (before.effective - saved, before.estimated - saved)
    assert after.source == "provider_usage" and after.reported_input_tokens == 5_000


def test_a_server_counting_less_never_makes_a_compacted_input_a_negative_size(tmp_path: Path) -> None:
    """Found by the long randomized session: the server counted 1,770 tokens fewer than we did
    before a compaction, and that difference carried onto a one-line capsule of about 1,000
    tokens measured the input at -759 — a refused request then planned a recovery below zero.
    What a compaction removed is taken off at the server's rate: a size, never below zero."""
    from soba_nb.compaction.budget import effective_from

    t = open_transcript(tmp_path)
    engine = make_compactor(t)
    t.append(MessageEntry(role="user", content=words(10)))
    t.append(CapsuleEntry(operation_id="op_1", checkpoint_id="ck_00000001", trigger="context_overflow",
                          quality="degraded", tokens_before=1_000, tokens_after=0, estimated_before=2_770,
                          first_kept_entry_id=None, content="Context Capsule ck_00000001: one line."))  # fmt: skip
    t.append(MessageEntry(role="user", content=words(20)))
    measured = engine.measure()
    assert measured.estimated < 2_770
    assert measured.effective == -(-1_000 * measured.estimated // 2_770) > 0
    # Growth and a server that counts more still carry over as a difference.
    assert effective_from(1_000, 800, 900) == 1_100 and effective_from(700, 800, 900) == 800
    assert effective_from(1_000, 800, 300) == 500  # counts more, shrank: the difference carries
    assert effective_from(1_000, 2_770, 1_011) == 365 and effective_from(0, 2_770, 1_011) == 0
