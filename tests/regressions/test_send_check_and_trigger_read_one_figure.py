"""The trigger and the send check read one figure, and a refusal is always preceded by a
`hard_limit` compaction.

Found through the magics with a server that counts lower than our estimate (o200k × 1.15
for a Qwen model): the trigger decided on the provider's figure (under the hard limit, so
no compaction) while the send check refused on our larger estimate, so every turn ended
"request not sent: 5,088 > 5,000", no compaction was ever attempted (auto on or off),
`flight.jsonl` stayed empty, and only a manual `%compact` freed the session.
"""

from __future__ import annotations

import json

import pytest
from conftest import write_soba_json
from disagreeing import DisagreeingModel
from IPython.utils.capture import capture_output
from llm_server import text

from soba_nb.transcript.entries import CapsuleEntry, UsageEntry
from soba_nb.transcript.store import Transcript

ANSWER = "The frame has twelve columns; the price column is skewed right. " * 30
"""About 400 tokens by our estimate."""
LIMITS = {
    "model": {"name": "qwen2.5-coder:7b", "contextWindow": 6000, "maxOutputTokens": 500},
    "compaction": {
        "minTokensForAutoCompact": 1500,
        "minReclaimableTokens": 500,
        "keepRecentTokens": 1000,
        "safetyReserveTokens": 500,
        "timeoutMs": 5000,
    },
}
"""hardLimit 5,000; the model name has no exact tokenizer here, so we estimate o200k × 1.15."""
TURNS = 16


@pytest.fixture
def lower_counting(nb_dir, llm_server):
    write_soba_json(nb_dir, llm_server.url, LIMITS)
    return DisagreeingModel(llm_server, factor=1.0, window=6000)


@pytest.mark.parametrize("auto", ["on", "off"])
def test_a_server_counting_lower_never_strands_the_session(ip, nb_dir, lower_counting, auto):
    model = lower_counting
    ip.run_line_magic("auto_compact", auto)
    outputs = []
    for index in range(TURNS):
        model.script(text(f"Answer {index}. {ANSWER}"))
        with capture_output() as out:
            ip.run_line_magic("soba", f"question {index}: describe the data again")
        outputs.append(out.stdout)
    assert not any("request not sent" in output for output in outputs), outputs
    assert model.accepted_over_window() == []

    agent = ip.magics_manager.registry["SobaMagics"].agent
    path = Transcript.load(agent.file).path()
    capsules = [e for e in path if isinstance(e, CapsuleEntry)]
    assert capsules, "the session grew past the hard limit: a compaction must have run"
    if auto == "off":
        assert {c.trigger for c in capsules} == {"hard_limit"}
    flights = (agent.file.parent / "flight.jsonl").read_text().splitlines()
    assert len(flights) >= len(capsules)
    # The provider's figure (lower than our estimate) was the one used: requests whose
    # estimate was above the hard limit were sent, because the server's count fit.
    usages = [e for e in path if isinstance(e, UsageEntry)]
    assert max(u.input_tokens for u in usages) <= 5000 + 1000  # within the server's window
    if auto == "off":
        # Nothing soft keeps the input low: the input grows until the one figure says it is
        # over. Sending on our estimate (the bug) would have compacted before any request
        # our own count put above the hard limit; on the provider's figure such requests go.
        over_by_our_count = [u.sent_tokens for u in usages if u.sent_tokens and u.sent_tokens > 5000]
        assert over_by_our_count, [(u.input_tokens, u.sent_tokens) for u in usages]
    assert any(json.loads(line)["measurementSource"] == "provider_usage" for line in flights)


def test_a_refusal_after_the_forced_compaction_says_what_to_do(ip, nb_dir, lower_counting):
    request = "Explain this log: " + "timeout while reading block 7; " * 700
    with capture_output() as out:
        ip.run_line_magic("soba", request)
    assert "request not sent" in out.stdout
    assert "%compact" in out.stdout and "%rewind" in out.stdout and "contextWindow" in out.stdout
    agent = ip.magics_manager.registry["SobaMagics"].agent
    flights = [json.loads(line) for line in (agent.file.parent / "flight.jsonl").read_text().splitlines()]
    assert [f["trigger"] for f in flights] == ["hard_limit"]
    assert lower_counting.judged == []  # nothing was sent
