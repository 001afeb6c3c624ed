"""Issue 15: native continuation, end to end against loopback servers speaking each API.

A session compacts natively (our barrier decides when; the provider's item is recorded beside
the portable capsule), continues with the item replayed, switches model and continues from
the portable capsule, rewinds across the compaction, and exports the capsule without the
item. The servers refuse what the real APIs refuse: an item they did not issue, one made for
another model, a compaction block without its beta header and declared edit.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SMALL_LIMITS, write_soba_json
from IPython.utils.capture import capture_output
from llm_server import LLMServer, RecordedRequest, Reply, text, tool_calls

from soba_nb.agent.assembly import choose_layout, open_session
from soba_nb.agent.loop import run_turn
from soba_nb.agent.session import AgentSession
from soba_nb.capsule_files.export import export_capsule
from soba_nb.cli.inspect import describe, render_inspect
from soba_nb.config import build_config
from soba_nb.layout import SessionLayout
from soba_nb.transcript.entries import CapsuleEntry, CheckpointEntry, MessageEntry
from soba_nb.transcript.store import Transcript

NATIVE_SUMMARY = "NATIVE-SUMMARY: the provider's own account of the earlier turns."


def capsules(transcript: Transcript) -> list[CapsuleEntry]:
    return [e for e in transcript.path() if isinstance(e, CapsuleEntry)]


def opaque_of(capsule: CapsuleEntry) -> str:
    assert capsule.native is not None
    payload = capsule.native.payload
    items = payload.get("items", [payload])
    return str(items[-1]["encrypted_content"])


# -- OpenAI Responses, in a notebook -----------------------------------------------------------


def responses_layer() -> dict[str, Any]:
    return {
        "model": {**SMALL_LIMITS["model"], "api": "responses"},
        "compaction": {**SMALL_LIMITS["compaction"], "auto": False},
    }


def magics(ip: Any) -> Any:
    return ip.magics_manager.registry["SobaMagics"]


def work(ip: Any, scripted: Any, turns: int = 3) -> None:
    for n in range(turns):
        scripted.script(tool_calls(("python", {"code": f"print('col{n},' * 400)"})), text(f"Column {n} profiled."))
        ip.run_line_magic("soba", f"profile column {n}")


def last_inference(scripted: Any) -> RecordedRequest:
    return scripted.inference_requests()[-1]


def test_a_notebook_session_on_the_responses_api(ip: Any, nb_dir: Path, llm_server: LLMServer, scripted: Any) -> None:
    write_soba_json(nb_dir, llm_server.url, responses_layer())
    work(ip, scripted)
    first_turn = next(e for e in Transcript.load(magics(ip).agent.file).path() if isinstance(e, CheckpointEntry))

    with capture_output() as compacted:
        ip.run_line_magic("compact", "")
    transcript = Transcript.load(magics(ip).agent.file)
    [capsule] = capsules(transcript)
    assert capsule.native is not None and capsule.native.kind == "openai.responses.compact"
    assert f"{capsule.checkpoint_id} · native" in compacted.stdout
    compact_request = [r for r in llm_server.requests if r.path == "/v1/responses/compact"][-1]
    assert compact_request.operation == "compaction" and compact_request.operation_id == capsule.operation_id
    opaque = opaque_of(capsule)

    # The next request replays the window first, instead of the capsule text.
    ip.run_line_magic("soba", "now plot column 2")
    sent = last_inference(scripted)
    assert sent.path == "/v1/responses" and sent.body["store"] is False
    window = capsule.native.payload["items"]
    assert sent.body["input"][: len(window)] == window
    assert "Context Capsule" not in json.dumps(sent.body)
    assert llm_server.native.replayed[-1] == opaque

    # What the user sees and what is written never shows the item.
    with capture_output() as shown:
        ip.run_line_magic("capsule", "show")
        ip.run_line_magic("budget", "")
    assert opaque not in shown.stdout and "## Goal and constraints" in shown.stdout
    assert "· native" in shown.stdout
    info = describe(transcript)
    assert info["capsules"][0]["native"] == {"provider": "openai", "model": "gpt-4o", "kind": "openai.responses.compact"}
    assert opaque not in json.dumps(info) and opaque not in render_inspect(info)
    assert opaque not in (nb_dir / "analysis.soba" / "flight.jsonl").read_text()

    # Export writes the portable capsule only.
    exported = export_capsule(transcript, capsule.checkpoint_id, nb_dir / "handoff.capsule.md", project_root=nb_dir)
    written = exported.read_text()
    assert "## Goal and constraints" in written
    assert opaque not in written and "encrypted" not in written and "native" not in written

    # Another model: the portable capsule, and the server accepts the request.
    ip.run_line_magic("soba", "--model gpt-4o-mini summarise the columns")
    switched = last_inference(scripted)
    assert switched.body["model"] == "gpt-4o-mini"
    assert not any(i.get("type") == "compaction" for i in switched.body["input"])
    assert f"checkpoint {capsule.checkpoint_id}" in json.dumps(switched.body)  # the capsule text
    assert switched.completed

    # Back on the model that made it: the item again.
    ip.run_line_magic("soba", "--model gpt-4o and the totals")
    assert last_inference(scripted).body["input"][: len(window)] == window

    # Rewind across the compaction: the history before it, in full, no item.
    ip.run_line_magic("rewind", first_turn.checkpoint_id)
    ip.run_line_magic("soba", "start again from column 1")
    rewound = json.dumps(last_inference(scripted).body)
    assert "profile column 0" in rewound and opaque not in rewound and "Context Capsule" not in rewound


def test_a_chat_completions_session_never_asks_for_native_compaction(
    ip: Any, nb_dir: Path, llm_server: LLMServer, scripted: Any
) -> None:
    write_soba_json(nb_dir, llm_server.url, {**SMALL_LIMITS, "compaction": {**SMALL_LIMITS["compaction"], "auto": False}})
    work(ip, scripted)
    with capture_output() as compacted:
        ip.run_line_magic("compact", "")
    [capsule] = capsules(Transcript.load(magics(ip).agent.file))
    assert capsule.native is None and capsule.continuation is None and capsule.quality == "full"
    assert compacted.stdout.rstrip().split("\n")[0].endswith(capsule.checkpoint_id)  # the old wording
    assert not any("responses" in r.path for r in llm_server.requests)


# -- Anthropic Messages, in an agent session ----------------------------------------------------

KEY_ENV = "SOBA_NATIVE_REGRESSION_KEY"
BIG_PROMPT_WORDS = 30_000
"""About 34,500 tokens: two such prompts pass Anthropic's documented minimum trigger (50,000)."""


class Router:
    def __init__(self, server: LLMServer):
        self.inference: deque[Reply] = deque()
        server.default_reply = self  # type: ignore[assignment]  # the server accepts callables

    def __call__(self, request: RecordedRequest) -> Reply:
        if request.operation == "compaction":
            return text(NATIVE_SUMMARY)
        return self.inference.popleft() if self.inference else text("ok")


@pytest.fixture
def anthropic_session(tmp_path: Path, llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[AgentSession]:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test-regression")
    session = open_session(anthropic_config(llm_server, "claude-a"), choose_layout(tmp_path / "nb.soba"), project_root=tmp_path)
    yield session
    session.close()


def anthropic_config(server: LLMServer, name: str) -> Any:
    return build_config([(
        "test",
        {
            "model": {"provider": "anthropic", "name": name, "baseUrl": server.anthropic_url, "apiKeyEnv": KEY_ENV,
                      "contextWindow": 200_000, "maxOutputTokens": 4000},
            "compaction": {"auto": False, "keepRecentTokens": 1000, "timeoutMs": 10_000},
        },
    )])


def big_turns(session: AgentSession) -> None:
    """Long tables, then a short question: what is compacted (all but the last table, which
    the kept tail holds whole) passes the minimum."""
    for n in range(3):
        assert run_turn(session, f"read table {n}:\n" + "cell " * BIG_PROMPT_WORDS).status == "completed"
    assert run_turn(session, "how many rows in all?").status == "completed"


def anthropic_inference(server: LLMServer) -> list[RecordedRequest]:
    return [r for r in server.requests if r.path == "/v1/messages" and r.operation == "inference"]


def test_an_anthropic_session_compacts_natively_and_switches_model(
    anthropic_session: AgentSession, llm_server: LLMServer, tmp_path: Path
) -> None:
    session = anthropic_session
    Router(llm_server)
    big_turns(session)
    before = next(e for e in session.transcript.path_view() if isinstance(e, CheckpointEntry))

    result = session.compactor.compact()

    assert result.continuation == "native", result.reason
    [capsule] = capsules(session.transcript)
    assert capsule.native is not None and capsule.native.payload["content"] == NATIVE_SUMMARY
    asked = [r for r in llm_server.requests if r.operation == "compaction"]
    assert len(asked) == 1 and asked[0].headers["anthropic-beta"] == "compact-2026-01-12"
    assert asked[0].body["context_management"]["edits"][0]["pause_after_compaction"] is True

    # Continue: the block is replayed under the beta header with its edit declared.
    assert run_turn(session, "which table was larger?").status == "completed"
    sent = anthropic_inference(llm_server)[-1]
    assert sent.headers["anthropic-beta"] == "compact-2026-01-12"
    assert sent.body["messages"][1]["content"][0] == capsule.native.payload
    assert sent.body["context_management"]["edits"][0]["type"] == "compact_20260112"
    carried = json.dumps(sent.body)
    assert "read table 0" not in carried and "read table 1" not in carried  # compacted
    assert "read table 2" in carried  # the kept tail, whole
    assert llm_server.native.replayed == [opaque_of(capsule)]

    # Export: the portable capsule only, neither the summary nor the opaque state.
    written = export_capsule(session.transcript, capsule.checkpoint_id, tmp_path / "c.capsule.md",
                             project_root=tmp_path).read_text()
    assert NATIVE_SUMMARY not in written and opaque_of(capsule) not in written

    # Another model: the portable capsule (the server would refuse the block for it).
    session.apply_config(anthropic_config(llm_server, "claude-b"))
    assert run_turn(session, "and the smaller one?").status == "completed"
    switched = anthropic_inference(llm_server)[-1]
    assert switched.body["model"] == "claude-b" and "anthropic-beta" not in switched.headers
    assert NATIVE_SUMMARY not in json.dumps(switched.body)
    assert f"checkpoint {capsule.checkpoint_id}" in json.dumps(switched.body)

    # Rewind across the compaction: the full history again, no block.
    session.rewind(before.checkpoint_id)
    session.apply_config(anthropic_config(llm_server, "claude-a"))
    assert run_turn(session, "start over").status == "completed"
    rewound = anthropic_inference(llm_server)[-1]
    assert "read table 0" in json.dumps(rewound.body) and "context_management" not in rewound.body
    roles = [m["role"] for m in rewound.body["messages"]]
    assert roles[0] == "user" and all(a != b for a, b in zip(roles, roles[1:], strict=False))


def test_the_native_item_survives_a_kernel_restart(
    anthropic_session: AgentSession, llm_server: LLMServer, tmp_path: Path
) -> None:
    session = anthropic_session
    Router(llm_server)
    big_turns(session)
    assert session.compactor.compact().continuation == "native"
    file = session.file
    session.close()

    resumed = open_session(anthropic_config(llm_server, "claude-a"), SessionLayout(file), project_root=tmp_path)
    try:
        assert run_turn(resumed, "go on").status == "completed"
        sent = anthropic_inference(llm_server)[-1]
        [capsule] = capsules(resumed.transcript)
        assert sent.body["messages"][1]["content"][0] == capsule.native.payload  # type: ignore[union-attr]
        assert any(isinstance(e, MessageEntry) and e.content == "go on" for e in resumed.transcript.path_view())
    finally:
        resumed.close()
