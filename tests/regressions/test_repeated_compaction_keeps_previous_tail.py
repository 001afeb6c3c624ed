"""A second compaction summarizes from the previous capsule's firstKeptEntryId."""

from compaction_support import (
    FakeSummarizer,
    add_exchange,
    make_compactor,
    open_transcript,
    thresholds,
)

from soba_nb.compaction.outcomes import Outcome
from soba_nb.transcript.entries import CapsuleEntry


def test_what_the_previous_capsule_kept_is_summarized_next_time(tmp_path):
    t = open_transcript(tmp_path)
    for i in range(10):
        add_exchange(t, 300, index=i)
    fake = FakeSummarizer()
    engine = make_compactor(t, thresholds(min_reclaimable=10, min_ratio=0.01), summarizer=fake)
    first = engine.compact()
    assert first.outcome is Outcome.COMPLETED
    kept_start = first.entry.first_kept_entry_id
    kept_text = t.get(kept_start).content
    for i in range(10, 16):
        add_exchange(t, 300, index=i)
    second = engine.compact()
    assert second.outcome is Outcome.COMPLETED
    assert second.entry.rolls_up == first.entry.id
    prompt = fake.calls[-1]["user"]
    assert kept_text[:60] in prompt  # the previously kept tail reaches the summarizer
    assert "Keep cleaning the dataframe." in prompt  # the previous capsule is rolled in
    assert [e for e in t.path() if isinstance(e, CapsuleEntry)][-1].id == second.entry.id
