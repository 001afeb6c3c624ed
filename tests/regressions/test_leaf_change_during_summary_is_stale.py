"""The leaf moved while the summary ran: the result is stale and nothing is appended."""

from compaction_support import FakeSummarizer, add_exchange, make_compactor, open_transcript

from soba_nb.compaction.outcomes import Outcome
from soba_nb.compaction.triggers import TurnState
from soba_nb.transcript.entries import CapsuleEntry, MessageEntry


def test_stale_when_the_leaf_changes(tmp_path):
    t = open_transcript(tmp_path)
    for i in range(12):
        add_exchange(t, 300, index=i)
    fake = FakeSummarizer(delay_s=0.1)
    fake.on_call = lambda: t.append(MessageEntry(role="user", content="typed meanwhile"))
    engine = make_compactor(t, summarizer=fake)
    result = engine.preflight(TurnState())
    assert result is not None and result.outcome is Outcome.STALE
    assert not any(isinstance(e, CapsuleEntry) for e in t.path())
    assert t.path()[-1].content == "typed meanwhile"
