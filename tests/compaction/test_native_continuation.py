"""Native continuation in the compaction engine: our barrier decides when, the provider's own
compaction (loopback server, real providers) is recorded beside the portable capsule, and
model input replays it only to the provider and model that produced it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from compaction_support import add_tool_group, good_summary, make_compactor, open_transcript, words
from llm_server import LLMServer, RecordedRequest, Reply, server_error, text

from soba_nb.agent.provider_summarizer import ProviderSummarizer
from soba_nb.compaction.compactor import Compactor, SummaryModels
from soba_nb.compaction.model_input import capsule_text, visible_context
from soba_nb.compaction.native_continuation import REQUEST_FRAME, NativeTarget, continuation_label
from soba_nb.compaction.outcomes import Outcome
from soba_nb.config import ModelSettings
from soba_nb.providers.anthropic import AnthropicProvider
from soba_nb.providers.native_compactors import AnthropicNative, ResponsesNative
from soba_nb.providers.responses import ResponsesProvider
from soba_nb.transcript.entries import (
    CapsuleEntry,
    MessageEntry,
    NativeContinuation,
    entry_from_json,
)
from soba_nb.transcript.store import Transcript

KEY_ENV = "SOBA_TEST_NATIVE_ENGINE_KEY"
FAST: dict[str, Any] = {"max_retries": 1, "backoff_base_s": 0.01, "backoff_max_s": 0.02}


class Router:
    """Answers by endpoint: the compact endpoint from `compact`, summaries with `summary`."""

    def __init__(self, server: LLMServer):
        self.compact: Reply = text("opaque")
        self.summary: Reply = text(good_summary())
        server.default_reply = self  # type: ignore[assignment]  # the server accepts callables

    def __call__(self, request: RecordedRequest) -> Reply:
        return self.compact if request.path.endswith("/compact") else self.summary


ProviderT = TypeVar("ProviderT", ResponsesProvider, AnthropicProvider)
MADE: list[ResponsesProvider | AnthropicProvider] = []
"""Providers the tests made, closed with the server (their pooled connections with them)."""


def made(provider: ProviderT) -> ProviderT:
    MADE.append(provider)
    return provider


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[LLMServer]:
    monkeypatch.setenv(KEY_ENV, "sk-test-engine")
    with LLMServer() as running:
        yield running
        while MADE:
            MADE.pop().close()


def responses_engine(
    transcript: Transcript, server: LLMServer, *, flight: Path | None = None, **engine: Any
) -> Compactor:
    provider = made(
        ResponsesProvider(ModelSettings(base_url=server.url, api_key_env=KEY_ENV, name="gpt-test", api="responses"), **FAST)
    )
    compactor = make_compactor(transcript, summarizer=None, flight=flight, **engine)
    compactor.bind(SummaryModels(ProviderSummarizer(provider), ResponsesNative(provider)))
    return compactor


def agent_work(t: Transcript, groups: int = 6, result_tokens: int = 400) -> None:
    """Short requests, long tool results: the usual shape of an agent session."""
    for n in range(groups):
        t.append(MessageEntry(role="user", content=f"step {n}: clean the next column"))
        add_tool_group(t, result_tokens, tag=f"s{n}")
        t.append(MessageEntry(role="assistant", content=f"column {n} cleaned"))


def capsules(t: Transcript) -> list[CapsuleEntry]:
    return [e for e in t.path() if isinstance(e, CapsuleEntry)]


def test_native_compaction_is_recorded_beside_the_deterministic_capsule(tmp_path: Path, server: LLMServer) -> None:
    Router(server)
    t = open_transcript(tmp_path)
    agent_work(t)
    flight = tmp_path / "flight.jsonl"
    engine = responses_engine(t, server, flight=flight)

    result = engine.compact()

    assert result.outcome is Outcome.COMPLETED and result.continuation == "native"
    [capsule] = capsules(t)
    assert capsule.native is not None and capsule.continuation == "native"
    assert (capsule.native.provider, capsule.native.model, capsule.native.kind) == (
        "openai", "gpt-test", "openai.responses.compact"
    )
    # The portable capsule is still written, deterministic (no second model call).
    assert capsule.quality == "degraded" and "## Goal and constraints" in capsule.content
    assert [r.path for r in server.requests] == ["/v1/responses/compact"]
    assert result.line().endswith(f"{capsule.checkpoint_id} · native") and "fallback" not in result.line()
    assert continuation_label(capsule) == "native"
    # On disk: the `native` field in camelCase JSON, read back the same.
    line = next(x for x in t.file.read_text().splitlines() if '"type":"capsule"' in x)
    assert json.loads(line)["native"]["kind"] == "openai.responses.compact"
    assert entry_from_json(line) == capsule
    # Flight records say which continuation, never the item.
    record = json.loads(flight.read_text().splitlines()[-1])
    assert record["continuation"] == "native" and record["reason"] == "ok"
    opaque = capsule.native.payload["items"][-1]["encrypted_content"]
    assert opaque not in flight.read_text()


def test_model_input_replays_the_item_and_the_budget_counts_it(tmp_path: Path, server: LLMServer) -> None:
    Router(server)
    t = open_transcript(tmp_path)
    agent_work(t)
    engine = responses_engine(t, server)
    result = engine.compact()
    [capsule] = capsules(t)

    built = engine.model_input()
    assert built.native == capsule.native
    assert not any(capsule.checkpoint_id in m.content for m in built.messages)  # no capsule text
    # tokensAfter is what the budget measures next: the native item and the kept tail.
    assert result.tokens_after == capsule.tokens_after == engine.measure().effective == built.tokens


def test_another_model_gets_the_portable_capsule(tmp_path: Path, server: LLMServer) -> None:
    Router(server)
    t = open_transcript(tmp_path)
    agent_work(t)
    engine = responses_engine(t, server)
    engine.compact()
    [capsule] = capsules(t)
    assert capsule.native is not None
    native_cost = engine.measure().effective

    other = made(ResponsesProvider(ModelSettings(base_url=server.url, api_key_env=KEY_ENV, name="gpt-other", api="responses")))
    engine.bind(SummaryModels(engine.summarizer, ResponsesNative(other)))
    built = engine.model_input()
    assert built.native is None
    assert built.messages[0].content == capsule_text(capsule)
    assert engine.measure().effective != native_cost  # measured as the portable capsule now


@pytest.mark.parametrize(
    "target",
    [
        NativeTarget("openai", "gpt-test", frozenset({"openai.responses.compact"})),
        NativeTarget("anthropic", "gpt-test", frozenset({"openai.responses.compact"})),
        NativeTarget("openai", "gpt-test-2", frozenset({"openai.responses.compact"})),
        NativeTarget("openai", "gpt-test", frozenset({"anthropic.compact_20260112"})),
        None,
    ],
)
def test_only_the_producing_provider_and_model_get_the_item(tmp_path: Path, target: NativeTarget | None) -> None:
    t = open_transcript(tmp_path)
    native = NativeContinuation(provider="openai", model="gpt-test", kind="openai.responses.compact", payload={"items": []})
    t.append(MessageEntry(role="user", content="hello"))
    t.append(CapsuleEntry(operation_id="op", checkpoint_id="ck_00000001", trigger="user", quality="degraded",
                          tokens_before=10, tokens_after=5, first_kept_entry_id=None, content="## Goal", native=native))
    context = visible_context(t.path(), target=target)
    matches = target is not None and (target.provider, target.model) == ("openai", "gpt-test") and (
        "openai.responses.compact" in target.kinds
    )
    assert (context.native == native) == matches


def test_a_failed_native_request_falls_back_to_the_model_capsule(tmp_path: Path, server: LLMServer) -> None:
    router = Router(server)
    router.compact = server_error(500)
    t = open_transcript(tmp_path)
    agent_work(t)
    flight = tmp_path / "flight.jsonl"
    result = responses_engine(t, server, flight=flight).compact()

    assert result.outcome is Outcome.COMPLETED and result.continuation == "portable"
    [capsule] = capsules(t)
    assert capsule.native is None and capsule.quality == "full" and capsule.continuation == "portable"
    assert result.reason.startswith("portable: native compaction failed (ServerError")
    assert result.line().endswith(" · portable")
    assert [r.path for r in server.requests] == ["/v1/responses/compact"] * 2 + ["/v1/responses"]
    assert {r.operation for r in server.requests} == {"compaction"}
    assert json.loads(flight.read_text().splitlines()[-1])["reason"] == "native_failed"


def test_a_native_request_past_the_deadline_gives_the_fallback_at_once(tmp_path: Path, server: LLMServer) -> None:
    router = Router(server)
    router.compact = text("late", delay_s=3)
    t = open_transcript(tmp_path)
    agent_work(t)
    started = time.monotonic()
    result = responses_engine(t, server, timeout_ms=500).compact()

    assert time.monotonic() - started < 2
    assert result.outcome is Outcome.COMPLETED and result.continuation == "fallback"
    assert result.reason == "fallback: native compaction did not finish within timeoutMs=500"
    [capsule] = capsules(t)
    assert capsule.native is None and capsule.quality == "degraded"
    assert result.line().endswith(" · fallback")
    assert all(r.path.endswith("/compact") for r in server.requests)  # no time was left for a summary


def test_cancel_while_the_native_request_runs_appends_nothing(tmp_path: Path, server: LLMServer) -> None:
    router = Router(server)
    router.compact = text("late", delay_s=3)
    t = open_transcript(tmp_path)
    agent_work(t)
    engine = responses_engine(t, server, timeout_ms=5000)
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()

    result = engine.compact(cancel=cancel)

    assert result.outcome is Outcome.CANCELLED and "native" in result.reason
    assert capsules(t) == []


def test_a_native_window_that_does_not_pay_off_gives_way_to_the_portable_capsule(
    tmp_path: Path, server: LLMServer
) -> None:
    """OpenAI's window keeps every user message verbatim: long pasted requests stay."""
    Router(server)
    t = open_transcript(tmp_path)
    for n in range(4):
        t.append(MessageEntry(role="user", content=f"table {n}:\n" + words(700)))
        t.append(MessageEntry(role="assistant", content="noted"))
    # (The capsule quotes the requests too, within compaction.userRequestTokens: a small budget.)
    result = responses_engine(t, server, user_request_tokens=300).compact()

    assert result.outcome is Outcome.COMPLETED and result.continuation == "portable"
    assert result.reason.startswith("portable: native continuation not used (the capsule would not make")
    [capsule] = capsules(t)
    assert capsule.native is None and capsule.quality == "full"


def test_a_repeated_compaction_rolls_the_native_window_up(tmp_path: Path, server: LLMServer) -> None:
    Router(server)
    t = open_transcript(tmp_path)
    agent_work(t)
    engine = responses_engine(t, server)
    engine.compact()
    first = capsules(t)[0]
    assert first.native is not None
    agent_work(t, groups=4)
    second = engine.compact()

    assert second.continuation == "native"
    window = first.native.payload["items"]
    sent = server.requests[-1]
    assert sent.path.endswith("/compact") and sent.body["input"][: len(window)] == window
    assert server.native.replayed == [window[-1]["encrypted_content"]]


def test_the_request_being_worked_on_follows_the_native_item_verbatim(tmp_path: Path, server: LLMServer) -> None:
    """One long turn: the request is compacted with the tool results it started."""
    Router(server)
    t = open_transcript(tmp_path)
    request = "Profile every column of sales.csv and write a report " + words(30)
    t.append(MessageEntry(role="user", content=request))
    for n in range(8):
        add_tool_group(t, 400, tag=f"long{n}")
    engine = responses_engine(t, server)
    result = engine.compact()

    [capsule] = capsules(t)
    assert result.continuation == "native" and capsule.native is not None
    assert capsule.native.request == request
    built = engine.model_input()
    assert built.messages[0].role == "user" and built.messages[0].content == REQUEST_FRAME + request


def test_anthropic_below_its_minimum_is_refused_and_the_model_capsule_used(tmp_path: Path, server: LLMServer) -> None:
    Router(server)
    t = open_transcript(tmp_path)
    agent_work(t)
    provider = made(
        AnthropicProvider(
            ModelSettings(provider="anthropic", base_url=server.anthropic_url, api_key_env=KEY_ENV, name="claude-test"),
            **FAST,
        )
    )
    engine = make_compactor(t)
    engine.bind(SummaryModels(ProviderSummarizer(provider), AnthropicNative(provider)))

    result = engine.compact()

    assert result.continuation == "portable"
    assert "native compaction refused" in result.reason and "below the provider's minimum" in result.reason
    assert [r.path for r in server.requests] == ["/v1/messages"]  # the summary only
    assert capsules(t)[0].quality == "full"
