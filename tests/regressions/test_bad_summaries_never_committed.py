"""Empty, cut-short, heading-less, error-looking or tool-calling summaries are never committed."""

import json

import pytest
from compaction_support import (
    FakeSummarizer,
    add_exchange,
    make_compactor,
    open_transcript,
    thresholds,
)

from soba_nb.compaction.outcomes import Outcome, Reason
from soba_nb.transcript.entries import CapsuleEntry

GOOD = FakeSummarizer().text


@pytest.mark.parametrize(
    "fake",
    [
        FakeSummarizer(text=""),
        FakeSummarizer(text=GOOD, finish_reason="length"),
        FakeSummarizer(text="Here is a summary: the user cleaned data."),
        FakeSummarizer(text="Error: rate limit exceeded, please try again later."),
        FakeSummarizer(text="I'm sorry, but I cannot summarize this conversation for Ana Lima."),
        FakeSummarizer(text=GOOD, has_tool_calls=True),
        FakeSummarizer(error=RuntimeError("connection reset")),
    ],
    ids=["empty", "cut-short", "no-headings", "error-text", "apology", "tool-call", "provider-error"],
)
def test_bad_summary_falls_back_to_the_deterministic_capsule(tmp_path, fake):
    t = open_transcript(tmp_path)
    for i in range(10):
        add_exchange(t, 300, index=i)
    flight = tmp_path / "flight.jsonl"
    engine = make_compactor(t, thresholds(min_reclaimable=10, min_ratio=0.01), summarizer=fake, flight=flight)
    result = engine.compact()
    # The flight record's reason is a fixed code (metrics only): it once held the sentence,
    # "the summary looks like an error message: I'm sorry, …", quoting the summary.
    [record] = [json.loads(line) for line in flight.read_text().splitlines()]
    assert record["reason"] in {code.value for code in Reason} and record["reason"].startswith("fallback_")
    assert "sorry" not in flight.read_text() and "rate limit" not in flight.read_text()
    assert "connection reset" not in flight.read_text()
    assert result.outcome is Outcome.COMPLETED
    capsule = t.path()[-1]
    assert isinstance(capsule, CapsuleEntry) and capsule.quality == "degraded"
    assert "rate limit" not in capsule.content and "Here is a summary" not in capsule.content
    assert capsule.content.startswith("## Goal and constraints")
