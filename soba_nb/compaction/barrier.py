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

import threading
import time
from typing import Literal

from soba_nb.compaction.fitting import (
    request_alone_reason,
)
from soba_nb.compaction.flight import FlightRecord
from soba_nb.compaction.generation import (
    FORCED,
    TOO_LARGE,
    Generated,
    Note,
    continuation_goal,
    generate_capsule,
    keep_less,
)
from soba_nb.compaction.instructions import fixed_parts_name
from soba_nb.compaction.model_input import (
    entry_tokens,
    fixed_tokens,
)
from soba_nb.compaction.outcomes import (
    BarrierContext,
    CompactionEvent,
    CompactionPlan,
    CompactionResult,
    Outcome,
    Reason,
    emit_event,
    result_of,
)
from soba_nb.compaction.planner import Cut
from soba_nb.compaction.triggers import POST_GATE_EXEMPT, Trigger, post_generation_roi
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CompactionEntry,
    ToolCallEntry,
    ToolResultEntry,
)


def run_barrier(plan: CompactionPlan, ctx: BarrierContext, cancel: threading.Event) -> CompactionResult:
    """Run `plan` to a terminal outcome and return it (appending a capsule only on `completed`)."""
    started = time.monotonic()
    emit_event(ctx, CompactionEvent("compaction_start", plan.operation_id, plan.trigger.value))
    emit_event(ctx, CompactionEvent("compaction_progress", plan.operation_id, plan.trigger.value, 0))
    try:
        result = _run(plan, ctx, cancel, started)
    except KeyboardInterrupt:
        cancel.set()
        result = result_of(plan, Outcome.CANCELLED, "interrupted", started, code=Reason.INTERRUPTED)
    if result.outcome in (Outcome.SKIPPED, Outcome.FAILED):
        _record_without_capsule(plan, ctx, result)
    record_spent(ctx)
    if ctx.flight is not None:
        ctx.flight.record(_flight(plan, result))
    emit_event(ctx, CompactionEvent("compaction_end", plan.operation_id, plan.trigger.value, 100, result))
    return result

def _run(plan: CompactionPlan, ctx: BarrierContext, cancel: threading.Event, started: float) -> CompactionResult:
    cut = plan.cut
    if cut is None:
        forced = plan.trigger in (Trigger.HARD_LIMIT, Trigger.CONTEXT_OVERFLOW)
        outcome = Outcome.FAILED if forced else Outcome.SKIPPED
        return result_of(plan, outcome, plan.unplannable or "", started, code=Reason.NOTHING_TO_COMPACT)
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
        smaller = keep_less(plan, cut, ctx, cancel, started, generated)
        if isinstance(smaller, CompactionResult):
            return smaller
        generated, verdict = smaller, _gates(plan, smaller.tokens_after, ctx)
        if verdict is not None and smaller.tokens_after > continuation_goal(plan):
            request = 0 if cut.request is None else entry_tokens(cut.request, ctx.counter)
            fixed = fixed_tokens(ctx.system, ctx.tools, ctx.counter)
            calls = _calls_kept(smaller.entry, cut, ctx)
            reason = request_alone_reason(
                generated.tokens_after, fixed, request, continuation_goal(plan), calls, fixed_parts_name(ctx.system)
            )
            verdict = (Outcome.FAILED, reason, verdict[2])
    entry, tokens_after = generated.entry, generated.tokens_after
    if verdict is not None:
        return result_of(plan, verdict[0], verdict[1], started, tokens_after=tokens_after, code=verdict[2])
    emit_event(ctx, CompactionEvent("compaction_progress", plan.operation_id, plan.trigger.value, 95))
    # The last check before the append: abort signal, then the expected leaf.
    if cancel.is_set():
        return result_of(plan, Outcome.CANCELLED, "cancelled before the capsule was appended", started, code=Reason.CANCELLED)
    if ctx.transcript.leaf != plan.expected_leaf:
        return result_of(
            plan, Outcome.STALE, "the session leaf changed while the summary ran", started, code=Reason.LEAF_CHANGED
        )
    written = ctx.transcript.append(entry)
    assert isinstance(written, CapsuleEntry)
    reason, code = _completed_reason(generated)
    return result_of(
        plan, Outcome.COMPLETED, reason, started,
        tokens_after=tokens_after, entry=written, quality=entry.quality, code=code,
    )

def _calls_kept(entry: CapsuleEntry, cut: Cut, ctx: BarrierContext) -> int:
    """The tokens of the tool calls and results the shortest continuation kept after the
    capsule `entry` (the request's own calls, when the request outgrew the window)."""
    kept = cut.kept if entry.first_kept_entry_id is None else next(
        (cut.kept[index:] for index, kept in enumerate(cut.kept) if kept.id == entry.first_kept_entry_id), cut.kept
    )
    return sum(entry_tokens(e, ctx.counter) for e in kept if isinstance(e, ToolCallEntry | ToolResultEntry))


def _completed_reason(generated: Generated) -> tuple[str, Reason]:
    """The reason of a completed operation: why a fallback was used, why native was not."""
    note, native_note = generated.note, generated.native_note
    if note is not None:
        detail = f"; {native_note.text}" if native_note is not None and native_note is not note else ""
        return f"fallback: {note.text}{detail}", note.code
    if native_note is not None:
        return f"portable: {native_note.text}", native_note.code
    return "", Reason.OK

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

def record_spent(ctx: BarrierContext) -> None:
    """The usage of the operation's requests, after its capsule or `compaction` entry (SPEC
    §11: compaction requests are priced too; their figures never measure the budget)."""
    spent, ctx.spent = ctx.spent, []
    for usage in spent:
        ctx.transcript.append(usage)

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
