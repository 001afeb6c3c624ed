"""Agent turns end to end through the real loopback LLM server (OpenAI wire format)."""

from __future__ import annotations

import json
import threading
from collections import deque
from pathlib import Path

import pytest
from compaction_support import add_exchange, good_summary
from llm_server import LLMServer, Reply, empty_stream, overflow, rate_limited, text, tool_calls

from soba_nb.agent.assembly import choose_layout, open_session
from soba_nb.agent.events import TextDelta
from soba_nb.agent.loop import run_turn
from soba_nb.agent.session import AgentSession
from soba_nb.config import build_config
from soba_nb.providers.openai import OpenAIProvider
from soba_nb.transcript.entries import (
    CapsuleEntry,
    MessageEntry,
    ToolCallEntry,
    ToolResultEntry,
    UsageEntry,
)
from soba_nb.transcript.store import Transcript

KEY_ENV = "SOBA_LOOP_TEST_KEY"
KEY_VALUE = "sk-proj-LoopTestSecret0123456789abcdefXYZ"


class Router:
    """Script inference and compaction answers separately (requests carry X-Soba-Operation)."""

    def __init__(self, server: LLMServer, *, summary: Reply | None = None):
        self.inference: deque[Reply] = deque()
        self.summary = summary or text(good_summary())
        self.server = server

    def script(self, *replies: Reply, count: int = 40) -> None:
        self.inference.extend(replies)
        self.server.script(*[self._route for _ in range(count)])

    def _route(self, request) -> Reply:
        if request.operation == "compaction":
            return self.summary
        return self.inference.popleft() if self.inference else text("fallback answer")


@pytest.fixture
def server():
    with LLMServer() as running:
        yield running


@pytest.fixture
def make_session(tmp_path, server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY_VALUE)
    sessions: list[AgentSession] = []

    def make(**compaction) -> AgentSession:
        settings = {
            "minTokensForAutoCompact": 1500,
            "minReclaimableTokens": 500,
            "keepRecentTokens": 1000,
            "safetyReserveTokens": 500,
            "timeoutMs": 5000,
            **compaction,
        }
        config = build_config([(
            "test",
            {
                "model": {
                    "provider": "openai", "name": "gpt-4o", "baseUrl": server.url,
                    "apiKeyEnv": KEY_ENV, "contextWindow": 6000, "maxOutputTokens": 500,
                },
                "compaction": settings,
            },
        )])
        session = open_session(
            config,
            choose_layout(tmp_path / "analysis.soba"),
            project_root=tmp_path,
            namespace={},
            notebook=str(tmp_path / "analysis.ipynb"),
            provider_factory=lambda cfg: OpenAIProvider(cfg.model, backoff_base_s=0.01, backoff_max_s=0.05),
        )
        sessions.append(session)
        return session

    yield make
    for session in sessions:
        session.close()


def inference_requests(server):
    return [r for r in server.requests if r.operation == "inference"]


def assert_pairs_intact(messages):
    called: set[str] = set()
    for message in messages:
        for call in message.get("tool_calls") or []:
            called.add(call["id"])
        if message["role"] == "tool":
            assert message["tool_call_id"] in called


def entries(session, kind):
    return [e for e in session.transcript.path() if isinstance(e, kind)]


def test_a_tool_loop_compacts_between_tool_batches(make_session, server):
    session = make_session()
    router = Router(server)
    router.script(*[tool_calls(("python", {"code": "print('row,' * 1500)"})) for _ in range(7)], text("All done."))
    result = run_turn(session, "Print the rows seven times.")
    assert result.status == "completed" and result.answer == "All done."
    operations = [r.operation for r in server.requests if r.operation]
    first_compaction = operations.index("compaction")
    assert 0 < first_compaction < len(operations) - 1  # between inference requests
    assert entries(session, CapsuleEntry)
    after = inference_requests(server)[-1]["messages"]
    assert any("Context Capsule" in (m.get("content") or "") for m in after)
    for request in inference_requests(server):
        assert_pairs_intact(request["messages"])
        assert request.headers["x-soba-operation-id"]
    calls = entries(session, ToolCallEntry)
    results = entries(session, ToolResultEntry)
    assert len(calls) == len(results) == 7
    assert entries(session, UsageEntry)


def test_overflow_recovers_with_one_compaction_and_one_retry(make_session, server):
    session = make_session()
    for i in range(8):
        add_exchange(session.transcript, 300, index=i)
    router = Router(server)
    router.script(overflow(), text("Recovered answer."))
    result = run_turn(session, "Summarize the data.")
    assert result.status == "completed" and result.answer == "Recovered answer."
    assert [r.operation for r in server.requests if r.operation] == ["inference", "compaction", "inference"]
    first, retry = inference_requests(server)
    assert len(json.dumps(retry.body)) < len(json.dumps(first.body))
    [capsule] = entries(session, CapsuleEntry)
    assert capsule.trigger == "context_overflow"


def test_overflow_twice_fails_clearly_after_exactly_two_inference_requests(make_session, server):
    session = make_session()
    for i in range(8):
        add_exchange(session.transcript, 300, index=i)
    router = Router(server)
    router.script(overflow(), overflow(), text("never sent"))
    result = run_turn(session, "Summarize the data.")
    assert result.status == "failed"
    assert "again" in result.message
    assert len(inference_requests(server)) == 2


def test_rate_limit_then_success(make_session, server):
    session = make_session()
    Router(server).script(rate_limited(retry_after=0.1), text("Fine."))
    result = run_turn(session, "hello")
    assert result.status == "completed" and result.answer == "Fine."
    assert len(inference_requests(server)) == 2


def test_empty_stream_is_a_failure_that_is_retried(make_session, server):
    session = make_session()
    Router(server).script(empty_stream(), text("Second time lucky."))
    result = run_turn(session, "hello")
    assert result.status == "completed" and result.answer == "Second time lucky."
    assert len(inference_requests(server)) == 2


def test_only_empty_streams_fail_the_turn_never_an_empty_answer(make_session, server):
    session = make_session()
    Router(server).script(*[empty_stream() for _ in range(10)])
    result = run_turn(session, "hello")
    assert result.status == "failed"
    assert not [e for e in entries(session, MessageEntry) if e.role == "assistant"]


def test_stream_cancelled_mid_answer_leaves_a_consistent_transcript(make_session, server):
    session = make_session()
    Router(server).script(text("word " * 200, chunks=100, chunk_delay_s=0.02), text("Next turn works."))
    cancel = threading.Event()

    def on_event(event):
        if isinstance(event, TextDelta):
            cancel.set()

    result = run_turn(session, "write a lot", on_event=on_event, cancel=cancel)
    assert result.status == "cancelled"
    assert not entries(session, CapsuleEntry)
    reloaded = Transcript.load(session.file)
    assert [e.id for e in reloaded.path()] == [e.id for e in session.transcript.path()]
    assert run_turn(session, "again").answer == "Next turn works."


def test_summary_slower_than_timeout_gives_a_degraded_capsule(make_session, server):
    session = make_session(timeoutMs=300)
    for i in range(8):
        add_exchange(session.transcript, 300, index=i)
    Router(server, summary=text(good_summary(), delay_s=3)).script()
    session.ensure_summarizer()
    result = session.compactor.compact()
    assert result.outcome.value == "completed" and result.quality == "degraded"
    assert "fallback" in result.line()
    assert server.wait_until(lambda: any(r.operation == "compaction" for r in server.requests))


def test_the_api_key_never_appears_in_any_file_written(make_session, server, tmp_path):
    session = make_session()
    router = Router(server)
    router.script(tool_calls(("python", {"code": "x = 1"})), text("done"))
    for i in range(6):
        add_exchange(session.transcript, 300, index=i)
    run_turn(session, "go")
    session.compactor.compact()
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY_VALUE}"
    written = [p for p in Path(tmp_path).rglob("*") if p.is_file()]
    assert any(p.name == "flight.jsonl" for p in written)
    for path in written:
        assert KEY_VALUE not in path.read_text(errors="replace"), path


def test_secrets_never_reach_the_transcript(make_session, server, monkeypatch):
    monkeypatch.setenv("WAREHOUSE_PASSWORD", "hunter2-correct-horse-battery")
    session = make_session()
    code = "import os; print(os.environ['WAREHOUSE_PASSWORD'], os.environ['SOBA_LOOP_TEST_KEY'])"
    Router(server).script(tool_calls(("python", {"code": code})), text("printed it"))
    result = run_turn(session, f"my key is {KEY_VALUE}, print the password")
    assert result.status == "completed"
    [tool_result] = entries(session, ToolResultEntry)
    assert "[redacted]" in tool_result.content
    raw = session.file.read_text()
    assert "hunter2-correct-horse-battery" not in raw and KEY_VALUE not in raw


def anthropic_rules_problems(body) -> list[str]:
    """What the Anthropic Messages API would refuse in a request body."""
    problems = []
    messages = body["messages"]
    if not messages or messages[0]["role"] != "user":
        problems.append("the first message must be a user message")
    for before, after in zip(messages, messages[1:], strict=False):
        if before["role"] == after["role"]:
            problems.append("roles must alternate")
    pending: set[str] = set()
    for message in messages:
        blocks = message["content"] if isinstance(message["content"], list) else [
            {"type": "text", "text": message["content"]}
        ]
        results = {b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"}
        if pending and results != pending:
            problems.append(f"tool_use {sorted(pending)} not answered in the next message")
        pending = {b["id"] for b in blocks if b.get("type") == "tool_use"}
        problems += ["empty text block" for b in blocks if b.get("type") == "text" and not b["text"].strip()]
    return problems


def test_an_anthropic_session_with_tools_and_a_compaction_sends_valid_requests(tmp_path, server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY_VALUE)
    from soba_nb.providers.anthropic import AnthropicProvider

    config = build_config([(
        "test",
        {
            "model": {
                "provider": "anthropic", "name": "claude-test", "baseUrl": server.anthropic_url,
                "apiKeyEnv": KEY_ENV, "contextWindow": 6000, "maxOutputTokens": 500,
            },
            "compaction": {
                "minTokensForAutoCompact": 1500, "minReclaimableTokens": 500,
                "keepRecentTokens": 1000, "safetyReserveTokens": 500,
            },
        },
    )])
    session = open_session(
        config, choose_layout(tmp_path / "nb.soba"), project_root=tmp_path,
        provider_factory=lambda cfg: AnthropicProvider(cfg.model, backoff_base_s=0.01),
    )
    try:
        router = Router(server)
        router.script(*[tool_calls(("python", {"code": "print('row,' * 1500)"})) for _ in range(6)], text("Done."))
        assert run_turn(session, "Print rows six times.").status == "completed"
        router.script(text("And again."))
        assert run_turn(session, "One more thing.").status == "completed"
        assert entries(session, CapsuleEntry)
        inference = inference_requests(server)
        assert all(r.path == "/v1/messages" for r in inference)
        for request in inference:
            assert anthropic_rules_problems(request.body) == [], request.body["messages"]
    finally:
        session.close()


def test_closing_the_session_closes_the_providers_it_made(make_session, server, tmp_path):
    """A closed session left its providers' HTTP clients open: their pooled connections to the
    server became "unclosed socket" warnings whenever the garbage collector found them."""
    session = make_session()
    server.script(text("First."))
    assert run_turn(session, "hello").status == "completed"
    first = session.provider
    session.set_idle_timeout(5.0)  # a new idle limit: a new provider on the next request
    server.script(text("Second."))
    assert run_turn(session, "again").status == "completed"
    second = session.provider
    assert second is not first
    with OpenAIProvider(session.config.model) as given:
        other = open_session(session.config, choose_layout(tmp_path / "other.soba"), project_root=tmp_path, provider=given)
        session.close()
        other.close()
        assert first._client.is_closed and second._client.is_closed  # type: ignore[attr-defined]
        assert not given._client.is_closed  # one passed in belongs to the caller
