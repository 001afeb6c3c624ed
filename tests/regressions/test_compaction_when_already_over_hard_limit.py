"""Over the hard limit before the first compaction: mandatory, and no oversized request."""

from compaction_support import (
    FakeSummarizer,
    add_exchange,
    make_compactor,
    open_transcript,
    thresholds,
)

from soba_nb.compaction.outcomes import Outcome
from soba_nb.compaction.triggers import TurnState


def test_far_over_the_hard_limit_comes_back_under_it(tmp_path):
    t = open_transcript(tmp_path)
    for i in range(40):
        add_exchange(t, 300, index=i)
    engine = make_compactor(t, thresholds(auto=False, keep=3500), summarizer=FakeSummarizer())
    assert engine.measure().effective > 3 * engine.thresholds.hard_limit
    result = engine.preflight(TurnState())
    assert result is not None and result.trigger == "hard_limit"
    assert result.outcome is Outcome.COMPLETED
    # keepRecentTokens (3500) would not fit next to the capsule: the hard limit keeps less.
    assert engine.request_for_sending().tokens <= engine.thresholds.hard_limit
