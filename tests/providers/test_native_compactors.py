"""Native compaction requests (`soba_nb.providers.native_compactors`) against the loopback server's
documented wire formats: OpenAI `POST /responses/compact`, Anthropic `compact_20260112`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from llm_server import LLMServer, http_error, server_error, text

from soba_nb.compaction.native_continuation import NativeRefused, NativeRequest
from soba_nb.compaction.summarizer import RequestNotSent
from soba_nb.config import ModelSettings
from soba_nb.messages import ChatMessage, ToolCall, ToolSchema
from soba_nb.providers.anthropic import AnthropicProvider
from soba_nb.providers.base import ModelRequest
from soba_nb.providers.errors import RequestRejectedError
from soba_nb.providers.native_compactors import (
    AnthropicNative,
    ResponsesNative,
    native_compactor_for,
)
from soba_nb.providers.openai import OpenAIProvider
from soba_nb.providers.responses import ResponsesProvider

KEY_ENV = "SOBA_TEST_NATIVE_KEY"
FAST: dict[str, Any] = {"max_retries": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.02}
BIG = 60_000
"""Above Anthropic's documented minimum trigger (50,000 input tokens)."""
TOOLS = (ToolSchema(name="python", description="run python", parameters={"type": "object"}),)


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as running:
        yield running


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test-native")


MADE: list[OpenAIProvider | AnthropicProvider] = []
"""Providers the helpers made, closed after each test (their pooled connections with them)."""


@pytest.fixture(autouse=True)
def close_providers() -> Iterator[None]:
    yield
    while MADE:
        MADE.pop().close()


def responses(server: LLMServer, name: str = "gpt-test") -> ResponsesProvider:
    provider = ResponsesProvider(ModelSettings(base_url=server.url, api_key_env=KEY_ENV, name=name, api="responses"), **FAST)
    MADE.append(provider)
    return provider


def anthropic(server: LLMServer, name: str = "claude-test", window: int = 200_000) -> AnthropicProvider:
    settings = ModelSettings(
        provider="anthropic", base_url=server.anthropic_url, api_key_env=KEY_ENV, name=name,
        context_window=window, max_output_tokens=4000,
    )
    provider = AnthropicProvider(settings, **FAST)
    MADE.append(provider)
    return provider


def region(tokens: int = BIG, *, ends_with_assistant: bool = True) -> NativeRequest:
    messages = [
        ChatMessage(role="user", content="Load data.csv and clean it"),
        ChatMessage(role="assistant", tool_calls=[ToolCall(id="call_1", name="python", arguments='{"code": "1"}')]),
        ChatMessage(role="tool", tool_call_id="call_1", name="python", content="rows " * 50),
        ChatMessage(role="user", content="now plot it"),
    ]
    if ends_with_assistant:
        messages.append(ChatMessage(role="assistant", content="Plotted."))
    return NativeRequest(
        operation_id="op_native", system="You are soba.", tools=TOOLS, messages=tuple(messages), native=None,
        input_tokens=tokens, soft_limit=100_000, max_output_tokens=2048,
    )


def compact(native: ResponsesNative | AnthropicNative, request: NativeRequest) -> Any:
    return native.compact(request, cancel=threading.Event(), timeout_s=10)


def test_which_providers_compact_natively(server: LLMServer) -> None:
    assert isinstance(native_compactor_for(responses(server)), ResponsesNative)
    assert isinstance(native_compactor_for(anthropic(server)), AnthropicNative)
    with OpenAIProvider(ModelSettings(base_url=server.url, api_key_env=KEY_ENV)) as chat:
        assert native_compactor_for(chat) is None


def test_responses_compact_endpoint_request_and_window(server: LLMServer) -> None:
    server.script(text("opaque summary"))
    item = compact(ResponsesNative(responses(server)), region())

    sent = server.requests[0]
    assert sent.path == "/v1/responses/compact"
    assert (sent.operation, sent.operation_id) == ("compaction", "op_native")
    assert sent.headers["authorization"] == "Bearer sk-test-native"
    assert sent.body["model"] == "gpt-test" and sent.body["instructions"] == "You are soba."
    assert [i.get("type") for i in sent.body["input"]] == [
        "message", "function_call", "function_call_output", "message", "message"
    ]
    assert (item.provider, item.model, item.kind) == ("openai", "gpt-test", "openai.responses.compact")
    window = item.payload["items"]
    # Every user message of the input, then one encrypted compaction item (the documented window).
    assert [(i["type"], i.get("role")) for i in window] == [("message", "user"), ("message", "user"), ("compaction", None)]
    assert window[-1]["encrypted_content"] in server.native.issued
    assert "payload" not in repr(item) and window[-1]["encrypted_content"] not in repr(item)


def test_responses_rolls_the_previous_window_into_the_next(server: LLMServer) -> None:
    native = ResponsesNative(responses(server))
    first = compact(native, region())
    request = region()
    second = compact(native, msgspec.structs.replace(request, native=first))
    rolled = server.requests[1].body["input"]
    assert rolled[: len(first.payload["items"])] == first.payload["items"]
    assert server.native.replayed == [first.payload["items"][-1]["encrypted_content"]]
    assert second.payload["items"][-1]["encrypted_content"] != first.payload["items"][-1]["encrypted_content"]


def test_responses_server_errors_are_retried_like_inference(server: LLMServer) -> None:
    server.script(server_error(503), text("summary"))
    item = compact(ResponsesNative(responses(server)), region())
    assert item.kind == "openai.responses.compact"
    assert [r.operation_id for r in server.requests] == ["op_native", "op_native"]


def test_a_rejected_feature_is_asked_once_per_session(server: LLMServer) -> None:
    server.script(http_error(404, {"error": {"message": "Not found: /v1/responses/compact"}}))
    native = ResponsesNative(responses(server))
    with pytest.raises(RequestRejectedError):
        compact(native, region())
    with pytest.raises(NativeRefused, match="not asked again"):
        compact(native, region())
    assert len(server.requests) == 1


def test_anthropic_compaction_request_fields(server: LLMServer) -> None:
    server.script(text("Summary: the user loads data.csv and plots it.", input_tokens=BIG))
    item = compact(AnthropicNative(anthropic(server)), region())

    sent = server.requests[0]
    assert sent.path == "/v1/messages" and sent.headers["anthropic-beta"] == "compact-2026-01-12"
    assert (sent.operation, sent.operation_id) == ("compaction", "op_native")
    body = sent.body
    assert body["stream"] is False and body["system"] == "You are soba." and body["tools"]
    edit = body["context_management"]["edits"][0]
    # The trigger is our soft limit, lowered to the request's size so that it fires.
    assert edit == {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": BIG},
                    "pause_after_compaction": True}
    # The region ended with an assistant message: a user turn closes it.
    assert body["messages"][-1]["role"] == "user"
    assert (item.provider, item.model, item.kind) == ("anthropic", "claude-test", "anthropic.compact_20260112")
    assert item.payload["type"] == "compaction"
    assert item.payload["content"] == "Summary: the user loads data.csv and plots it."
    assert item.payload["encrypted_content"] in server.native.issued


def test_anthropic_below_the_documented_minimum_is_refused_without_a_call(server: LLMServer) -> None:
    with pytest.raises(NativeRefused, match="below the provider's minimum of 50,000"):
        compact(AnthropicNative(anthropic(server)), region(49_000))
    assert server.requests == []


def test_anthropic_answer_without_compaction_is_refused(server: LLMServer) -> None:
    """The server counted fewer tokens than the trigger: it answered instead of compacting."""
    server.script(text("Here is my answer.", input_tokens=BIG - 1))
    with pytest.raises(NativeRefused, match="without compacting"):
        compact(AnthropicNative(anthropic(server)), region())


def test_anthropic_block_is_replayed_with_the_beta_and_a_trigger_beyond_the_window(server: LLMServer) -> None:
    provider = anthropic(server, window=200_000)
    server.script(text("Summary of the work.", input_tokens=BIG), text("Continuing."))
    item = compact(AnthropicNative(provider), region())
    later = [ChatMessage(role="assistant", content="Kept answer."), ChatMessage(role="user", content="next step")]

    provider.complete(ModelRequest(system="s", messages=later, max_output_tokens=100, operation_id="op_i", native=item))

    sent = server.requests[1]
    assert sent.headers["anthropic-beta"] == "compact-2026-01-12"
    assert sent.body["context_management"]["edits"][0]["trigger"]["value"] == 200_000
    assert "pause_after_compaction" not in sent.body["context_management"]["edits"][0]
    roles = [m["role"] for m in sent.body["messages"]]
    assert roles == ["user", "assistant", "user"]  # the block opens the assistant turn it merges into
    assert sent.body["messages"][1]["content"][0] == item.payload
    assert sent.body["messages"][1]["content"][1] == {"type": "text", "text": "Kept answer."}
    assert server.native.replayed == [item.payload["encrypted_content"]]


def test_a_block_made_for_another_model_is_refused_by_the_server(server: LLMServer) -> None:
    """The loopback server is as strict as the API: state is bound to the model."""
    server.script(text("Summary.", input_tokens=BIG))
    item = compact(AnthropicNative(anthropic(server, name="claude-a")), region())
    other = anthropic(server, name="claude-b")
    with pytest.raises(RequestRejectedError, match="made for claude-a"):
        other.complete(ModelRequest(system="s", messages=[ChatMessage(role="user", content="hi")],
                                    max_output_tokens=10, operation_id="x", native=item))


def test_native_compactions_ask_the_spend_check_first_and_report_their_usage(server: LLMServer) -> None:
    """SPEC §11: a native compaction request is checked against the session's cap before it
    leaves, and its usage (`operation: compaction`, the operation's id) is handed back."""
    checked: list[ModelRequest] = []
    spent: list[Any] = []
    server.script(text("opaque summary", cached_input_tokens=3))
    ResponsesNative(responses(server), checked.append).compact(
        region(), cancel=threading.Event(), timeout_s=10, on_usage=spent.append
    )
    server.script(text("a summary", input_tokens=BIG, output_tokens=300, cached_input_tokens=1000))
    AnthropicNative(anthropic(server), checked.append).compact(
        region(), cancel=threading.Event(), timeout_s=10, on_usage=spent.append
    )
    assert [(r.operation, r.operation_id, r.input_tokens, r.max_output_tokens) for r in checked] == [
        ("compaction", "op_native", BIG, 2048)
    ] * 2
    openai_usage, anthropic_usage = spent
    assert (openai_usage.provider, openai_usage.operation, openai_usage.operation_id) == ("openai", "compaction", "op_native")
    assert openai_usage.input_tokens > 0 and openai_usage.cached_input_tokens == 3
    # Anthropic's input_tokens leaves the cache read out; the entry's figure is the whole prompt.
    assert (anthropic_usage.input_tokens, anthropic_usage.cached_input_tokens, anthropic_usage.output_tokens) == (BIG, 1000, 300)
    assert (anthropic_usage.provider, anthropic_usage.operation) == ("anthropic", "compaction")

    def refuse(request: ModelRequest) -> None:
        raise RequestNotSent("request not sent: over the cap")

    sent = len(server.requests)
    for native in (ResponsesNative(responses(server), refuse), AnthropicNative(anthropic(server), refuse)):
        with pytest.raises(RequestNotSent):
            compact(native, region())
    assert len(server.requests) == sent  # nothing left
