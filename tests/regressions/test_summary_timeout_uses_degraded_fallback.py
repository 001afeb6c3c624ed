"""A summary slower than timeoutMs is aborted; the deterministic capsule is used at once."""

import time

from compaction_support import FakeSummarizer, add_exchange, make_compactor, open_transcript

from soba_nb.compaction.outcomes import Outcome
from soba_nb.compaction.triggers import TurnState
from soba_nb.transcript.entries import CapsuleEntry, MessageEntry

SLACK_S = 0.5


def test_timeout_gives_a_degraded_capsule_within_the_deadline(tmp_path):
    t = open_transcript(tmp_path)
    for i in range(12):
        add_exchange(t, 300, index=i)
    t.append(MessageEntry(role="user", content="Now plot the outliers of column price."))
    slow = FakeSummarizer(delay_s=10)
    engine = make_compactor(t, summarizer=slow, timeout_ms=300)
    started = time.monotonic()
    result = engine.preflight(TurnState())
    elapsed = time.monotonic() - started
    assert result is not None and result.outcome is Outcome.COMPLETED
    assert elapsed < 0.3 + SLACK_S
    capsule = t.path()[-1]
    assert isinstance(capsule, CapsuleEntry) and capsule.quality == "degraded"
    assert result.line().endswith("fallback")
    assert "timeoutMs" in result.reason
    # The deterministic capsule keeps the latest request verbatim (or it is in the kept tail).
    kept_ids = {e.id for e in t.path()}
    assert "Now plot the outliers of column price." in capsule.content or capsule.first_kept_entry_id in kept_ids
