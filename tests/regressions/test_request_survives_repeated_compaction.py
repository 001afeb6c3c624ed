"""The request being worked on reaches the model verbatim after any number of compactions.

Found through the magics: in one long tool loop that compacted twice, the requests after
the *second* capsule no longer carried the user's request. The first capsule quoted it;
the second, model-written capsule dropped it, and the re-insertion looked only inside the
region being summarized, where the request no longer was. Here the loopback model reads a
dozen files in one turn (several compactions, soft and hard, each summary written by the
"model" without the request), then a second turn does it again; every inference request
after the first compaction of a turn is checked for that turn's request, verbatim.
"""

from __future__ import annotations

import json

import pytest
from compaction_support import good_summary
from llm_server import text, tool_calls

from soba_nb.transcript.entries import CapsuleEntry
from soba_nb.transcript.store import Transcript

FILES = 12
LINE = "row {row}: the measured value drifted while the sensor warmed up again\n"
LINES_PER_FILE = 45
"""About 600 tokens a file: twelve of them are several times the 5,000-token hard limit."""
FIRST_REQUEST = (
    "Read data_00.txt to data_11.txt one at a time and tell me which file mentions row 7 "
    "most often. Do not modify any file."
)
SECOND_REQUEST = "Now read them all again, in reverse order, and count the rows that mention drift."


def _write_files(folder) -> list[str]:
    names = []
    for index in range(FILES):
        name = f"data_{index:02d}.txt"
        body = "".join(LINE.format(row=row) for row in range(LINES_PER_FILE))
        (folder / name).write_text(f"file {index}\n{body}", encoding="utf-8")
        names.append(name)
    return names


def _reads(names: list[str]) -> list:
    return [tool_calls(("read_file", {"path": name}), content=f"Reading {name}.") for name in names]


def _request_text(request) -> str:
    return json.dumps(request.body["messages"], ensure_ascii=False)


def _capsules(ip) -> list[CapsuleEntry]:
    agent = ip.magics_manager.registry["SobaMagics"].agent
    return [e for e in Transcript.load(agent.file).path() if isinstance(e, CapsuleEntry)]


def _requests_after_first_compaction(scripted, since: int) -> list:
    """Inference requests of one turn that follow its first compaction request."""
    requests = scripted.server.requests[since:]
    first = next(i for i, r in enumerate(requests) if r.operation == "compaction")
    return [r for r in requests[first:] if r.operation == "inference"]


@pytest.mark.parametrize(
    "summary",
    [
        pytest.param(good_summary("Summarise the files the user named."), id="model-capsules"),
        pytest.param("Error: the model is overloaded", id="deterministic-fallback"),
    ],
)
def test_three_compactions_in_one_turn_and_the_next_turn_keep_the_request(ip, nb_dir, scripted, summary):
    names = _write_files(nb_dir)
    # Model capsules that never mention the user's request, or a rejected summary (so the
    # deterministic capsule is used every time).
    scripted.summary = text(summary)

    scripted.script(*_reads(names), text("data_03.txt mentions row 7 most often."))
    ip.run_line_magic("soba", FIRST_REQUEST)
    first_turn = _capsules(ip)
    assert len(first_turn) >= 3, [c.trigger for c in first_turn]
    assert {c.trigger for c in first_turn} >= {"auto_threshold", "hard_limit"}
    assert {c.quality for c in first_turn} == {"full" if "##" in summary else "degraded"}
    later = _requests_after_first_compaction(scripted, 0)
    assert len(later) >= 3
    for request in later:
        assert json.dumps(FIRST_REQUEST)[1:-1] in _request_text(request)

    since = len(scripted.server.requests)
    scripted.script(*_reads(list(reversed(names))), text("All 540 rows mention drift."))
    ip.run_line_magic("soba", SECOND_REQUEST)
    assert len(_capsules(ip)) >= len(first_turn) + 3
    later = _requests_after_first_compaction(scripted, since)
    assert len(later) >= 3
    for request in later:
        carried = _request_text(request)
        assert json.dumps(SECOND_REQUEST)[1:-1] in carried
        # The finished first request is no longer presented as the one to work on.
        assert f"(verbatim):\\n\\n```\\n{json.dumps(FIRST_REQUEST)[1:-1]}" not in carried
