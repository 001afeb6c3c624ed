"""The summary request: the right instructions, and never larger than its budget (SPEC §4)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soba_nb.compaction import summary_prompt
from soba_nb.compaction.capsule import SECTION_HEADINGS, Capsule, render_capsule
from soba_nb.compaction.summary_prompt import (
    PROMPT_FRAMING_TOKENS,
    PromptBudgetTooSmall,
    SummaryPrompt,
    build_summary_prompt,
    build_system_prompt,
    render_entries_for_summary,
)
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import (
    CheckpointEntry,
    Entry,
    MessageEntry,
    ToolCallEntry,
    ToolResultEntry,
)

COUNTER = TokenCounter.for_model("openai", "gpt-4o")
COUNTERS: dict[str, Callable[[str], int]] = {
    "tiktoken": COUNTER.count_text,
    "chars/4": lambda text: len(text) // 4,
    "words": lambda text: len(text.split()),
}
PREVIOUS = Capsule(
    goal_and_constraints="Build a churn model. Never upload data.",
    files_read="- data/raw.csv",
    verification="- shell `pytest -q` → exit status 0",
)


def call(name: str, call_id: str, **arguments: object) -> ToolCallEntry:
    return ToolCallEntry(call_id=call_id, name=name, arguments=json.dumps(arguments))


def session(steps: int, output_chars: int = 200) -> list[Entry]:
    entries: list[Entry] = []
    for index in range(steps):
        entries.append(MessageEntry(role="user", content=f"request {index}: analyse segment {index}"))
        entries.append(MessageEntry(role="assistant", content=f"Looking at segment {index}."))
        entries.append(call("python", f"c{index}", code=f"df[df.seg == {index}].describe()"))
        entries.append(ToolResultEntry(call_id=f"c{index}", name="python", content="value row " * (output_chars // 10)))
    return entries


def size(prompt: SummaryPrompt, count: Callable[[str], int]) -> int:
    return count(prompt.system) + count(prompt.user)


def test_entries_render_as_a_plain_transcript_with_long_outputs_clipped() -> None:
    entries: list[Entry] = [
        MessageEntry(role="user", content="plot sales"),
        MessageEntry(role="assistant", content="Plotting."),
        call("python", "c1", code="plot()"),
        ToolResultEntry(call_id="c1", name="python", content="A" * 500 + "B" * 500, is_error=True),
        CheckpointEntry(kind="milestone", note="plotted"),
    ]
    text = render_entries_for_summary(entries, tool_output_limit_chars=100)
    assert text.startswith('[user] plot sales\n\n[assistant] Plotting.\n\n[tool call python] {"code": "plot()"}')
    assert "[tool result python, error] " + "A" * 50 + "\n[… 900 characters clipped …]\n" + "B" * 50 in text
    assert text.endswith("[checkpoint milestone] plotted")


def test_the_instructions_list_the_headings_and_the_rules() -> None:
    system = build_system_prompt(None)
    listed = [line[3:] for line in system.splitlines() if line.startswith("## ")]
    assert listed == list(SECTION_HEADINGS)
    for rule in ("(none)", "soba adds the user's requests verbatim", "Do not call tools", "previous capsule", "secrets", "raw data dumps"):
        assert rule in system
    # Results are state (SPEC §14): only secrets and raw dumps are banned, never the figures.
    assert "values of variables" not in system and "keep the figures the work produced" in system
    assert "quote the latest user request" not in system  # it is not shown: soba quotes it
    assert "focus" not in system
    assert build_system_prompt("  the SQL migration ").endswith("focus on: the SQL migration\n")


def test_a_small_history_is_sent_whole_with_the_previous_capsule_in_full() -> None:
    entries = session(3)
    prompt = build_summary_prompt(entries, previous=PREVIOUS, focus="plots", max_input_tokens=20_000, count=COUNTER.count_text)
    assert render_capsule(PREVIOUS).rstrip("\n") in prompt.user
    assert render_entries_for_summary(entries, tool_output_limit_chars=4000) in prompt.user
    assert prompt.dropped == 0
    assert "focus on: plots" in prompt.system
    assert "There is no previous capsule." in build_summary_prompt(
        entries, previous=None, focus=None, max_input_tokens=20_000, count=COUNTER.count_text
    ).user


def test_tool_outputs_are_clipped_harder_before_any_entry_is_dropped() -> None:
    entries = session(4, output_chars=20_000)
    prompt = build_summary_prompt(entries, previous=None, focus=None, max_input_tokens=5_000, count=COUNTER.count_text)
    assert prompt.dropped == 0
    assert "characters clipped" in prompt.user
    assert size(prompt, COUNTER.count_text) <= 5_000 - PROMPT_FRAMING_TOKENS


def test_the_oldest_entries_go_to_the_deterministic_extract_when_history_does_not_fit() -> None:
    entries = session(90)  # (fewer distinct runs than the extract lists: `EXTRACT_ITEMS_MAX`; each run with what it printed)
    prompt = build_summary_prompt(entries, previous=PREVIOUS, focus=None, max_input_tokens=7_500, count=COUNTER.count_text)
    dropped = prompt.dropped
    assert 0 < dropped < len(entries)
    assert "<extract_of_older_history" in prompt.user
    assert "python `df[df.seg == 0].describe()` → ok" in prompt.user  # the oldest run, via the extract
    assert "[user] request 89: analyse segment 89" in prompt.user  # the newest, rendered
    assert render_capsule(PREVIOUS).rstrip("\n") in prompt.user
    assert size(prompt, COUNTER.count_text) <= 7_500


def test_a_dropped_latest_request_is_still_shown_whole() -> None:
    request = "Rebuild everything. " * 50
    entries: list[Entry] = [MessageEntry(role="user", content=request)]
    for index in range(300):
        entries.append(call("shell", f"c{index}", command=f"step {index}", timeout_s=5))
        entries.append(ToolResultEntry(call_id=f"c{index}", name="shell", content="exit status: 0\n" + "log " * 100))
    prompt = build_summary_prompt(entries, previous=None, focus=None, max_input_tokens=8_000, count=COUNTER.count_text)
    assert prompt.dropped >= 1
    assert f"<request_being_worked_on>\n{request}\n</request_being_worked_on>" in prompt.user


def test_a_budget_below_the_instructions_is_refused() -> None:
    with pytest.raises(PromptBudgetTooSmall, match="max_input_tokens=100"):
        build_summary_prompt(session(2), previous=None, focus=None, max_input_tokens=100, count=COUNTER.count_text)


def minimum_budget(count: Callable[[str], int]) -> int:
    return count(build_system_prompt("focus text")) + PROMPT_FRAMING_TOKENS + 300


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)


@st.composite
def histories(draw: st.DrawFn) -> list[Entry]:
    entries: list[Entry] = []
    for index in range(draw(st.integers(0, 40))):
        kind = draw(st.sampled_from(["user", "assistant", "tool", "checkpoint"]))
        repeat = draw(st.sampled_from([1, 10, 200, 3000]))
        text = draw(TEXT) * repeat
        if kind in ("user", "assistant"):
            entries.append(MessageEntry(role=kind, content=text))
        elif kind == "checkpoint":
            entries.append(CheckpointEntry(kind="milestone", note=text[:200]))
        else:
            name = draw(st.sampled_from(["python", "shell", "read_file", "write_file"]))
            arguments = draw(st.sampled_from([json.dumps({"code": text, "command": text, "path": text[:50]}), text]))
            entries.append(ToolCallEntry(call_id=f"c{index}", name=name, arguments=arguments))
            entries.append(ToolResultEntry(call_id=f"c{index}", name=name, content=text, is_error=draw(st.booleans())))
    return entries


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    entries=histories(),
    with_previous=st.booleans(),
    counter=st.sampled_from(sorted(COUNTERS)),
    extra=st.integers(0, 20_000),
    previous_text=TEXT,
)
def test_the_prompt_never_exceeds_its_budget(
    entries: list[Entry], with_previous: bool, counter: str, extra: int, previous_text: str
) -> None:
    count = COUNTERS[counter]
    previous = Capsule(work_done=previous_text * 100, files_read="- a.csv") if with_previous else None
    budget = minimum_budget(count) + extra
    prompt = build_summary_prompt(entries, previous=previous, focus="focus text", max_input_tokens=budget, count=count)
    assert size(prompt, count) <= budget - PROMPT_FRAMING_TOKENS
    assert 0 <= prompt.dropped <= len(entries)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(entries=histories(), counter=st.sampled_from(sorted(COUNTERS)), extra=st.integers(0, 20_000), block=st.integers(1, 5))
def test_the_bound_from_blocks_of_entries_holds_without_counting_the_whole_message(
    entries: list[Entry], counter: str, extra: int, block: int
) -> None:
    # Small blocks: the walk back counts many of them, and the boundary falls inside one.
    count = COUNTERS[counter]
    budget = minimum_budget(count) + extra
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(summary_prompt, "BLOCK_ENTRIES", block)
        prompt = build_summary_prompt(entries, previous=None, focus=None, max_input_tokens=budget, count=count)
    assert size(prompt, count) <= budget - PROMPT_FRAMING_TOKENS


@pytest.mark.parametrize(("steps", "budget"), [(30, 20_000), (1000, 60_000)])
def test_what_is_sent_is_counted_about_once(steps: int, budget: int) -> None:
    counted: list[str] = []

    def count(text: str) -> int:
        counted.append(text)
        return COUNTER.count_text(text)

    entries = session(steps)
    prompt = build_summary_prompt(entries, previous=PREVIOUS, focus=None, max_input_tokens=budget, count=count)
    assert prompt.dropped < len(entries)
    assert prompt.user not in counted  # the bound from its parts' exact counts vouched for it
    assert sum(map(len, counted)) < 2.5 * len(prompt.user)  # each entry sent, counted about once
    assert len(counted) < 0.05 * (len(entries) - prompt.dropped) + 64  # in blocks, not a call per entry


@pytest.mark.parametrize("block", [1, 3, 64])
def test_joins_that_cost_tokens_of_their_own_are_allowed_for(block: int) -> None:
    # With four characters to a token (rounded down), "[user] ab" is 2 tokens, "\n\n" none,
    # and the two joined by it 5: each join costs a token the parts' counts do not hold.
    def count(text: str) -> int:
        return len(text) // 4

    entries: list[Entry] = [MessageEntry(role="user", content="ab") for _ in range(400)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(summary_prompt, "BLOCK_ENTRIES", block)
        for extra in range(0, 3000, 37):
            budget = minimum_budget(count) + extra
            prompt = build_summary_prompt(entries, previous=None, focus=None, max_input_tokens=budget, count=count)
            assert size(prompt, count) <= budget - PROMPT_FRAMING_TOKENS
