"""The preflight barrier (SPEC §6): run one compaction operation to a terminal outcome.

The plan is frozen before anything runs. The model summary runs in a worker thread with a
deadline of `timeoutMs`; on expiry it is aborted and the deterministic capsule is used
(`quality: degraded`). Before appending, the barrier re-checks the abort signal and that
the leaf is still the plan's expected leaf: a late summary after cancel or a leaf change
is dropped (`cancelled` / `stale`), even if the model answers afterwards.

When the provider offers native compaction (`BarrierContext.native`), the operation asks it
first, within the same deadline; its item is recorded beside the deterministic capsule
(`continuation: native`). If it fails, times out or is refused, the model summary runs as
usual (`portable`), or the deterministic capsule (`fallback`).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

import msgspec

from soba_nb.compaction.capsule import (
    Capsule,
    CapsuleFormatError,
    InvalidSummary,
    parse_capsule,
    render_capsule,
    validate_summary,
)
from soba_nb.compaction.deterministic import (
    capsule_from_scan,
    scan_for_capsule,
    with_latest_request,
)
from soba_nb.compaction.extract_snapshots import ExtractSnapshots
from soba_nb.compaction.fitting import (
    first_fitting,
    later_cuts,
    request_alone_reason,
    shortest_fitting,
)
from soba_nb.compaction.flight import FlightRecord, FlightRecorder
from soba_nb.compaction.model_input import (
    VISIBLE_TYPES,
    ModelInput,
    VisibleContext,
    assemble,
    entry_tokens,
    fixed_tokens,
    native_cost_key,
)
from soba_nb.compaction.native import NativeCompactor, continuation_label
from soba_nb.compaction.native_run import NativeFailure, ask_native, native_request
from soba_nb.compaction.planner import Cut
from soba_nb.compaction.summarizer import Summarizer, SummaryOutput
from soba_nb.compaction.summary_prompt import ScanStarts, build_summary_prompt
from soba_nb.compaction.triggers import POST_GATE_EXEMPT, Thresholds, Trigger, post_generation_roi
from soba_nb.messages import ToolSchema
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CompactionEntry,
    Continuation,
    NativeContinuation,
    Quality,
    SkillEntry,
    new_checkpoint_id,
)
from soba_nb.transcript.store import Transcript

PROGRESS_INTERVAL_S = 0.25
"""Progress events are emitted at least this often while the summary runs (UI needs ≤ 0.5 s)."""
PROGRESS_BEFORE_SUMMARY = 5
PROGRESS_SUMMARY_DONE = 90
PROGRESS_CAP_WHILE_RUNNING = 89
CHARS_PER_SUMMARY_TOKEN = 4
POLL_S = 0.05


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
        label = self.continuation
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


class _SummaryRun:
    """The model summary in a worker thread, abortable."""

    def __init__(self, summarizer: Summarizer, plan: CompactionPlan, system: str, user: str, timeout_s: float):
        self.timeout_s = timeout_s
        self.abort = threading.Event()
        self.done = threading.Event()
        self.output: SummaryOutput | None = None
        self.error: BaseException | None = None
        self.chars = 0
        self._thread = threading.Thread(
            target=self._run, args=(summarizer, plan, system, user), daemon=True, name="soba-summary"
        )

    def start(self) -> None:
        self._thread.start()

    def _run(self, summarizer: Summarizer, plan: CompactionPlan, system: str, user: str) -> None:
        def progress(chars: int) -> None:
            self.chars = chars

        try:
            self.output = summarizer.summarize(
                system,
                user,
                max_output_tokens=plan.summary_output_tokens,
                operation_id=plan.operation_id,
                cancel=self.abort,
                on_progress=progress,
                timeout_s=self.timeout_s,
            )
        except BaseException as exc:  # reported to the barrier, never raised in a thread
            self.error = exc
        finally:
            self.done.set()


def run_barrier(plan: CompactionPlan, ctx: BarrierContext, cancel: threading.Event) -> CompactionResult:
    """Run `plan` to a terminal outcome and return it (appending a capsule only on `completed`)."""
    started = time.monotonic()
    _emit(ctx, CompactionEvent("compaction_start", plan.operation_id, plan.trigger.value))
    _emit(ctx, CompactionEvent("compaction_progress", plan.operation_id, plan.trigger.value, 0))
    try:
        result = _run(plan, ctx, cancel, started)
    except KeyboardInterrupt:
        cancel.set()
        result = _result(plan, Outcome.CANCELLED, "interrupted", started, code=Reason.INTERRUPTED)
    if result.outcome in (Outcome.SKIPPED, Outcome.FAILED):
        _record_without_capsule(plan, ctx, result)
    if ctx.flight is not None:
        ctx.flight.record(_flight(plan, result))
    _emit(ctx, CompactionEvent("compaction_end", plan.operation_id, plan.trigger.value, 100, result))
    return result


def _run(plan: CompactionPlan, ctx: BarrierContext, cancel: threading.Event, started: float) -> CompactionResult:
    cut = plan.cut
    if cut is None:
        forced = plan.trigger in (Trigger.HARD_LIMIT, Trigger.CONTEXT_OVERFLOW)
        outcome = Outcome.FAILED if forced else Outcome.SKIPPED
        return _result(plan, outcome, plan.unplannable or "", started, code=Reason.NOTHING_TO_COMPACT)
    generated = generate_capsule(plan, cut, ctx, cancel, started)
    if isinstance(generated, CompactionResult):
        return generated
    verdict = _gates(plan, generated.tokens_after, ctx)
    if verdict is not None and generated.entry.native is not None:
        # The provider's continuation does not pass our gates (its window keeps every user
        # message verbatim, say): the portable path may still, within what is left of the time.
        note = Note(f"native continuation not used ({verdict[1]})", Reason.NATIVE_REFUSED)
        portable = generate_capsule(plan, cut, ctx, cancel, started, native_note=note)
        if isinstance(portable, CompactionResult):
            return portable
        generated, verdict = portable, _gates(plan, portable.tokens_after, ctx)
    if verdict is not None and verdict[0] is Outcome.FAILED and generated.entry.quality == "full":
        # A forced compaction whose model capsule is too large: the deterministic capsule
        # (bounded sections) may still fit, and a degraded capsule beats a stranded session.
        note = Note(f"the model's capsule did not fit ({verdict[1]})", Reason.FALLBACK_TOO_LARGE)
        fallback = generate_capsule(plan, cut, ctx, cancel, started, fallback_note=note)
        if isinstance(fallback, CompactionResult):
            return fallback
        generated, verdict = fallback, _gates(plan, fallback.tokens_after, ctx)
    if verdict is not None and verdict[2] in TOO_LARGE and plan.trigger in FORCED:
        # Even the shortest capsule leaves the continuation too large: keep less (SPEC §12).
        smaller = _keep_less(plan, cut, ctx, cancel, started, generated)
        if isinstance(smaller, CompactionResult):
            return smaller
        generated, verdict = smaller, _gates(plan, smaller.tokens_after, ctx)
        if verdict is not None and smaller.tokens_after > _goal(plan):
            request = 0 if cut.request is None else entry_tokens(cut.request, ctx.counter)
            fixed = fixed_tokens(ctx.system, ctx.tools, ctx.counter)
            verdict = (Outcome.FAILED, request_alone_reason(generated.tokens_after, fixed, request, _goal(plan)), verdict[2])
    entry, tokens_after = generated.entry, generated.tokens_after
    if verdict is not None:
        return _result(plan, verdict[0], verdict[1], started, tokens_after=tokens_after, code=verdict[2])
    _emit(ctx, CompactionEvent("compaction_progress", plan.operation_id, plan.trigger.value, 95))
    # The last check before the append: abort signal, then the expected leaf.
    if cancel.is_set():
        return _result(plan, Outcome.CANCELLED, "cancelled before the capsule was appended", started, code=Reason.CANCELLED)
    if ctx.transcript.leaf != plan.expected_leaf:
        return _result(
            plan, Outcome.STALE, "the session leaf changed while the summary ran", started, code=Reason.LEAF_CHANGED
        )
    written = ctx.transcript.append(entry)
    assert isinstance(written, CapsuleEntry)
    reason, code = _completed_reason(generated)
    return _result(
        plan, Outcome.COMPLETED, reason, started,
        tokens_after=tokens_after, entry=written, quality=entry.quality, code=code,
    )


def _completed_reason(generated: Generated) -> tuple[str, Reason]:
    """The reason of a completed operation: why a fallback was used, why native was not."""
    note, native_note = generated.note, generated.native_note
    if note is not None:
        detail = f"; {native_note.text}" if native_note is not None and native_note is not note else ""
        return f"fallback: {note.text}{detail}", note.code
    if native_note is not None:
        return f"portable: {native_note.text}", native_note.code
    return "", Reason.OK


@dataclass(frozen=True)
class Note:
    """Why the deterministic fallback was used: a sentence and its code."""

    text: str
    code: Reason


NO_MODEL = Note("no summarizer model", Reason.FALLBACK_NO_MODEL)


FORCED = frozenset({Trigger.HARD_LIMIT, Trigger.CONTEXT_OVERFLOW})
"""The compactions that must make the continuation fit, or the request is not sent."""
TOO_LARGE = frozenset({Reason.OVER_HARD_LIMIT, Reason.NOT_BELOW_REFUSED, Reason.NOT_SMALLER})
"""Verdicts on a continuation that keeping less may still mend."""
KEPT_LESS = Note("the continuation did not fit: less of the recent history is kept in full", Reason.FALLBACK_TOO_LARGE)


def _goal(plan: CompactionPlan) -> int:
    """The most the continuation may be: the hard limit, and below the refused request."""
    return plan.hard_limit if plan.must_be_below is None else min(plan.hard_limit, plan.must_be_below - 1)


def _keep_less(
    plan: CompactionPlan, cut: Cut, ctx: BarrierContext, cancel: threading.Event, started: float, last: Generated
) -> Generated | CompactionResult:
    """The fallback capsule of the latest cut that fits (`fitting.later_cuts`), or, when none
    does, the shortest one with a reason saying the request cannot fit even alone."""
    tried: dict[str, Generated] = {}
    stopped: list[CompactionResult] = []

    def fits(candidate: Cut) -> bool:
        if stopped:
            return False
        generated = generate_capsule(plan, candidate, ctx, cancel, started, fallback_note=KEPT_LESS)
        if isinstance(generated, CompactionResult):
            stopped.append(generated)
            return False
        tried[candidate.first_kept_entry_id or ""] = generated
        return generated.tokens_after <= _goal(plan)

    candidates = later_cuts(cut, ctx.counter)
    found = first_fitting(candidates, fits)
    if stopped:
        return stopped[0]
    if found is not None:
        return tried[found.first_kept_entry_id or ""]
    if not candidates:
        return last
    shortest = tried.get(candidates[-1].first_kept_entry_id or "")
    if shortest is None:
        generated = generate_capsule(plan, candidates[-1], ctx, cancel, started, fallback_note=KEPT_LESS)
        if isinstance(generated, CompactionResult):
            return generated
        shortest = generated
    return shortest



@dataclass(frozen=True)
class Generated:
    """A capsule entry ready to append (not appended) and its measured continuation."""

    entry: CapsuleEntry
    tokens_after: int
    note: Note | None
    """Why the deterministic fallback was used, when it was."""
    native_note: Note | None = None
    """Why the provider's native compaction was not used, when it was asked."""


def generate_capsule(
    plan: CompactionPlan,
    cut: Cut,
    ctx: BarrierContext,
    cancel: threading.Event,
    started: float,
    *,
    fallback_note: Note | None = None,
    native_note: Note | None = None,
) -> Generated | CompactionResult:
    """The native item (beside the deterministic capsule), the model capsule or the
    deterministic fallback of `cut`, measured; nothing appended.

    `fallback_note`: build the deterministic capsule without asking the model, for this reason.
    `native_note`: do not ask the provider for native compaction, for this reason.
    Returns a terminal `CompactionResult` only when cancelled while the summary ran.
    """
    previous = _previous_capsule(cut)
    request, quote = _request_to_quote(cut)
    scan = scan_for_capsule(cut.summarize, kept=cut.kept, scans=_scan_starts(ctx, cut))

    def fallback(items_max: int | None = None, request_chars: int | None = None) -> Capsule:
        return capsule_from_scan(
            scan,
            previous=previous,
            kept=cut.kept,
            kernel_state=ctx.kernel_state,
            latest_request=request if quote else None,
            items_max=items_max,
            request_chars=request_chars,
        )

    capsule = deterministic = fallback()
    model = provider = None
    note: Note | None = fallback_note or NO_MODEL
    quality: Quality = "degraded"
    native: NativeContinuation | None = None
    time_left = True
    if ctx.native is not None and fallback_note is None and native_note is None:
        asked = _ask_native(plan, cut, ctx, ctx.native, cancel, started)
        if isinstance(asked, CompactionResult):
            return asked
        if isinstance(asked, NativeContinuation):
            # The portable capsule beside it is the deterministic one (no second model call).
            native, note = msgspec.structs.replace(asked, request=request if quote else None), None
        else:
            native_note = asked
            if asked.code is Reason.FALLBACK_TIMEOUT:
                note, time_left = asked, False  # the deadline is shared: no time for a summary
    if ctx.summarizer is not None and fallback_note is None and native is None and time_left:
        outcome = _summarize(plan, cut, ctx, cancel, previous, started)
        if isinstance(outcome, CompactionResult):
            return outcome
        if isinstance(outcome, Capsule):
            # The kernel state is ours, never the model's: it describes the live kernel.
            capsule = outcome.model_copy(update={"kernel_state": deterministic.kernel_state})
            quality, note = "full", None
            if request is not None:
                capsule = with_latest_request(capsule, request, quote=quote)
            model, provider = ctx.summarizer.model, ctx.summarizer.provider
        else:
            note = outcome
    continuation: Continuation | None = None
    if ctx.native is not None:
        continuation = "native" if native is not None else "portable" if quality == "full" else "fallback"
    # Measured locally and exactly, then put on the scale of `tokens_before`: when that was
    # the provider's figure, its difference from our estimate carries over (like with like).
    calibration = plan.tokens_before - (plan.estimated_before if plan.estimated_before is not None else plan.tokens_before)
    fit_to = plan.hard_limit - max(calibration, 0)

    def measured(capsule: Capsule) -> tuple[CapsuleEntry, int]:
        entry = CapsuleEntry(
            operation_id=plan.operation_id,
            checkpoint_id=new_checkpoint_id(),
            trigger=plan.trigger.value,
            quality=quality,
            tokens_before=plan.tokens_before,
            tokens_after=0,
            estimated_before=plan.estimated_before,
            first_kept_entry_id=cut.first_kept_entry_id,
            rolls_up=cut.previous.id if cut.previous else None,
            model=model,
            provider=provider,
            content=render_capsule(capsule),
            native=native,
            continuation=continuation,
        )
        tokens_after = max(measure_continuation(entry, cut, fit_to, ctx).tokens + calibration, 0)
        ctx.counter.forget(entry.id)
        ctx.counter.forget(native_cost_key(entry))
        return msgspec.structs.replace(entry, tokens_after=tokens_after), tokens_after

    entry, tokens_after = measured(capsule)
    goal = _goal(plan)
    if quality == "degraded" and native is None and tokens_after > goal:
        # The fallback over the limit (a long session's lists, a small window): it gives way,
        # lists first, then its quoted requests (`fitting`); a shorter capsule beats a
        # stranded session.
        entry, tokens_after = shortest_fitting(
            lambda items_max, request_chars: measured(fallback(items_max, request_chars)), goal
        )
    return Generated(entry, tokens_after, note, native_note)


def _ask_native(
    plan: CompactionPlan,
    cut: Cut,
    ctx: BarrierContext,
    compactor: NativeCompactor,
    cancel: threading.Event,
    started: float,
) -> NativeContinuation | Note | CompactionResult:
    """The provider's native item, why it is not used, or the terminal result of a cancel."""
    request = native_request(
        cut,
        operation_id=plan.operation_id,
        system=ctx.system,
        tools=ctx.tools,
        skills=ctx.skills,
        counter=ctx.counter,
        target=compactor.target,
        hard_limit=plan.hard_limit,
        soft_limit=plan.soft_limit,
        max_output_tokens=plan.summary_output_tokens,
    )
    timeout_s = ctx.timeout_ms / 1000
    last_progress = [0.0]

    def on_poll() -> None:
        now = time.monotonic()
        if now - last_progress[0] >= PROGRESS_INTERVAL_S:
            last_progress[0] = now
            percent = _percent(now - started, timeout_s, 0, 1)
            _emit(ctx, CompactionEvent("compaction_progress", plan.operation_id, plan.trigger.value, percent))

    asked = ask_native(
        compactor, request, cancel=cancel, deadline=started + timeout_s, timeout_ms=ctx.timeout_ms, on_poll=on_poll
    )
    if asked is None:
        return _result(plan, Outcome.CANCELLED, "cancelled while the native compaction ran", started, code=Reason.CANCELLED)
    if isinstance(asked, NativeFailure):
        code = Reason.FALLBACK_TIMEOUT if asked.timed_out else Reason.NATIVE_REFUSED if asked.refused else Reason.NATIVE_FAILED
        return Note(asked.text, code)
    return asked


def _scan_starts(ctx: BarrierContext, cut: Cut) -> ScanStarts | None:
    """Where a scan of `cut`'s region may start: the newest snapshot before its boundary."""
    if ctx.snapshots is None:
        return None
    return functools.partial(ctx.snapshots.start, capsule_id=None if cut.previous is None else cut.previous.id)


def _request_to_quote(cut: Cut) -> tuple[str | None, bool]:
    """(the request being worked on, whether the capsule must quote it): SPEC §5, it must
    reach the model verbatim, in the kept tail or quoted whole in the Goal section."""
    request = cut.request
    if request is None:
        return None, False
    in_kept = any(entry.id == request.id for entry in cut.kept)
    return request.content, not in_kept


def _summarize(
    plan: CompactionPlan,
    cut: Cut,
    ctx: BarrierContext,
    cancel: threading.Event,
    previous: Capsule | None,
    started: float,
) -> Capsule | CompactionResult | Note:
    """The validated model capsule, a terminal result (cancel), or why the fallback is used."""
    assert ctx.summarizer is not None
    prompt = build_summary_prompt(
        cut.summarize,  # (a tuple: not copied, 300k entries are 2 ms)
        previous=previous,
        focus=plan.focus,
        max_input_tokens=plan.summary_input_tokens,
        count=ctx.counter.count_text,
        scans=_scan_starts(ctx, cut),
    )
    timeout_s = ctx.timeout_ms / 1000
    deadline = started + timeout_s
    # The deadline is the operation's: a native attempt before this may have used part of it.
    run = _SummaryRun(ctx.summarizer, plan, prompt.system, prompt.user, max(deadline - time.monotonic(), POLL_S))
    run.start()
    last_progress = 0.0
    expected_chars = plan.summary_output_tokens * CHARS_PER_SUMMARY_TOKEN
    try:
        while not run.done.wait(POLL_S):
            now = time.monotonic()
            if cancel.is_set():
                run.abort.set()
                return _result(plan, Outcome.CANCELLED, "cancelled while the summary ran", started, code=Reason.CANCELLED)
            if now >= deadline:
                run.abort.set()
                return Note(f"the model summary did not finish within timeoutMs={ctx.timeout_ms}", Reason.FALLBACK_TIMEOUT)
            if now - last_progress >= PROGRESS_INTERVAL_S:
                last_progress = now
                percent = _percent(now - started, timeout_s, run.chars, expected_chars)
                _emit(ctx, CompactionEvent("compaction_progress", plan.operation_id, plan.trigger.value, percent))
    except KeyboardInterrupt:
        run.abort.set()
        raise
    if cancel.is_set():
        return _result(plan, Outcome.CANCELLED, "cancelled while the summary ran", started, code=Reason.CANCELLED)
    _emit(ctx, CompactionEvent("compaction_progress", plan.operation_id, plan.trigger.value, PROGRESS_SUMMARY_DONE))
    if run.error is not None and time.monotonic() >= deadline - POLL_S:
        # The summarizer was given the same deadline: its own timeout may end it a moment
        # before ours. That is the deadline, not a failure of the model.
        return Note(f"the model summary did not finish within timeoutMs={ctx.timeout_ms}", Reason.FALLBACK_TIMEOUT)
    if run.error is not None:
        return Note(f"the model summary failed ({type(run.error).__name__}: {run.error})", Reason.FALLBACK_FAILED)
    assert run.output is not None
    try:
        return validate_summary(
            run.output.text, finish_reason=run.output.finish_reason, has_tool_calls=run.output.has_tool_calls
        )
    except InvalidSummary as exc:
        return Note(f"the model summary was rejected ({exc})", Reason.FALLBACK_REJECTED)


def _percent(elapsed: float, timeout: float, chars: int, expected_chars: int) -> int:
    by_time = elapsed / timeout if timeout > 0 else 0.0
    by_output = chars / expected_chars if expected_chars > 0 else 0.0
    share = max(by_time, by_output)
    span = PROGRESS_CAP_WHILE_RUNNING - PROGRESS_BEFORE_SUMMARY
    return min(PROGRESS_CAP_WHILE_RUNNING, PROGRESS_BEFORE_SUMMARY + int(share * span))


def measure_continuation(entry: CapsuleEntry, cut: Cut, hard_limit: int, ctx: BarrierContext) -> ModelInput:
    """The whole continuation measured exactly: system/tools, serialized capsule, kept tail."""
    kept = tuple(e for e in cut.kept if isinstance(e, VISIBLE_TYPES))
    # The next requests carry the native item when the provider produced it: measure that.
    native = entry.native if ctx.native is not None and ctx.native.target.accepts(entry.native) else None
    context = VisibleContext(entry, kept, tuple(ctx.skills), native)
    return assemble(context, system=ctx.system, tools=ctx.tools, counter=ctx.counter, fit_to=hard_limit)


def _gates(plan: CompactionPlan, tokens_after: int, ctx: BarrierContext) -> tuple[Outcome, str, Reason] | None:
    if plan.trigger not in POST_GATE_EXEMPT:
        passes, reason = post_generation_roi(plan.tokens_before, tokens_after, ctx.thresholds)
        if not passes:
            code = Reason.RATIO_BELOW_FLOOR if "ratio" in reason else Reason.RECLAIMED_BELOW_FLOOR
            return Outcome.SKIPPED, reason, code
    # Even the exempt triggers never commit a capsule that makes the input larger.
    if tokens_after >= plan.tokens_before and plan.trigger is not Trigger.HARD_LIMIT:
        outcome = Outcome.FAILED if plan.trigger is Trigger.CONTEXT_OVERFLOW else Outcome.SKIPPED
        return outcome, (
            f"the capsule would not make the model input smaller ({plan.tokens_before} → {tokens_after} tokens)"
        ), Reason.NOT_SMALLER
    if tokens_after > plan.hard_limit:
        return (
            Outcome.FAILED,
            f"the continuation is still {tokens_after} tokens, above hardLimit {plan.hard_limit}",
            Reason.OVER_HARD_LIMIT,
        )
    if plan.must_be_below is not None and tokens_after >= plan.must_be_below:
        return Outcome.FAILED, (
            f"the continuation ({tokens_after} tokens) is not smaller than the request the provider "
            f"refused ({plan.must_be_below})"
        ), Reason.NOT_BELOW_REFUSED
    return None


def _previous_capsule(cut: Cut) -> Capsule | None:
    if cut.previous is None:
        return None
    try:
        return parse_capsule(cut.previous.content)
    except CapsuleFormatError:
        return None


def _record_without_capsule(plan: CompactionPlan, ctx: BarrierContext, result: CompactionResult) -> None:
    """A receipt of an operation that appended no capsule: it consumes the plan's intents
    and counts for the loop guard (soft triggers), across a kernel restart too."""
    if ctx.transcript.leaf != plan.expected_leaf:
        return
    outcome: Literal["skipped", "failed"] = "skipped" if result.outcome is Outcome.SKIPPED else "failed"
    ctx.transcript.append(
        CompactionEntry(
            operation_id=plan.operation_id,
            trigger=plan.trigger.value,
            outcome=outcome,
            reason=result.reason,
            consumed=list(plan.consumed),
            tokens_before=plan.tokens_before,
        )
    )


def _result(
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


def _flight(plan: CompactionPlan, result: CompactionResult) -> FlightRecord:
    return FlightRecord(
        operation_id=plan.operation_id,
        session_id=plan.session_id,
        trigger=plan.trigger.value,
        hard_limit=plan.hard_limit,
        soft_limit=plan.soft_limit,
        tokens_before=plan.tokens_before,
        tokens_after=result.tokens_after,
        reclaimed=result.reclaimed,
        outcome=result.outcome.value,
        reason=result.code.value,
        duration_ms=result.duration_ms,
        checkpoint_id=result.checkpoint_id,
        quality=result.quality,
        measurement_source=plan.measurement_source,
        continuation=result.continuation if result.outcome is Outcome.COMPLETED else None,
    )


def _emit(ctx: BarrierContext, event: CompactionEvent) -> None:
    if ctx.emit is not None:
        ctx.emit(event)
