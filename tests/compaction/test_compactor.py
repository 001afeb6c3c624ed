"""The compaction engine end to end over a real transcript, with a fake summarizer model."""

from __future__ import annotations

import json
import time

import pytest
from compaction_support import (
    FakeSummarizer,
    add_exchange,
    make_compactor,
    open_transcript,
    thresholds,
    words,
)

from soba_nb.compaction.compactor import HardLimitExceeded
from soba_nb.compaction.outcomes import CompactionEvent, Outcome
from soba_nb.compaction.triggers import Trigger, TurnState, pending_intents
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CompactionEntry,
    MessageEntry,
    ToolCallEntry,
    ToolResultEntry,
    UsageEntry,
)
from soba_nb.transcript.store import Transcript


def grow(t, total_tokens, size=300):
    for i in range(total_tokens // size):
        add_exchange(t, size, index=i)


def capsules(t):
    return [e for e in t.path() if isinstance(e, CapsuleEntry)]


def test_auto_threshold_compacts_and_records_everything(tmp_path):
    t = open_transcript(tmp_path)
    grow(t, 3400)
    flight = tmp_path / "flight.jsonl"
    engine = make_compactor(t, summarizer=FakeSummarizer(), flight=flight)
    before = engine.measure().effective
    assert before >= engine.thresholds.soft_limit
    result = engine.preflight(TurnState())
    assert result is not None and result.outcome is Outcome.COMPLETED
    assert result.trigger == "auto_threshold"
    [capsule] = capsules(t)
    assert capsule.quality == "full" and capsule.checkpoint_id.startswith("ck_")
    assert capsule.tokens_before == before
    assert capsule.tokens_after == engine.measure().effective < before
    assert capsule.first_kept_entry_id in t
    assert capsule.model == "fake-summarizer"
    line = result.line()
    assert "auto_threshold" in line and f"{before:,} → {capsule.tokens_after:,}" in line
    assert capsule.checkpoint_id in line and "fallback" not in line
    [record] = [json.loads(x) for x in flight.read_text().splitlines()]
    assert record["outcome"] == "completed" and record["checkpointId"] == capsule.checkpoint_id
    assert record["tokensBefore"] == before and record["reclaimed"] == before - capsule.tokens_after
    assert record["measurementSource"] == "estimated"
    assert "dataframe" not in flight.read_text()  # never summary text


def test_below_the_soft_limit_nothing_happens(tmp_path):
    t = open_transcript(tmp_path)
    grow(t, 900)
    engine = make_compactor(t, summarizer=FakeSummarizer())
    assert engine.preflight(TurnState()) is None
    assert capsules(t) == []


def test_user_compact_with_nothing_to_compact_is_skipped_with_a_reason(tmp_path):
    t = open_transcript(tmp_path)
    add_exchange(t, 100)
    engine = make_compactor(t, summarizer=FakeSummarizer())
    result = engine.compact()
    assert result.outcome is Outcome.SKIPPED
    assert "nothing to compact" in result.reason
    assert capsules(t) == []


def test_user_compact_skips_the_soft_roi_gate_and_passes_focus(tmp_path):
    t = open_transcript(tmp_path)
    grow(t, 1500)
    fake = FakeSummarizer()
    engine = make_compactor(t, thresholds(min_reclaimable=100_000), summarizer=fake)
    result = engine.compact(focus="keep the column names")
    assert result.outcome is Outcome.COMPLETED
    assert "keep the column names" in fake.calls[0]["system"]


def test_turn_complete_intent_runs_at_the_next_preflight_once(tmp_path):
    t = open_transcript(tmp_path)
    grow(t, 1800)
    engine = make_compactor(t, summarizer=FakeSummarizer())
    engine.record_turn_complete()
    assert len(pending_intents(t.path())) == 1
    t.append(MessageEntry(role="user", content="next"))
    result = engine.preflight(TurnState())
    assert result is not None and result.trigger == "turn_complete"
    assert pending_intents(t.path()) == []
    assert engine.preflight(TurnState()) is None


def test_intents_survive_a_restart_and_are_consumed_once_even_when_gates_fail(tmp_path):
    t = open_transcript(tmp_path)
    add_exchange(t, 100)
    make_compactor(t).record_checkpoint("milestone", "loaded the data")
    t.close()
    reopened = Transcript.open(t.file)
    assert len(pending_intents(reopened.path())) == 1
    engine = make_compactor(reopened, summarizer=FakeSummarizer())
    assert engine.preflight(TurnState()) is None  # below minTokensForAutoCompact
    record = reopened.path()[-1]
    assert isinstance(record, CompactionEntry) and record.outcome == "skipped"
    assert pending_intents(reopened.path()) == []


def test_milestone_wins_over_turn_complete(tmp_path):
    t = open_transcript(tmp_path)
    grow(t, 1800)
    engine = make_compactor(t, summarizer=FakeSummarizer())
    engine.record_turn_complete()
    engine.record_checkpoint("milestone", "cleaned")
    result = engine.preflight(TurnState())
    assert result is not None and result.trigger == "milestone"


def test_post_generation_gate_skips_a_capsule_that_does_not_pay_off(tmp_path):
    t = open_transcript(tmp_path)
    grow(t, 3400)
    bloated = FakeSummarizer(text=FakeSummarizer().text.replace("- loaded data.csv", words(2600)))
    engine = make_compactor(t, summarizer=bloated)
    result = engine.preflight(TurnState())
    assert result is not None and result.outcome is Outcome.SKIPPED
    assert "reclaimed" in result.reason
    assert capsules(t) == []


def test_hard_limit_compacts_even_with_auto_off(tmp_path):
    t = open_transcript(tmp_path)
    grow(t, 4500)
    engine = make_compactor(t, thresholds(auto=False), summarizer=FakeSummarizer())
    assert engine.measure().effective > engine.thresholds.hard_limit
    result = engine.preflight(TurnState(soft_attempted=True))
    assert result is not None and result.trigger == Trigger.HARD_LIMIT.value
    assert result.outcome is Outcome.COMPLETED
    assert engine.request_for_sending().tokens <= engine.thresholds.hard_limit


def test_hard_limit_is_fail_closed_when_the_request_itself_is_too_big(tmp_path):
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content=words(5000)))
    engine = make_compactor(t, summarizer=FakeSummarizer())
    result = engine.preflight(TurnState())
    assert result is not None and result.outcome is Outcome.FAILED
    with pytest.raises(HardLimitExceeded) as info:
        engine.request_for_sending()
    assert info.value.tokens > info.value.hard_limit == 4000
    assert "not sent" in str(info.value)


def test_provider_usage_is_the_preferred_measurement(tmp_path):
    t = open_transcript(tmp_path)
    add_exchange(t, 100)
    engine = make_compactor(t)
    assert engine.measure().source == "estimated"
    t.append(UsageEntry(input_tokens=1234, output_tokens=50))
    m = engine.measure()
    assert m.source == "provider_usage" and m.reported_input_tokens == 1234
    answer = [e for e in t.path() if isinstance(e, MessageEntry)][-1]
    answer_tokens = m.estimated - m.effective + 1234
    t.append(MessageEntry(role="user", content=words(50)))
    grown = engine.measure()
    assert grown.effective - m.effective == grown.estimated - m.estimated > 0
    assert answer_tokens > 0 and answer.role == "assistant"


def test_measurement_is_incremental(tmp_path):
    t = open_transcript(tmp_path)
    grow(t, 3000)
    engine = make_compactor(t)
    engine.measure()
    rebuilds = engine.tracker.rebuilds
    for i in range(20):
        add_exchange(t, 20, index=i)
        engine.measure()
    assert engine.tracker.rebuilds == rebuilds
    fresh = make_compactor(t)
    assert fresh.measure().effective == engine.measure().effective


def test_progress_events_at_least_every_half_second(tmp_path):
    t = open_transcript(tmp_path)
    grow(t, 3400)
    events: list[tuple[float, CompactionEvent]] = []
    engine = make_compactor(t, summarizer=FakeSummarizer(delay_s=1.6), timeout_ms=5000)
    engine.listeners.append(lambda e: events.append((time.monotonic(), e)))
    result = engine.preflight(TurnState())
    assert result is not None and result.outcome is Outcome.COMPLETED
    kinds = [e.kind for _, e in events]
    assert kinds[0] == "compaction_start" and kinds[-1] == "compaction_end"
    progress = [(at, e.percent) for at, e in events if e.kind == "compaction_progress"]
    gaps = [b[0] - a[0] for a, b in zip(progress, progress[1:], strict=False)]
    assert max(gaps) <= 0.5
    percents = [p for _, p in progress]
    assert percents == sorted(percents) and percents[0] >= 0 and percents[-1] <= 100
    assert events[-1][1].result is result


def test_the_current_request_reaches_the_model_verbatim_even_if_the_summary_drops_it(tmp_path):
    t = open_transcript(tmp_path)
    grow(t, 1500)
    request = "Now plot `price` by region — exactly as before, but log scale."
    t.append(MessageEntry(role="user", content=request))
    t.append(MessageEntry(role="assistant", content=words(900)))
    engine = make_compactor(t, thresholds(min_reclaimable=10, min_ratio=0.01, keep=100), summarizer=FakeSummarizer())
    result = engine.compact()
    assert result.outcome is Outcome.COMPLETED and result.quality == "full"
    kept = [e for e in t.path() if e.id == result.entry.first_kept_entry_id]
    assert not (kept and kept[0].content == request)
    assert request in result.entry.content
    sent = "\n".join(m.content for m in engine.request_for_sending().messages)
    assert request in sent


def test_the_provider_calibration_carries_across_a_compaction(tmp_path):
    """SPEC §2: provider usage plus what was appended since, minus what a compaction removed."""
    t = open_transcript(tmp_path)
    grow(t, 3000)
    engine = make_compactor(t, summarizer=FakeSummarizer())
    estimated = engine.measure().estimated
    answer = [e for e in t.path() if isinstance(e, MessageEntry)][-1]
    assert answer.role == "assistant"
    # The provider counts 10% more than we do for the request before the last answer.
    from soba_nb.compaction.model_input import entry_tokens

    before_answer = estimated - entry_tokens(answer, engine.counter)
    t.append(UsageEntry(input_tokens=int(before_answer * 1.1)))
    measured = engine.measure()
    assert measured.source == "provider_usage"
    delta = measured.effective - measured.estimated
    assert delta > 0
    result = engine.compact()
    assert result.outcome is Outcome.COMPLETED
    after = engine.measure()
    assert after.source == "provider_usage"
    assert after.effective - after.estimated == delta
    assert result.tokens_after == result.entry.tokens_after == after.effective
    assert result.tokens_before - result.tokens_after == measured.estimated - after.estimated


class _OwnTimeoutSummarizer(FakeSummarizer):
    """Honours the `timeout_s` it is given, as a provider does: raises its own timeout error
    a moment before the barrier's deadline would fire."""

    def summarize(self, system, user, *, max_output_tokens, operation_id, cancel, on_progress, timeout_s):
        time.sleep(max(timeout_s - 0.02, 0))
        raise TimeoutError(f"no answer within {timeout_s:.1f} s")


def test_a_summarizer_ending_on_its_own_deadline_is_a_timeout_not_a_failure(tmp_path):
    t = open_transcript(tmp_path)
    grow(t, 3400)
    engine = make_compactor(t, summarizer=_OwnTimeoutSummarizer(), timeout_ms=600)
    result = engine.preflight(TurnState())
    assert result is not None and result.outcome is Outcome.COMPLETED and result.quality == "degraded"
    assert result.code.value == "fallback_timeout", result.reason


def test_the_plan_from_the_trackers_capsule_index_is_the_plan_from_a_scan(tmp_path):
    """The compactor hands the planner the tracker's capsule index and region facts (total,
    first unanswered call) instead of scans of the path: after compactions, tool groups, an
    unanswered call, more work and a rewind, it plans exactly what the scans would."""
    from soba_nb.compaction.planner import NothingToCompact, plan_cut

    t = open_transcript(tmp_path)
    engine = make_compactor(t, thresholds(min_reclaimable=10, min_ratio=0.01, keep=600))

    def plan(**hint: object) -> object:
        try:
            return plan_cut(t.path_view(), engine.counter, keep_recent_tokens=engine.thresholds.keep_recent_tokens, **hint)  # type: ignore[arg-type]
        except NothingToCompact as exc:
            return str(exc)

    def agree() -> None:
        engine.measure()
        scanned = plan()
        assert plan(capsule_at=engine.tracker.capsule_index) == scanned
        assert plan(capsule_at=engine.tracker.capsule_index, facts=engine.tracker.region_facts) == scanned
        assert list(engine.tracker.pending_intents) == pending_intents(t.path_view())

    engine.record_checkpoint("milestone", "loaded")
    grow(t, 3000)
    agree()  # no capsule
    assert len(engine.tracker.pending_intents) == 1
    for i in range(8):
        add_exchange(t, 150, tool_tokens=120, index=100 + i)
    agree()  # tool groups
    t.append(MessageEntry(role="assistant", content="calling"))
    t.append(ToolCallEntry(call_id="open_1", name="python", arguments="{}"))
    t.append(ToolCallEntry(call_id="open_2", name="python", arguments="{}"))
    t.append(ToolResultEntry(call_id="open_2", name="python", content="done"))
    grow(t, 900)
    agree()  # a call still waiting for its result: no cut after it
    assert engine.tracker.region_facts.first_open_call == "open_1"
    t.append(ToolResultEntry(call_id="open_1", name="python", content="done"))
    grow(t, 600)
    agree()  # answered
    assert engine.compact().outcome is Outcome.COMPLETED
    before_second = t.leaf
    grow(t, 3000)
    agree()  # after a capsule
    assert engine.compact().outcome is Outcome.COMPLETED
    agree()  # right after the second
    assert before_second is not None
    t.rewind(before_second)
    grow(t, 1500)
    agree()  # a rewound path: the first capsule is the latest again


def test_a_fallback_capsule_over_the_hard_limit_is_shortened_until_it_fits(tmp_path):
    """A long session's capsule carries long lists (every file and run, rolled up again and
    again); on a small window the fallback capsule alone can pass the hard limit. It is
    shortened, newest items kept, instead of the request being refused."""
    from soba_nb.compaction.capsule import Capsule, render_capsule

    t = open_transcript(tmp_path)
    runs = "\n".join(f"- shell `python clean.py --part {n} --sensor s{n % 7}` → exit 0" for n in range(350))
    previous = Capsule(goal_and_constraints="Clean the sensor logs.", verification=runs, work_done="- cleaned parts")
    t.append(MessageEntry(role="user", content="Clean the sensor logs."))
    t.append(CapsuleEntry(operation_id="op0", checkpoint_id="ck_00000001", trigger="user", quality="degraded",
                          tokens_before=9000, tokens_after=3500, first_kept_entry_id=None,
                          content=render_capsule(previous)))  # fmt: skip
    grow(t, 2400)
    engine = make_compactor(t, thresholds(hard=4000))  # no summarizer: the fallback capsule
    before = engine.measure().effective
    assert before > 4000
    result = engine.preflight(TurnState())
    assert result is not None and result.trigger == Trigger.HARD_LIMIT.value
    assert result.outcome is Outcome.COMPLETED, result.reason
    capsule = capsules(t)[-1]
    assert capsule.quality == "degraded" and capsule.tokens_after <= 4000
    assert "--part 349 " in capsule.content and "--part 0 " not in capsule.content
    assert "older ones are left out" in capsule.content
    assert engine.request_for_sending().tokens <= 4000
