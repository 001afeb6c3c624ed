"""The compaction engine: one path for every trigger, parameterised by trigger.

`Compactor` ties measurement, trigger rules, planning and the barrier to one transcript.
The agent loop calls `preflight()` before every inference, `compact()` for `%compact`,
`recover_overflow()` after a provider overflow, and `request_for_sending()` to get model
input that is known to be under the hard limit (fail-closed).

`native` (set by the session when its provider offers native compaction) makes every
operation ask the provider for its own compaction first, and model input replay the native
item while the provider and model are the ones that produced it (SPEC §5 item 2).
"""

from __future__ import annotations

import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import cast

import msgspec

from soba_nb.compaction.barrier import record_spent, run_barrier
from soba_nb.compaction.budget import BudgetTracker, Measurement
from soba_nb.compaction.budget_state import (
    BudgetStateFile,
    TrackerState,
    recordable,
    states_to_offer,
)
from soba_nb.compaction.extract_snapshots import ExtractSnapshots
from soba_nb.compaction.flight import FlightRecorder
from soba_nb.compaction.generation import generate_capsule
from soba_nb.compaction.limits import SummaryWindow
from soba_nb.compaction.model_input import (
    NOT_CLIPPED,
    ModelInput,
    VisibleContext,
    assemble,
    fixed_key,
    fixed_tokens,
    system_text,
    visible_context,
)
from soba_nb.compaction.native_continuation import NativeCompactor, NativeTarget
from soba_nb.compaction.outcomes import (
    BarrierContext,
    CompactionPlan,
    CompactionResult,
    Emit,
    Outcome,
)
from soba_nb.compaction.planner import Cut, NothingToCompact, current_request, plan_cut, region
from soba_nb.compaction.requests import DEFAULT_REQUEST_TOKENS
from soba_nb.compaction.summarizer import Summarizer
from soba_nb.compaction.triggers import (
    SOFT_TRIGGERS,
    Decision,
    Thresholds,
    Trigger,
    TurnState,
    decide,
)
from soba_nb.messages import ToolSchema
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    CheckpointKind,
    CompactionEntry,
    SkillEntry,
)
from soba_nb.transcript.store import Transcript

SUMMARY_OUTPUT_MIN = 256
SUMMARY_OUTPUT_MAX = 4096
SUMMARY_OUTPUT_SHARE = 8
"""The summary may use up to hardLimit / 8 output tokens, within the bounds above."""
OVERFLOW_MARGIN_TOKENS = 64


class HardLimitExceeded(RuntimeError):
    """The input cannot be brought under the hard limit: the request is not sent."""

    def __init__(self, tokens: int, hard_limit: int, reason: str = ""):
        detail = f" ({reason})" if reason else ""
        super().__init__(f"request not sent: the model input is {tokens:,} tokens, above hardLimit {hard_limit:,}{detail}")
        self.tokens = tokens
        self.hard_limit = hard_limit


def summary_output_tokens(hard_limit: int) -> int:
    return max(SUMMARY_OUTPUT_MIN, min(SUMMARY_OUTPUT_MAX, hard_limit // SUMMARY_OUTPUT_SHARE))


@dataclass
class CompactorSettings:
    """Everything the engine needs that is not the transcript."""

    thresholds: Thresholds
    timeout_ms: int
    max_output_tokens: int
    session_id: str
    user_request_tokens: int = DEFAULT_REQUEST_TOKENS
    """`compaction.userRequestTokens`: the user's requests a capsule quotes (SPEC §14)."""


@dataclass(frozen=True)
class SummaryModels:
    """What a compaction may ask a model for: a summary (`summarizer`) and the provider's
    native compaction (`native`, when it offers one). Given to the compactor together and
    swapped together (`Compactor.bind`): both come from one provider (a summary model of its
    own: the summarizer and its `window`, no native compaction)."""

    summarizer: Summarizer | None = None
    native: NativeCompactor | None = None
    window: SummaryWindow | None = None  # None: the session's limits (the summarizer is its model)


NO_MODELS = SummaryModels()
"""No model to ask: every capsule is the deterministic one."""


class Compactor:
    """Compaction for one session transcript."""

    def __init__(
        self,
        transcript: Transcript,
        counter: TokenCounter,
        settings: CompactorSettings,
        *,
        system: str,
        tools: Sequence[ToolSchema],
        summarizer: Summarizer | None = None,
        flight: FlightRecorder | None = None,
        kernel_state: Callable[[], Sequence[str]] | None = None,
        native: NativeCompactor | None = None,
    ):
        self.transcript = transcript
        self.counter = counter
        self.settings = settings
        self.system = system
        self.tools = tuple(tools)
        self.models = SummaryModels(summarizer, native)
        """The models compactions ask (`bind` replaces them whole)."""
        self.flight = flight
        self.kernel_state = kernel_state
        self.last_result: CompactionResult | None = None
        self._leaf_after_operation: str | None = None
        self.listeners: list[Emit] = []
        self.budget_file = BudgetStateFile(transcript.file)  # a resumed session starts from it
        saved = states_to_offer(self.budget_file, transcript.path_view(), counter)
        self._fixed_key = fixed_key(system, self.tools)
        self.deciding_keys: tuple[str, ...] = ()
        """Keys of counts that decided what the input carries (the full schemas' cost chose compact
        ones for a small window): kept with the tracker's state, so a session or `soba-nb
        budget` opened from it decides the same without a tokenizer."""
        self.tracker = BudgetTracker(counter, fixed_tokens(system, self.tools, counter))
        self.tracker.offer(*saved)
        self.snapshots: ExtractSnapshots | None = ExtractSnapshots(transcript.file)
        """The extract's scan, carried forward at preflights and saved beside the transcript
        (None once given up)."""

    # -- measurement ---------------------------------------------------------------------

    @property
    def thresholds(self) -> Thresholds:
        return self.settings.thresholds

    def bind(self, models: SummaryModels) -> None:
        """The models compactions ask from now on (the summarizer and the native compaction
        of one provider), replacing the previous ones whole."""
        self.models = models

    @property
    def summarizer(self) -> Summarizer | None:
        return self.models.summarizer

    @property
    def native(self) -> NativeCompactor | None:
        """The provider's native compaction, when it offers one."""
        return self.models.native

    def set_tools(self, tools: Sequence[ToolSchema], system: str | None = None) -> None:
        """Other tool schemas (a small window gets compact ones) or another system prompt (a
        new environment line) from the next request on: the fixed part of every input
        changes, and the measurement with it."""
        tools, system = tuple(tools), self.system if system is None else system
        if (tools, system) == (self.tools, self.system):
            return
        self.tools, self.system = tools, system
        self._fixed_key = fixed_key(system, tools)
        self.tracker.set_fixed(fixed_tokens(system, tools, self.counter))

    def update_settings(self, settings: CompactorSettings) -> None:
        self.settings = settings

    @property
    def target(self) -> NativeTarget | None:
        """The provider and model requests go to, when it replays native items."""
        return self.native.target if self.native is not None else None

    def measure(self) -> Measurement:
        self.tracker.set_target(self.target)
        measurement = self.tracker.measure(self.transcript.path_view())
        self._save_budget_state()
        return measurement

    def _save_budget_state(self) -> None:
        """Keep the tracker's state beside the transcript (when it changed)."""
        if self.budget_file.failed:
            return
        state = self._tracker_state()
        if state is not None:
            self.budget_file.save(state)

    def _tracker_state(self) -> TrackerState | None:
        """The tracker's state as of the last `measure`, with the counts besides the entries'
        the model input needs (system prompt and tools, the capsule)."""
        tracker = self.tracker
        keys = [self._fixed_key, *self.deciding_keys]
        if tracker.capsule_id is not None:
            keys.append(tracker.capsule_id)
        counts = {key: known for key in keys if (known := self.counter.peek(key)) is not None}
        return tracker.state(counts)

    def keep_extract_snapshots(self) -> None:
        """Carry the extract's scan forward when the region has grown enough (as of the last
        `measure`): a summary request then reads only what came after the newest snapshot.

        A cache must never cost a request: should keeping it fail, it is given up for this
        session with a warning (summaries then scan from the first entry, as without it)."""
        if self.snapshots is None:
            return
        try:
            self.snapshots.follow(self.transcript.path_view(), self.tracker.capsule_index)
        except Exception as exc:  # noqa: BLE001 - a bug here must not fail the user's request
            warnings.warn(
                f"soba-nb: extract snapshots given up for this session ({type(exc).__name__}: {exc})",
                RuntimeWarning,
                stacklevel=2,
            )
            self.snapshots = None

    def context(self) -> VisibleContext:
        """The model-visible part of the current path (using the tracker's incremental state)."""
        self.measure()
        tracker = self.tracker
        return visible_context(
            self.transcript.path_view(), capsule_at=tracker.capsule_index, skills=tracker.skills, target=self.target
        )

    def model_input(self, *, fit: bool = True) -> ModelInput:
        """The model input of the current path (emergency clipping toward the hard limit)."""
        built = self._assembled(fit)
        if fit and NOT_CLIPPED in built.notes and self.send_figure(built) <= self.thresholds.hard_limit:
            # Over the hard limit on our count only: the provider's figure, which the send check
            # reads, says it fits (a server or gateway counting lower than our estimate).
            # Nothing was clipped and nothing is wrong: no note.
            built = msgspec.structs.replace(built, notes=tuple(note for note in built.notes if note != NOT_CLIPPED))
        return built

    def _assembled(self, fit: bool) -> ModelInput:
        context = self.context()
        tracker = self.tracker
        if tracker.backlog is not None and (not fit or self._beyond_clipping(context)):
            # Nothing is clipped (no clip would make it fit: it is never sent as it is), so the
            # entries before the last usage figure need no count; its size counts them if read.
            built = assemble(
                context, system=self.system, tools=self.tools, counter=self.counter,
                sums=tracker.counted_region, backlog=tracker.backlog,
            )  # fmt: skip
            return msgspec.structs.replace(built, notes=(NOT_CLIPPED, *built.notes)) if fit else built  # (said before a repair)
        # Clipped to fit on the scale the send check reads (the provider's count when it is higher).
        measurement = self.measure()
        calibration = max(measurement.effective - measurement.estimated, 0)
        fit_to = self.thresholds.hard_limit - calibration if fit else None
        return assemble(
            context,
            system=self.system,
            tools=self.tools,
            counter=self.counter,
            fit_to=fit_to,
            sums=self.tracker.region_tokens,
        )

    def _beyond_clipping(self, context: VisibleContext) -> bool:
        """Even with every tool output gone, the input's least possible size (counting nothing)
        is over the hard limit, and so over what clipping aims at (`assemble` would clip
        nothing and say so)."""
        least = fixed_tokens(system_text(self.system, context.skills), self.tools, self.counter)
        least += context.capsule_tokens(self.counter) + self.tracker.visible_floor
        return least > self.thresholds.hard_limit

    def send_figure(self, built: ModelInput) -> int:
        """The size of `built` on the scale the trigger reads: effective tokens (SPEC §2, the
        provider's last usage figure plus our count of what came after it; our estimate
        before any figure), less what the assembler clipped. One figure for both decisions,
        so the send check never refuses what the trigger thought fits. Never below 0: a server
        that reports far fewer tokens than we count (a gateway's own figure, a cut prompt) would
        make the clipped part larger than the figure, and a request of "-2,216 tokens" is no size."""
        measurement = self.measure()
        if built.backlog is not None and built.backlog is measurement.backlog:
            # The same entries left out of both figures: their difference needs no count of them.
            return max(0, built.counted + (measurement.effective - measurement.counted))
        return max(0, built.tokens + (measurement.effective - measurement.estimated))

    def request_for_sending(self, cancel: threading.Event | None = None) -> ModelInput:
        """Model input known to be under the hard limit, or `HardLimitExceeded` (fail-closed).

        Whenever the check would refuse, a `hard_limit` compaction runs first, whatever `auto`
        says, unless one already ran with nothing appended since (the preflight's).
        """
        built = self.model_input()
        tokens = self.send_figure(built)
        hard = self.thresholds.hard_limit
        if tokens > hard and not self._forced_attempt_is_current():
            self._operate(Trigger.HARD_LIMIT, self.measure(), cancel or threading.Event())
            built = self.model_input()
            tokens = self.send_figure(built)
        if tokens > hard:
            last = self.last_result
            reason = last.reason if last is not None and last.outcome is not Outcome.COMPLETED else ""
            raise HardLimitExceeded(tokens, hard, reason)
        return built

    def _forced_attempt_is_current(self) -> bool:
        last = self.last_result
        forced = (Trigger.HARD_LIMIT.value, Trigger.CONTEXT_OVERFLOW.value)
        return last is not None and last.trigger in forced and self._leaf_after_operation == self.transcript.leaf

    # -- intents -------------------------------------------------------------------------

    def record_turn_complete(self, note: str = "") -> CheckpointEntry:
        """A finished turn: a `turn` checkpoint, an intent only when the config asks for it,
        carrying the tracker's state up to it (the turn's answer counted now, while the
        tokenizer is at hand): the transcript copied alone then opens without counting."""
        t = self.thresholds
        intent = t.auto and t.compact_on_turn_complete
        self.measure()
        budget = recordable(self._tracker_state())
        written = self.transcript.append(CheckpointEntry(kind="turn", note=note, intent=intent, budget=budget))
        assert isinstance(written, CheckpointEntry)
        return written

    def record_checkpoint(self, kind: str, note: str) -> CheckpointEntry:
        """A milestone / plan_pivot (pending intent) or a user checkpoint (no intent)."""
        if kind not in ("milestone", "plan_pivot", "user"):
            raise ValueError(f"checkpoint kind {kind!r}: must be milestone, plan_pivot or user")
        entry = CheckpointEntry(kind=cast(CheckpointKind, kind), note=note, intent=kind != "user")
        written = self.transcript.append(entry)
        assert isinstance(written, CheckpointEntry)
        return written

    # -- operations ----------------------------------------------------------------------

    def preflight(self, turn: TurnState, cancel: threading.Event | None = None) -> CompactionResult | None:
        """Run before every inference: at most one compaction, to a terminal outcome."""
        cancel = cancel or threading.Event()
        measurement = self.measure()
        self.keep_extract_snapshots()
        intents = self.tracker.pending_intents
        decision = decide(
            effective=measurement.effective, t=self.thresholds, intents=intents, turn=turn, guard=self.tracker.guard
        )
        if decision.trigger is None:
            if decision.consumed:
                self._consume_without_operation(decision)
            return None
        if decision.trigger in SOFT_TRIGGERS:
            turn.soft_attempted = True
        return self._operate(decision.trigger, measurement, cancel, consumed=decision.consumed)

    def compact(self, *, focus: str | None = None, cancel: threading.Event | None = None) -> CompactionResult:
        """Explicit `%compact`: trigger `user`, no soft ROI gate; skipped when nothing to compact."""
        self.measure()
        intents = self.tracker.pending_intents
        return self._operate(Trigger.USER, self.measure(), cancel or threading.Event(), focus=focus, consumed=tuple(intents))

    def make_capsule(
        self, *, focus: str | None = None, cancel: threading.Event | None = None
    ) -> CapsuleEntry | None:
        """A capsule of the whole current path, NOT appended: `%capsule create`'s handoff.

        The same generation as a compaction (model summary within `timeoutMs`, else the
        deterministic capsule, `quality: degraded`), over everything since the previous
        capsule's kept tail, with nothing kept. The session is left unchanged but for the
        summary request's usage (it was paid for); None if cancelled.
        """
        cancel = cancel or threading.Event()
        measurement = self.measure()
        path = self.transcript.path_view()
        summarize, previous = region(path, capsule_at=self.tracker.capsule_index)
        cut = Cut(tuple(summarize), (), None, 0, measurement.estimated, previous, current_request(path))
        plan = replace(self._plan(Trigger.USER, measurement, focus, (), None, None), cut=cut, unplannable=None)
        # A handoff is portable by nature: the provider's native item is not asked for.
        context = replace(self._barrier_context(), native=None)
        generated = generate_capsule(plan, cut, context, cancel, time.monotonic())
        record_spent(context)
        if isinstance(generated, CompactionResult) or cancel.is_set():
            return None
        return generated.entry

    def recover_overflow(
        self,
        refused_tokens: int,
        ceiling: int | None,
        cancel: threading.Event | None = None,
    ) -> CompactionResult:
        """One forced compaction after a provider overflow: the retry must be strictly smaller
        than the refused request (`refused_tokens`, on the effective scale) and, when the
        server stated its limit, at most `ceiling` (what fits that limit on our scale)."""
        target = self.thresholds.hard_limit
        if ceiling is not None:
            target = min(target, ceiling - OVERFLOW_MARGIN_TOKENS)
        target = min(target, refused_tokens - 1)
        return self._operate(
            Trigger.CONTEXT_OVERFLOW,
            self.measure(),
            cancel or threading.Event(),
            target=max(target, 1),
            must_be_below=refused_tokens,
        )

    def _operate(
        self,
        trigger: Trigger,
        measurement: Measurement,
        cancel: threading.Event,
        *,
        focus: str | None = None,
        consumed: Sequence[CheckpointEntry] = (),
        target: int | None = None,
        must_be_below: int | None = None,
    ) -> CompactionResult:
        plan = self._plan(trigger, measurement, focus, consumed, target, must_be_below)
        result = run_barrier(plan, self._barrier_context(), cancel)
        self._finish(result)
        return result

    def _plan(
        self,
        trigger: Trigger,
        measurement: Measurement,
        focus: str | None,
        consumed: Sequence[CheckpointEntry],
        target: int | None,
        must_be_below: int | None,
    ) -> CompactionPlan:
        if self.tracker.settle():  # a backlog, which the plan counts anyway: counted first, the figure pairs
            measurement = self.measure()  # with what was sent (`effective.measured_count`), no clip carried
        t = self.thresholds
        summary_tokens, summary_input = summary_output_tokens(t.hard_limit), t.hard_limit
        if (own := self.models.window) is not None:  # a summary model of its own: its window, its ceiling
            summary_tokens, summary_input = min(summary_tokens, own.output_tokens), own.input_tokens
        max_kept: int | None = None
        if trigger in (Trigger.HARD_LIMIT, Trigger.CONTEXT_OVERFLOW):
            goal = target if target is not None else t.hard_limit
            # The continuation is measured on the effective scale: when the provider counts
            # more than we do, that difference carries over and must fit too.
            calibration = max(measurement.effective - measurement.estimated, 0)
            max_kept = max(goal - calibration - self.tracker.fixed - summary_tokens, 0)
        cut: Cut | None = None
        unplannable = None
        try:
            self.measure()  # up to date (incremental): its capsule index spares a scan
            cut = plan_cut(
                self.transcript.path_view(),
                self.counter,
                keep_recent_tokens=t.keep_recent_tokens,
                max_kept_tokens=max_kept,
                capsule_at=self.tracker.capsule_index,
                facts=self.tracker.region_facts,
            )
        except NothingToCompact as exc:
            unplannable = str(exc)
        return CompactionPlan(
            operation_id="op_" + uuid.uuid4().hex[:12],
            session_id=self.settings.session_id,
            trigger=trigger,
            expected_leaf=self.transcript.leaf,
            cut=cut,
            hard_limit=t.hard_limit,
            soft_limit=t.soft_limit,
            tokens_before=measurement.effective,
            estimated_before=measurement.estimated,
            measurement_source=measurement.source,
            summary_output_tokens=summary_tokens,
            summary_input_tokens=summary_input,
            focus=focus,
            consumed=tuple(c.checkpoint_id for c in consumed),
            must_be_below=must_be_below,
            unplannable=unplannable,
        )

    def _barrier_context(self) -> BarrierContext:
        return BarrierContext(
            transcript=self.transcript,
            counter=self.counter,
            thresholds=self.thresholds,
            system=self.system,
            tools=self.tools,
            timeout_ms=self.settings.timeout_ms,
            summarizer=self.summarizer,
            skills=self._skills(),
            kernel_state=tuple(self.kernel_state()) if self.kernel_state else (),
            flight=self.flight,
            emit=self._emit,
            native=self.native,
            snapshots=self.snapshots,
            user_request_tokens=self.settings.user_request_tokens,
        )

    def _consume_without_operation(self, decision: Decision) -> None:
        self.transcript.append(
            CompactionEntry(
                operation_id="op_" + uuid.uuid4().hex[:12],
                trigger=_intent_trigger(decision).value,
                outcome="skipped",
                reason=decision.skip_reason or "gates not met",
                consumed=[c.checkpoint_id for c in decision.consumed],
            )
        )

    def _finish(self, result: CompactionResult) -> None:
        self.last_result = result
        self._leaf_after_operation = self.transcript.leaf

    def _skills(self) -> tuple[SkillEntry, ...]:
        self.measure()
        return self.tracker.skills

    def _emit(self, event: object) -> None:
        for listener in list(self.listeners):
            listener(event)  # type: ignore[arg-type]

    def system_with_skills(self) -> str:
        return system_text(self.system, self._skills())


def _intent_trigger(decision: Decision) -> Trigger:
    kinds = {c.kind for c in decision.consumed}
    if "plan_pivot" in kinds:
        return Trigger.PLAN_PIVOT
    if "milestone" in kinds:
        return Trigger.MILESTONE
    return Trigger.TURN_COMPLETE
