"""Trigger rules, priority, pre/post ROI gates and the loop guard (SPEC §6), as pure logic."""

from __future__ import annotations

import pytest
from compaction_support import thresholds

from soba_nb.compaction.triggers import (
    LOOP_GUARD_FAILURES,
    LoopGuard,
    Trigger,
    TurnState,
    decide,
    pending_intents,
    post_generation_roi,
    pre_generation_roi,
)
from soba_nb.transcript.entries import CheckpointEntry, CompactionEntry, MessageEntry


def intent(kind: str) -> CheckpointEntry:
    return CheckpointEntry(kind=kind, note=kind, intent=True)


def run(effective: int, t=None, intents=(), turn=None, guard=None):
    return decide(
        effective=effective,
        t=t or thresholds(),
        intents=list(intents),
        turn=turn or TurnState(),
        guard=guard or LoopGuard(),
    )


class TestHardLimit:
    def test_fires_only_above_the_hard_limit(self):
        t = thresholds(hard=4000)
        assert run(4001, t).trigger is Trigger.HARD_LIMIT
        assert run(4000, t).trigger is not Trigger.HARD_LIMIT

    def test_auto_off_cannot_turn_it_off(self):
        assert run(5000, thresholds(auto=False)).trigger is Trigger.HARD_LIMIT

    def test_ignores_the_per_turn_soft_attempt_and_the_loop_guard(self):
        guard = LoopGuard(failures=10, tokens_at_last_attempt=5000)
        assert run(5000, turn=TurnState(soft_attempted=True), guard=guard).trigger is Trigger.HARD_LIMIT


class TestAutoThreshold:
    def test_fires_at_the_soft_limit_not_below(self):
        t = thresholds(hard=4000, min_tokens=1000, keep=800, min_reclaimable=500)
        assert t.soft_limit == 3200
        assert run(3200, t).trigger is Trigger.AUTO_THRESHOLD
        assert run(3199, t).trigger is None

    def test_needs_auto(self):
        assert run(3500, thresholds(auto=False)).trigger is None

    def test_one_soft_attempt_per_turn(self):
        assert run(3500, turn=TurnState(soft_attempted=True)).trigger is None

    def test_pre_roi_gate_blocks(self):
        # keep 3000 of 3500: reclaimable 500 < minReclaimable 600
        t = thresholds(hard=4000, keep=3000, min_reclaimable=600, min_ratio=0.1)
        decision = run(3500, t)
        assert decision.trigger is None


class TestPreGenerationRoi:
    """reclaimable = effective - keepRecentTokens; ratio = reclaimable / effective."""

    @pytest.mark.parametrize(
        ("effective", "passes"),
        [(1499, False), (1500, True), (1501, True)],
    )
    def test_reclaimable_floor(self, effective, passes):
        t = thresholds(keep=1000, min_reclaimable=500, min_ratio=0.01)
        assert pre_generation_roi(effective, t).passes is passes

    @pytest.mark.parametrize(("effective", "passes"), [(1999, False), (2000, True), (2001, True)])
    def test_ratio_floor(self, effective, passes):
        # reclaimable/effective ≥ 0.5 ⇔ effective ≥ 2000 with keep 1000
        t = thresholds(keep=1000, min_reclaimable=1, min_ratio=0.5)
        assert pre_generation_roi(effective, t).passes is passes


class TestPostGenerationRoi:
    @pytest.mark.parametrize(("after", "passes"), [(1501, False), (1500, True), (1499, True)])
    def test_reclaimed_floor(self, after, passes):
        t = thresholds(min_reclaimable=500, min_ratio=0.01)
        assert post_generation_roi(2000, after, t)[0] is passes

    @pytest.mark.parametrize(("after", "passes"), [(751, False), (750, True), (749, True)])
    def test_ratio_floor(self, after, passes):
        t = thresholds(min_reclaimable=1, min_ratio=0.25)
        assert post_generation_roi(1000, after, t)[0] is passes


class TestIntents:
    def test_priority_hard_over_milestone_over_turn_over_auto(self):
        assert run(5000, intents=[intent("milestone"), intent("turn")]).trigger is Trigger.HARD_LIMIT
        assert run(3500, intents=[intent("turn"), intent("milestone")]).trigger is Trigger.MILESTONE
        assert run(3500, intents=[intent("turn"), intent("plan_pivot")]).trigger is Trigger.PLAN_PIVOT
        assert run(3500, intents=[intent("turn")]).trigger is Trigger.TURN_COMPLETE
        assert run(3500).trigger is Trigger.AUTO_THRESHOLD

    def test_intents_are_consumed_whatever_the_outcome(self):
        decision = run(100, intents=[intent("turn")])
        assert decision.trigger is None
        assert len(decision.consumed) == 1
        assert "minTokensForAutoCompact" in (decision.skip_reason or "")

    def test_turn_complete_needs_its_flag(self):
        t = thresholds(turn_complete=False)
        assert run(1500, t, intents=[intent("turn")]).trigger is None

    def test_milestone_needs_its_flag_and_auto(self):
        assert run(1500, thresholds(milestone=False), intents=[intent("milestone")]).trigger is None
        assert run(1500, thresholds(auto=False), intents=[intent("milestone")]).trigger is None

    def test_intents_below_the_soft_limit_still_fire(self):
        # soft triggers need minTokensForAutoCompact and the ROI gates, not the soft limit
        assert run(1500, intents=[intent("milestone")]).trigger is Trigger.MILESTONE

    def test_pending_intents_are_those_after_the_latest_capsule_not_consumed_by_a_record(self):
        first = intent("turn")
        record = CompactionEntry(
            operation_id="op", trigger="turn_complete", outcome="skipped", reason="x", consumed=[first.checkpoint_id]
        )
        second = intent("milestone")
        unrelated = CompactionEntry(operation_id="op2", trigger="auto_threshold", outcome="skipped", reason="y")
        path = [MessageEntry(role="user", content="x"), first, record, second, unrelated]
        assert [i.id for i in pending_intents(path)] == [second.id]
        not_intent = CheckpointEntry(kind="user", note="named point")
        assert pending_intents([not_intent]) == []


    def test_a_milestone_waits_out_the_per_turn_limit_instead_of_being_consumed(self):
        decision = run(3500, intents=[intent("milestone")], turn=TurnState(soft_attempted=True))
        assert decision.trigger is None and decision.consumed == ()
        assert "one soft compaction attempt per turn" in (decision.waiting or "")
        assert run(3500, intents=[intent("milestone")]).trigger is Trigger.MILESTONE

    def test_a_milestone_right_after_a_completed_compaction_waits(self):
        decision = run(3500, intents=[intent("milestone")], guard=LoopGuard(just_completed=True))
        assert decision.trigger is None and decision.consumed == ()


class TestLoopGuard:
    def test_pauses_after_repeated_fruitless_soft_attempts(self):
        guard = LoopGuard(failures=LOOP_GUARD_FAILURES, tokens_at_last_attempt=3500)
        assert run(3500, guard=guard).trigger is None
        assert run(3999, guard=guard).trigger is None
        # grew by minReclaimableTokens since the last attempt: soft triggers resume
        t = thresholds(hard=6000, ratio=0.5, min_reclaimable=500)
        assert run(4000, t, guard=guard).trigger is Trigger.AUTO_THRESHOLD

    def test_a_paused_guard_consumes_an_intent_with_its_reason(self):
        guard = LoopGuard(failures=LOOP_GUARD_FAILURES, tokens_at_last_attempt=3500)
        decision = run(3500, intents=[intent("milestone")], guard=guard)
        assert decision.trigger is None and len(decision.consumed) == 1
        assert "paused after" in (decision.skip_reason or "")

    def test_a_just_completed_compaction_blocks_immediate_retrigger(self):
        assert run(3500, guard=LoopGuard(just_completed=True)).trigger is None
        assert run(3500, guard=LoopGuard()).trigger is Trigger.AUTO_THRESHOLD
