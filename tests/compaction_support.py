"""Helpers for compaction tests: a controllable in-process summarizer and session builders.

The fake summarizer stands in for the provider layer only (the compaction core reaches
models through the `Summarizer` interface); everything else is the real code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from soba_nb.compaction.capsule import SECTION_HEADINGS
from soba_nb.compaction.flight import FlightRecorder
from soba_nb.compaction.limits import soft_limit
from soba_nb.compaction.summarizer import SummaryOutput
from soba_nb.compaction.triggers import Thresholds
from soba_nb.messages import ToolSchema
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import (
    MessageEntry,
    SessionEntry,
    ToolCallEntry,
    ToolResultEntry,
)
from soba_nb.transcript.store import Transcript

if TYPE_CHECKING:
    from soba_nb.compaction.compactor import Compactor

WORD = " word"
"""One o200k token."""


def words(count: int) -> str:
    return ("word" + WORD * (count - 1)) if count > 0 else ""


def good_summary(goal: str = "Keep cleaning the dataframe.") -> str:
    bodies = {"Goal and constraints": goal, "Work done": "- loaded data.csv"}
    return "\n\n".join(f"## {h}\n\n{bodies.get(h, '(none)')}" for h in SECTION_HEADINGS) + "\n"


@dataclass
class FakeSummarizer:
    """Answers after `delay_s` (abortable), or raises `error`, with a scripted text."""

    text: str = field(default_factory=good_summary)
    delay_s: float = 0.0
    finish_reason: str = "stop"
    has_tool_calls: bool = False
    error: BaseException | None = None
    ignore_cancel: bool = False
    """Keep running after the abort signal (a provider that answers late anyway)."""
    on_call: Callable[[], None] | None = None
    model: str = "fake-summarizer"
    provider: str = "fake"
    calls: list[dict[str, object]] = field(default_factory=list)
    answered_after_cancel: threading.Event = field(default_factory=threading.Event)
    cut_off: list[int] = field(default_factory=list)
    """The characters received by each request the deadline cut off (`cut_off_usage`)."""

    def summarize(self, system, user, *, max_output_tokens, operation_id, cancel, on_progress, timeout_s):
        self.calls.append({"system": system, "user": user, "max_output_tokens": max_output_tokens})
        if self.on_call is not None:
            self.on_call()
        deadline = time.monotonic() + self.delay_s
        while time.monotonic() < deadline:
            if cancel.is_set() and not self.ignore_cancel:
                raise RuntimeError("summary aborted")
            if on_progress is not None:
                on_progress(10)
            time.sleep(0.01)
        if cancel.is_set():
            self.answered_after_cancel.set()
        if self.error is not None:
            raise self.error
        return SummaryOutput(self.text, self.finish_reason, self.has_tool_calls, self.model, self.provider)

    def cut_off_usage(self, system, user, *, received_chars, operation_id):
        self.cut_off.append(received_chars)
        return None  # a fake model costs nothing


def thresholds(
    *,
    hard: int = 4000,
    auto: bool = True,
    keep: int = 800,
    min_tokens: int = 1000,
    min_reclaimable: int = 500,
    min_ratio: float = 0.25,
    ratio: float = 0.8,
    turn_complete: bool = True,
    milestone: bool = True,
) -> Thresholds:
    return Thresholds(
        hard_limit=hard,
        soft_limit=soft_limit(hard, min_tokens, ratio),
        auto=auto,
        compact_on_turn_complete=turn_complete,
        compact_on_milestone=milestone,
        min_tokens_for_auto_compact=min_tokens,
        min_reclaimable_tokens=min_reclaimable,
        min_savings_ratio=min_ratio,
        keep_recent_tokens=keep,
    )


TOOLS = (ToolSchema(name="python", description="run python", parameters={"type": "object"}),)


def open_transcript(tmp_path: Path, name: str = "s.jsonl") -> Transcript:
    return Transcript.open(tmp_path / name, create_header=SessionEntry(model="openai/gpt-4o"))


def make_compactor(
    transcript: Transcript,
    t: Thresholds | None = None,
    *,
    summarizer: FakeSummarizer | None = None,
    timeout_ms: int = 2000,
    flight: Path | None = None,
    user_request_tokens: int = 4000,
) -> Compactor:
    from soba_nb.compaction.compactor import Compactor, CompactorSettings

    return Compactor(
        transcript,
        TokenCounter.for_model("openai", "gpt-4o"),
        CompactorSettings(
            thresholds=t or thresholds(),
            timeout_ms=timeout_ms,
            max_output_tokens=500,
            session_id="s",
            user_request_tokens=user_request_tokens,
        ),
        system="You are a test agent.",
        tools=TOOLS,
        summarizer=summarizer,
        flight=FlightRecorder(flight) if flight else None,
    )


def add_exchange(transcript: Transcript, tokens: int, *, tool_tokens: int = 0, index: int = 0) -> None:
    """A user message, an assistant tool call with its result (if tool_tokens), an answer."""
    transcript.append(MessageEntry(role="user", content=f"request {index}: " + words(tokens // 2)))
    if tool_tokens:
        call_id = f"call_{index}_{transcript.leaf}"
        transcript.append(MessageEntry(role="assistant", content="running"))
        transcript.append(ToolCallEntry(call_id=call_id, name="python", arguments='{"code": "df.head()"}'))
        transcript.append(ToolResultEntry(call_id=call_id, name="python", content=words(tool_tokens)))
    transcript.append(MessageEntry(role="assistant", content=words(tokens // 2)))


def add_tool_group(transcript: Transcript, result_tokens: int, *, calls: int = 1, tag: str = "g") -> list[str]:
    transcript.append(MessageEntry(role="assistant", content="calling tools"))
    ids = [f"{tag}_{n}_{len(transcript)}" for n in range(calls)]
    for call_id in ids:
        transcript.append(ToolCallEntry(call_id=call_id, name="read_file", arguments='{"path": "data.csv"}'))
    for call_id in ids:
        transcript.append(ToolResultEntry(call_id=call_id, name="read_file", content=words(result_tokens)))
    return ids
