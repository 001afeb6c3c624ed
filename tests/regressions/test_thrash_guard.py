"""A compaction that cannot reclaim enough is not retried in a loop."""

from compaction_support import FakeSummarizer, add_exchange, make_compactor, open_transcript, words

from soba_nb.compaction.outcomes import Outcome
from soba_nb.compaction.triggers import LOOP_GUARD_FAILURES, TurnState


def test_soft_triggers_pause_after_repeated_skips(tmp_path):
    t = open_transcript(tmp_path)
    for i in range(11):
        add_exchange(t, 300, index=i)
    bloated = FakeSummarizer(text=FakeSummarizer().text.replace("- loaded data.csv", words(2600)))
    engine = make_compactor(t, summarizer=bloated)
    outcomes = []
    for _ in range(LOOP_GUARD_FAILURES + 3):
        t.append(__import__("soba_nb.transcript.entries", fromlist=["MessageEntry"]).MessageEntry(role="user", content="more"))
        result = engine.preflight(TurnState())
        outcomes.append(None if result is None else result.outcome)
    assert outcomes[:LOOP_GUARD_FAILURES] == [Outcome.SKIPPED] * LOOP_GUARD_FAILURES
    assert outcomes[LOOP_GUARD_FAILURES:] == [None] * 3
    assert len(bloated.calls) == LOOP_GUARD_FAILURES
