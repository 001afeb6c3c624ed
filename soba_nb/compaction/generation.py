"""Capsule generation for one planned operation (SPEC §4, §6): the provider's native item, the
model summary within `timeoutMs` (in a worker thread, abortable), or the deterministic
fallback, measured as the whole continuation; for a forced compaction over the limit, the
fallback gives way and less is kept (`soba_nb.compaction.fitting`). Nothing is appended
here: the barrier decides.
"""


from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

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
    requests_of,
    scan_for_capsule,
    with_images_named,
    with_requests,
)
from soba_nb.compaction.effective import effective_from
from soba_nb.compaction.fitting import (
    first_fitting,
    later_cuts,
    shortest_fitting,
)
from soba_nb.compaction.given_way import NO_CAPSULE, GivenWay, as_capsule, given_way, given_way_form
from soba_nb.compaction.model_input import (
    VISIBLE_TYPES,
    ModelInput,
    VisibleContext,
    assemble,
    native_cost_key,
)
from soba_nb.compaction.native_continuation import NativeCompactor
from soba_nb.compaction.native_step import NativeFailure, ask_native, native_request
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
from soba_nb.compaction.summarizer import RequestNotSent, Summarizer, SummaryOutput
from soba_nb.compaction.summary_prompt import PromptBudgetTooSmall, ScanStarts, build_summary_prompt
from soba_nb.compaction.triggers import Trigger
from soba_nb.transcript.entries import (
    CapsuleEntry,
    Continuation,
    NativeContinuation,
    Quality,
    new_checkpoint_id,
)

PROGRESS_INTERVAL_S = 0.25
"""Progress events are emitted at least this often while the summary runs (UI needs ≤ 0.5 s)."""

PROGRESS_BEFORE_SUMMARY = 5

PROGRESS_SUMMARY_DONE = 90

PROGRESS_CAP_WHILE_RUNNING = 89

CHARS_PER_SUMMARY_TOKEN = 4

POLL_S = 0.05

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

NO_ROOM = Note(
    "the window is too small even for a one-line capsule: no capsule is sent", Reason.FALLBACK_TOO_LARGE
)
"""Why a continuation carries no capsule at all (SPEC §17): nothing else made it fit."""

REQUESTS_SHARE_OF_HARD_LIMIT = 8
"""The requests a capsule quotes take at most this fraction (1/8) of the hard limit: in a small
window `compaction.userRequestTokens` would crowd out the rest (the request being worked on is
quoted whole all the same)."""


def quoted_request_tokens(user_request_tokens: int, hard_limit: int) -> int:
    """The tokens the quoted requests may take: `compaction.userRequestTokens`, or less in a
    window too small for it."""
    return min(user_request_tokens, max(hard_limit // REQUESTS_SHARE_OF_HARD_LIMIT, 0))


def continuation_goal(plan: CompactionPlan) -> int:
    """The most the continuation may be: the hard limit, and below the refused request."""
    return plan.hard_limit if plan.must_be_below is None else min(plan.hard_limit, plan.must_be_below - 1)

def keep_less(
    plan: CompactionPlan, cut: Cut, ctx: BarrierContext, cancel: threading.Event, started: float, last: Generated
) -> Generated | CompactionResult:
    """The fallback capsule of the latest cut that fits (`fitting.later_cuts`; down to a
    one-line capsule), else no capsule at all with the most kept that fits (SPEC §17), else
    the shortest continuation of all (no capsule, the least kept), which the barrier refuses
    saying the request cannot fit even alone."""
    tried: dict[tuple[str, bool], Generated] = {}
    stopped: list[CompactionResult] = []

    def fitting(no_capsule: bool) -> Callable[[Cut], bool]:
        def fits(candidate: Cut) -> bool:
            return generated_for(candidate, no_capsule).tokens_after <= continuation_goal(plan) if not stopped else False

        return fits

    def generated_for(candidate: Cut, no_capsule: bool) -> Generated:
        key = (candidate.first_kept_entry_id or "", no_capsule)
        if key not in tried:
            note = NO_ROOM if no_capsule else KEPT_LESS
            generated = generate_capsule(plan, candidate, ctx, cancel, started, fallback_note=note, no_capsule=no_capsule)
            if isinstance(generated, CompactionResult):
                stopped.append(generated)
                return last
            tried[key] = generated
        return tried[key]

    candidates = later_cuts(cut, ctx.counter)
    found = first_fitting(candidates, fitting(False))
    if not stopped and found is not None:
        return tried[(found.first_kept_entry_id or "", False)]
    # Not even a one-line capsule leaves room: none, keeping the most that fits.
    everything = [cut, *candidates]
    found = first_fitting(everything, fitting(True)) if not stopped else None
    if not stopped and found is None:
        generated_for(everything[-1], True)
    if stopped:
        return stopped[0]
    return tried[((found or everything[-1]).first_kept_entry_id or "", True)]

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
    no_capsule: bool = False,
) -> Generated | CompactionResult:
    """The native item (beside the deterministic capsule), the model capsule or the
    deterministic fallback of `cut`, measured; nothing appended.

    `fallback_note`: build the deterministic capsule without asking the model, for this reason.
    `native_note`: do not ask the provider for native compaction, for this reason.
    `no_capsule` (with a `fallback_note`): the capsule gives way entirely, none is sent
    (`soba_nb.compaction.given_way`).
    Returns a terminal `CompactionResult` only when cancelled while the summary ran.
    """
    previous = _previous_capsule(cut)
    request, quote = _request_to_quote(cut)
    scan = scan_for_capsule(cut.summarize, kept=cut.kept, scans=_scan_starts(ctx, cut))
    # The user's requests are soba's to quote, never the summarizer's (SPEC §14).
    requests = requests_of(cut.summarize, cut.kept, previous, cut.request, from_start=cut.previous is None)
    request_tokens = quoted_request_tokens(ctx.user_request_tokens, plan.hard_limit)
    count = ctx.counter.count_text

    def fallback(items_max: int | None = None, request_chars: int | None = None) -> Capsule | GivenWay:
        if request_chars is not None and request_chars < 0:  # a one-line capsule, or none
            return given_way(requests, request_chars)
        return capsule_from_scan(
            scan,
            previous=previous,
            kept=cut.kept,
            kernel_state=ctx.kernel_state,
            requests=requests,
            request_tokens=request_tokens,
            count=count,
            items_max=items_max,
            request_chars=request_chars,
            giving_way=items_max is not None or request_chars is not None,
        )

    deterministic = capsule_from_scan(
        scan, previous=previous, kept=cut.kept, kernel_state=ctx.kernel_state, requests=requests,
        request_tokens=request_tokens, count=count,
    )
    capsule: Capsule | GivenWay = given_way(requests, NO_CAPSULE) if no_capsule else deterministic
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
            capsule = with_images_named(outcome.model_copy(update={"kernel_state": deterministic.kernel_state}), scan)
            capsule = with_requests(capsule, requests, request_tokens, count)
            quality, note = "full", None
            model, provider = ctx.summarizer.model, ctx.summarizer.provider
        else:
            note = outcome
    continuation: Continuation | None = None
    if ctx.native is not None:
        continuation = "native" if native is not None else "portable" if quality == "full" else "fallback"
    # Measured locally and exactly, then put on the scale of `tokens_before`: when that was
    # the provider's figure, its difference from our estimate carries over (like with like).
    counted_then = plan.estimated_before if plan.estimated_before is not None else plan.tokens_before
    fit_to = plan.hard_limit - max(plan.tokens_before - counted_then, 0)

    def measured(capsule: Capsule | GivenWay) -> tuple[CapsuleEntry, int]:
        checkpoint = new_checkpoint_id()
        entry = CapsuleEntry(
            operation_id=plan.operation_id,
            checkpoint_id=checkpoint,
            trigger=plan.trigger.value,
            quality=quality,
            tokens_before=plan.tokens_before,
            tokens_after=0,
            estimated_before=plan.estimated_before,
            first_kept_entry_id=cut.first_kept_entry_id,
            rolls_up=cut.previous.id if cut.previous else None,
            model=model,
            provider=provider,
            content=capsule.content(checkpoint) if isinstance(capsule, GivenWay) else render_capsule(capsule),
            native=native,
            continuation=continuation,
        )
        tokens_after = max(effective_from(plan.tokens_before, counted_then, measure_continuation(entry, cut, fit_to, ctx).tokens), 0)
        ctx.counter.forget(entry.id)
        ctx.counter.forget(native_cost_key(entry))
        return msgspec.structs.replace(entry, tokens_after=tokens_after), tokens_after

    entry, tokens_after = measured(capsule)
    goal = continuation_goal(plan)
    if quality == "degraded" and native is None and tokens_after > goal and not no_capsule:
        # The fallback over the limit (a long session's lists, a small window): it gives way,
        # lists first, then its quoted requests, down to one line (`fitting`); a shorter
        # capsule beats a stranded session.
        entry, tokens_after = shortest_fitting(
            lambda items_max, request_chars: measured(fallback(items_max, request_chars)), goal
        )
        if given_way_form(entry.content) == "one line" and note is not None:
            note = Note(f"{note.text}; the window is too small for the capsule's sections: it is one line", note.code)
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
            emit_event(ctx, CompactionEvent("compaction_progress", plan.operation_id, plan.trigger.value, percent))

    asked = ask_native(
        compactor, request, cancel=cancel, deadline=started + timeout_s, timeout_ms=ctx.timeout_ms, on_poll=on_poll,
        on_usage=ctx.spent.append,
    )
    if asked is None:
        return result_of(plan, Outcome.CANCELLED, "cancelled while the native compaction ran", started, code=Reason.CANCELLED)
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
    try:
        prompt = build_summary_prompt(
            cut.summarize,  # (a tuple: not copied, 300k entries are 2 ms)
            previous=previous,
            focus=plan.focus,
            max_input_tokens=plan.summary_input_tokens,
            count=ctx.counter.count_text,
            scans=_scan_starts(ctx, cut),
        )
    except PromptBudgetTooSmall as exc:
        # A window too small for the summary instructions (a small server, a learned window):
        # the deterministic capsule needs no model; whether the continuation fits is judged next.
        return Note(f"the model summary was not asked: the window is too small for it ({exc})", Reason.FALLBACK_FAILED)
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
                return result_of(plan, Outcome.CANCELLED, "cancelled while the summary ran", started, code=Reason.CANCELLED)
            if now >= deadline:
                run.abort.set()
                _price_cut_off(ctx, plan, prompt.system, prompt.user, run.chars)
                return Note(f"the model summary did not finish within timeoutMs={ctx.timeout_ms}", Reason.FALLBACK_TIMEOUT)
            if now - last_progress >= PROGRESS_INTERVAL_S:
                last_progress = now
                percent = _percent(now - started, timeout_s, run.chars, expected_chars)
                emit_event(ctx, CompactionEvent("compaction_progress", plan.operation_id, plan.trigger.value, percent))
    except KeyboardInterrupt:
        run.abort.set()
        raise
    if cancel.is_set():
        return result_of(plan, Outcome.CANCELLED, "cancelled while the summary ran", started, code=Reason.CANCELLED)
    emit_event(ctx, CompactionEvent("compaction_progress", plan.operation_id, plan.trigger.value, PROGRESS_SUMMARY_DONE))
    if run.error is not None and not isinstance(run.error, RequestNotSent) and time.monotonic() >= deadline - POLL_S:
        # The summarizer was given the same deadline: its own timeout may end it a moment
        # before ours. That is the deadline, not a failure of the model.
        _price_cut_off(ctx, plan, prompt.system, prompt.user, run.chars)
        return Note(f"the model summary did not finish within timeoutMs={ctx.timeout_ms}", Reason.FALLBACK_TIMEOUT)
    if isinstance(run.error, RequestNotSent):
        return Note(f"the model summary was not asked ({run.error})", Reason.FALLBACK_FAILED)
    if run.error is not None:
        return Note(f"the model summary failed ({type(run.error).__name__}: {run.error})", Reason.FALLBACK_FAILED)
    assert run.output is not None
    if run.output.usage is not None:
        ctx.spent.append(run.output.usage)
    try:
        return validate_summary(
            run.output.text, finish_reason=run.output.finish_reason, has_tool_calls=run.output.has_tool_calls
        )
    except InvalidSummary as exc:
        return Note(f"the model summary was rejected ({exc})", Reason.FALLBACK_REJECTED)

def _price_cut_off(ctx: BarrierContext, plan: CompactionPlan, system: str, user: str, received_chars: int) -> None:
    """A summary the deadline cut off was sent all the same: priced for what was sent and
    received so far (SPEC §16), recorded with the operation's other requests."""
    assert ctx.summarizer is not None
    usage = ctx.summarizer.cut_off_usage(system, user, received_chars=received_chars, operation_id=plan.operation_id)
    if usage is not None:
        ctx.spent.append(usage)

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

def _previous_capsule(cut: Cut) -> Capsule | None:
    if cut.previous is None:
        return None
    if given_way_form(cut.previous.content) is not None:  # one line: the request it carries
        return as_capsule(cut.previous.content)
    try:
        return parse_capsule(cut.previous.content)
    except CapsuleFormatError:
        return None
