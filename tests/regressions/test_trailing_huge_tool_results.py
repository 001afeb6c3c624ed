"""A session ending in huge tool results: the group stays whole and the input fits."""

from compaction_support import (
    FakeSummarizer,
    add_exchange,
    add_tool_group,
    make_compactor,
    open_transcript,
)

from soba_nb.compaction.model_input import pairing_problems
from soba_nb.compaction.outcomes import Outcome
from soba_nb.compaction.triggers import TurnState


def test_huge_trailing_results_are_kept_with_their_calls_and_clipped_to_fit(tmp_path):
    t = open_transcript(tmp_path)
    for i in range(4):
        add_exchange(t, 300, index=i)
    add_tool_group(t, 2600, calls=2)
    engine = make_compactor(t, summarizer=FakeSummarizer())
    assert engine.measure().effective > engine.thresholds.hard_limit
    result = engine.preflight(TurnState())
    assert result is not None and result.outcome is Outcome.COMPLETED
    built = engine.request_for_sending()
    assert built.tokens <= engine.thresholds.hard_limit
    assert pairing_problems(built.messages) == []
    assert sum(1 for m in built.messages if m.role == "tool") == 2
