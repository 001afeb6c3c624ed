"""Cancel during the summary: no capsule, even when the model answers afterwards."""

import threading

from compaction_support import FakeSummarizer, add_exchange, make_compactor, open_transcript

from soba_nb.compaction.outcomes import Outcome
from soba_nb.compaction.triggers import TurnState
from soba_nb.transcript.entries import CapsuleEntry


def test_late_summary_after_cancel_is_dropped(tmp_path):
    t = open_transcript(tmp_path)
    for i in range(12):
        add_exchange(t, 300, index=i)
    before = t.file.read_bytes()
    cancel = threading.Event()
    late = FakeSummarizer(delay_s=0.6, ignore_cancel=True)
    engine = make_compactor(t, summarizer=late, timeout_ms=5000)
    threading.Timer(0.2, cancel.set).start()
    result = engine.preflight(TurnState(), cancel)
    assert result is not None and result.outcome is Outcome.CANCELLED
    assert late.answered_after_cancel.wait(2)  # the model did answer, later
    assert not any(isinstance(e, CapsuleEntry) for e in t.path())
    assert t.file.read_bytes() == before
