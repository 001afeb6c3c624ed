"""Triggers, pending intents, priority, the pre-generation ROI gate and the loop guard (SPEC §6)."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from msgspec import Struct, field

from soba_nb.compaction.model_input import latest_capsule_index
from soba_nb.transcript.entries import CheckpointEntry, CompactionEntry, Entry

LOOP_GUARD_FAILURES = 3
"""Consecutive soft compactions ending skipped/failed before soft triggers pause."""


class Trigger(str, Enum):
    HARD_LIMIT = "hard_limit"
    AUTO_THRESHOLD = "auto_threshold"
    TURN_COMPLETE = "turn_complete"
    MILESTONE = "milestone"
    PLAN_PIVOT = "plan_pivot"
    USER = "user"
    CONTEXT_OVERFLOW = "context_overflow"


SOFT_TRIGGERS = frozenset({Trigger.AUTO_THRESHOLD, Trigger.TURN_COMPLETE, Trigger.MILESTONE, Trigger.PLAN_PIVOT})
POST_GATE_EXEMPT = frozenset({Trigger.HARD_LIMIT, Trigger.CONTEXT_OVERFLOW, Trigger.USER})
INTENT_KINDS = {"milestone": Trigger.MILESTONE, "plan_pivot": Trigger.PLAN_PIVOT, "turn": Trigger.TURN_COMPLETE}


class Thresholds(Struct, frozen=True):
    """The configuration figures the trigger rules read."""

    hard_limit: int
    soft_limit: int
    auto: bool
    compact_on_turn_complete: bool
    compact_on_milestone: bool
    min_tokens_for_auto_compact: int
    min_reclaimable_tokens: int
    min_savings_ratio: float
    keep_recent_tokens: int


class RoiEstimate(Struct, frozen=True):
    """Pre-generation ROI: reclaimable = effective - keepRecentTokens, ratio = reclaimable / effective."""

    reclaimable: int
    savings_ratio: float
    passes: bool
    reason: str


def pre_generation_roi(effective: int, t: Thresholds) -> RoiEstimate:
    reclaimable = effective - t.keep_recent_tokens
    ratio = reclaimable / effective if effective > 0 else 0.0
    if reclaimable < t.min_reclaimable_tokens:
        return RoiEstimate(
            reclaimable, ratio, False,
            f"reclaimable {reclaimable} < minReclaimableTokens {t.min_reclaimable_tokens}",
        )
    if ratio < t.min_savings_ratio:
        return RoiEstimate(reclaimable, ratio, False, f"savings ratio {ratio:.2f} < minSavingsRatio {t.min_savings_ratio}")
    return RoiEstimate(reclaimable, ratio, True, "")


def post_generation_roi(tokens_before: int, tokens_after: int, t: Thresholds) -> tuple[bool, str]:
    """After generation: the real reclaimed tokens and ratio must both reach their floors."""
    reclaimed = tokens_before - tokens_after
    ratio = reclaimed / tokens_before if tokens_before > 0 else 0.0
    if reclaimed < t.min_reclaimable_tokens:
        return False, f"reclaimed {reclaimed} < minReclaimableTokens {t.min_reclaimable_tokens}"
    if ratio < t.min_savings_ratio:
        return False, f"reclaimed ratio {ratio:.2f} < minSavingsRatio {t.min_savings_ratio}"
    return True, ""


def pending_intents(path: Sequence[Entry]) -> list[CheckpointEntry]:
    """Intent checkpoints not yet consumed: after the latest capsule (an operation that
    appended one consumed every intent before it), minus those a `compaction` entry names."""
    capsule_at = latest_capsule_index(path)
    after = path[capsule_at + 1 :] if capsule_at is not None else path
    consumed = {cid for entry in after if isinstance(entry, CompactionEntry) for cid in entry.consumed}
    return [
        e
        for e in after
        if isinstance(e, CheckpointEntry) and e.intent and e.kind in INTENT_KINDS and e.checkpoint_id not in consumed
    ]


class LoopGuard(Struct):
    """Pauses soft triggers after repeated fruitless attempts (the thrash guard).

    Derived from the path (`BudgetTracker.guard`), so it survives a kernel restart: soft
    operations that ended skipped or failed are `compaction` entries since the latest capsule.
    """

    failures: int = 0
    """Consecutive soft operations that ended skipped or failed since the latest capsule."""
    tokens_at_last_attempt: int = 0
    just_completed: bool = False
    """A capsule is the latest thing on the path (nothing the model sees came after it)."""

    def paused(self, effective: int, min_reclaimable_tokens: int) -> bool:
        if self.failures < LOOP_GUARD_FAILURES:
            return False
        return effective - self.tokens_at_last_attempt < min_reclaimable_tokens


class TurnState(Struct):
    """Per agent turn: at most one soft compaction attempt."""

    soft_attempted: bool = False
    notes: list[str] = field(default_factory=list)


class Decision(Struct, frozen=True):
    """What the preflight should do."""

    trigger: Trigger | None
    consumed: tuple[CheckpointEntry, ...] = ()
    """Intents this decision consumes (recorded whatever the outcome)."""
    skip_reason: str | None = None
    """For consumed intents that fail their gates: why nothing runs."""
    waiting: str | None = None
    """Pending intents kept for a later preflight, and why they wait (a soft attempt was
    already made this turn, or a compaction just completed)."""


def decide(
    *,
    effective: int,
    t: Thresholds,
    intents: Sequence[CheckpointEntry],
    turn: TurnState,
    guard: LoopGuard,
) -> Decision:
    """Choose at most one trigger: hard_limit > milestone/plan_pivot > turn_complete > auto_threshold."""
    consumed = tuple(intents)
    if effective > t.hard_limit:
        return Decision(Trigger.HARD_LIMIT, consumed)
    kinds = {intent.kind for intent in intents}
    wanted: Trigger | None = None
    if kinds & {"milestone", "plan_pivot"} and t.auto and t.compact_on_milestone:
        wanted = Trigger.PLAN_PIVOT if "plan_pivot" in kinds else Trigger.MILESTONE
    elif "turn" in kinds and t.auto and t.compact_on_turn_complete:
        wanted = Trigger.TURN_COMPLETE
    elif t.auto and effective >= t.soft_limit:
        wanted = Trigger.AUTO_THRESHOLD
    if wanted is None:
        reason = "auto-compaction is off for this intent" if consumed else None
        return Decision(None, consumed, reason)
    waiting = _not_now(turn, guard)
    if waiting is not None:
        # An intent is honoured at the next allowed attempt (the next turn at the latest),
        # not thrown away because this moment is not one.
        return Decision(None, (), None, waiting if consumed else None)
    reason = _soft_gate(effective, t, guard)
    if reason is not None:
        return Decision(None, consumed, reason if consumed else None)
    return Decision(wanted, consumed)


def _not_now(turn: TurnState, guard: LoopGuard) -> str | None:
    """Why no soft attempt may run at this preflight, for reasons that pass by the next turn."""
    if guard.just_completed:
        return "a compaction just completed"
    if turn.soft_attempted:
        return "one soft compaction attempt per turn already made"
    return None


def _soft_gate(effective: int, t: Thresholds, guard: LoopGuard) -> str | None:
    """Why a soft trigger's gates fail now (the attempt is evaluated, and its intents consumed)."""
    if guard.paused(effective, t.min_reclaimable_tokens):
        return (
            f"paused after {guard.failures} fruitless attempts until effective grows by "
            f"{t.min_reclaimable_tokens} tokens"
        )
    if effective < t.min_tokens_for_auto_compact:
        return f"effective {effective} < minTokensForAutoCompact {t.min_tokens_for_auto_compact}"
    roi = pre_generation_roi(effective, t)
    if not roi.passes:
        return roi.reason
    return None
