"""What a compaction operation is and how it ends (SPEC §6): the types the barrier, capsule
generation, the compactor, the agent and the UI all share.

`CompactionPlan` is the immutable plan built before anything runs; `CompactionEvent` is what
the UI follows (start, progress, end); `CompactionResult` is the terminal outcome with its
`Outcome` and its fixed `Reason` code (flight records carry only the code); `BarrierContext`
is what a run needs besides the plan.
"""


from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from soba_nb.compaction.extract_snapshots import ExtractSnapshots
from soba_nb.compaction.flight import FlightRecorder
from soba_nb.compaction.given_way import given_way_form
from soba_nb.compaction.native_continuation import NativeCompactor, continuation_label
from soba_nb.compaction.planner import Cut
from soba_nb.compaction.requests import DEFAULT_REQUEST_TOKENS
from soba_nb.compaction.summarizer import Summarizer
from soba_nb.compaction.triggers import Thresholds, Trigger
from soba_nb.messages import ToolSchema
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import (
    CapsuleEntry,
    Continuation,
    SkillEntry,
    UsageEntry,
)
from soba_nb.transcript.store import Transcript


class Outcome(str, Enum):
    COMPLETED = "completed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    STALE = "stale"
    FAILED = "failed"

class Reason(str, Enum):
    """Why an operation ended as it did: a fixed code, for flight records (metrics only,
    SPEC §7); the human sentence with its figures is `CompactionResult.reason`."""

    OK = "ok"
    FALLBACK_NO_MODEL = "fallback_no_model"
    FALLBACK_TIMEOUT = "fallback_timeout"
    FALLBACK_FAILED = "fallback_summary_failed"
    FALLBACK_REJECTED = "fallback_summary_rejected"
    FALLBACK_TOO_LARGE = "fallback_model_capsule_too_large"
    NATIVE_FAILED = "native_failed"
    NATIVE_REFUSED = "native_refused"
    NOTHING_TO_COMPACT = "nothing_to_compact"
    RECLAIMED_BELOW_FLOOR = "reclaimed_below_floor"
    RATIO_BELOW_FLOOR = "ratio_below_floor"
    NOT_SMALLER = "not_smaller"
    OVER_HARD_LIMIT = "over_hard_limit"
    NOT_BELOW_REFUSED = "not_below_refused_request"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    LEAF_CHANGED = "leaf_changed"

@dataclass(frozen=True)
class CompactionPlan:
    """Immutable plan of one operation, built before `compaction_start`."""

    operation_id: str
    session_id: str
    trigger: Trigger
    expected_leaf: str | None
    cut: Cut | None
    """None when there is nothing safely compactable (`unplannable` says why)."""
    hard_limit: int
    soft_limit: int
    tokens_before: int
    measurement_source: str
    summary_output_tokens: int
    summary_input_tokens: int
    focus: str | None = None
    consumed: tuple[str, ...] = ()
    """Checkpoint ids of pending intents this operation consumes."""
    estimated_before: int | None = None
    """The local estimate at planning time (equal to `tokens_before` when estimated)."""
    must_be_below: int | None = None
    """Overflow recovery: the continuation must be strictly smaller than this."""
    unplannable: str | None = None

@dataclass(frozen=True)
class CompactionEvent:
    """For the UI: `compaction_start`, `compaction_progress` (0–100) and `compaction_end`."""

    kind: str
    operation_id: str
    trigger: str
    percent: int = 0
    result: CompactionResult | None = None

@dataclass(frozen=True)
class CompactionResult:
    """The terminal outcome of one operation."""

    operation_id: str
    trigger: str
    outcome: Outcome
    reason: str
    tokens_before: int
    tokens_after: int | None
    checkpoint_id: str | None
    quality: str | None
    duration_ms: int
    entry: CapsuleEntry | None = None
    code: Reason = Reason.OK
    """The fixed code of `reason` (flight records carry only this)."""

    @property
    def reclaimed(self) -> int | None:
        return None if self.tokens_after is None else self.tokens_before - self.tokens_after

    @property
    def continuation(self) -> Continuation | None:
        """`native`, `portable` or `fallback` (see `native.continuation_label`); None when no
        capsule was appended, or a full capsule where native compaction was not on offer."""
        if self.entry is not None:
            return continuation_label(self.entry)
        return "fallback" if self.quality == "degraded" else None

    def line(self) -> str:
        """One result line: trigger, tokens before → after, reclaimed %, checkpoint, and which
        continuation was made (native / portable / fallback)."""
        if self.outcome is not Outcome.COMPLETED:
            return f"compaction {self.outcome.value} ({self.trigger}): {self.reason}"
        assert self.tokens_after is not None
        percent = round(100 * (self.tokens_before - self.tokens_after) / max(self.tokens_before, 1))
        text = (
            f"Compacted ({self.trigger}) · {self.tokens_before:,} → {self.tokens_after:,} tokens · "
            f"reclaimed {percent}% · {self.checkpoint_id}"
        )
        label: str | None = self.continuation
        form = given_way_form(self.entry.content) if self.entry is not None else None
        if form is not None:  # SPEC §17: the user sees that the capsule gave way entirely
            label = f"{label} ({'a one-line capsule' if form == 'one line' else 'no capsule'}: the window is too small for more)"
        return f"{text} · {label}" if label else text

Emit = Callable[[CompactionEvent], None]

@dataclass
class BarrierContext:
    """What a barrier run needs besides the plan."""

    transcript: Transcript
    counter: TokenCounter
    thresholds: Thresholds
    system: str
    tools: Sequence[ToolSchema]
    timeout_ms: int
    summarizer: Summarizer | None
    skills: Sequence[SkillEntry] = ()
    kernel_state: Sequence[str] = ()
    flight: FlightRecorder | None = None
    emit: Emit | None = None
    native: NativeCompactor | None = None
    """The provider's own compaction, when it offers one (asked before the model summary)."""
    snapshots: ExtractSnapshots | None = None
    """Snapshots of the extract's scan (the summarized entries are read from the newest one on)."""
    user_request_tokens: int = DEFAULT_REQUEST_TOKENS
    """`compaction.userRequestTokens`: the user's requests a capsule quotes (SPEC §14)."""
    spent: list[UsageEntry] = field(default_factory=list)
    """The usage of the requests the operation made (summary, native compaction), appended to
    the transcript once it ended: never during it, where an entry would move the leaf and
    make the operation stale."""

def result_of(
    plan: CompactionPlan,
    outcome: Outcome,
    reason: str,
    started: float,
    *,
    tokens_after: int | None = None,
    entry: CapsuleEntry | None = None,
    quality: str | None = None,
    code: Reason = Reason.OK,
) -> CompactionResult:
    return CompactionResult(
        operation_id=plan.operation_id,
        trigger=plan.trigger.value,
        outcome=outcome,
        reason=reason,
        tokens_before=plan.tokens_before,
        tokens_after=tokens_after,
        checkpoint_id=entry.checkpoint_id if entry else None,
        quality=quality,
        duration_ms=int((time.monotonic() - started) * 1000),
        entry=entry,
        code=code,
    )

def emit_event(ctx: BarrierContext, event: CompactionEvent) -> None:
    if ctx.emit is not None:
        ctx.emit(event)
