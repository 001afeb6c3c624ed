"""OpenAI Responses API provider (`model.api: "responses"`), through a real loopback server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from llm_server import (
    LLMServer,
    Reply,
    empty_stream,
    malformed,
    overflow,
    server_error,
    stream_error,
    text,
    tool_calls,
    truncated,
)

from soba_nb.config import ModelSettings
from soba_nb.providers import make_provider
from soba_nb.providers.base import ChatMessage, ModelRequest, ToolCall, ToolSchema
from soba_nb.providers.errors import (
    BadResponseError,
    ContextOverflowError,
    IncompleteResponseError,
    RequestRejectedError,
    ServerError,
)
from soba_nb.providers.openai import OpenAIProvider
from soba_nb.providers.responses import ResponsesProvider
from soba_nb.transcript.entries import NativeContinuation

KEY_ENV = "SOBA_TEST_RESPONSES_KEY"
KEY_VALUE = "sk-test-ResponsesKey0123456789abcdef"
FAST_RETRIES: dict[str, Any] = {"max_retries": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.02}


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as running:
        yield running


@pytest.fixture
def provider(server: LLMServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[ResponsesProvider]:
    monkeypatch.setenv(KEY_ENV, KEY_VALUE)
    settings = ModelSettings(base_url=server.url, api_key_env=KEY_ENV, name="gpt-test", api="responses")
    with ResponsesProvider(settings, **FAST_RETRIES) as opened:
        yield opened


def make_request(**overrides: object) -> ModelRequest:
    fields: dict[str, object] = {
        "system": "You are a notebook agent.",
        "messages": [ChatMessage(role="user", content="Load data.csv")],
        "max_output_tokens": 256,
        "operation_id": "op-resp",
    }
    fields.update(overrides)
    return ModelRequest.model_validate(fields)


def test_model_api_chooses_the_wire_format(server: LLMServer) -> None:
    assert isinstance(make_provider(ModelSettings(base_url=server.url, api="responses")), ResponsesProvider)
    chat = make_provider(ModelSettings(base_url=server.url))
    assert isinstance(chat, OpenAIProvider) and not isinstance(chat, ResponsesProvider)


def test_streamed_text_usage_and_headers(server: LLMServer, provider: ResponsesProvider) -> None:
    server.script(text("Loaded 120000 rows.", chunks=3, input_tokens=4321, output_tokens=9))
    shown: list[str] = []

    response = provider.complete(make_request(), on_text=shown.append)

    assert len(shown) == 3 and "".join(shown) == response.text == "Loaded 120000 rows."
    assert response.finish_reason == "stop"
    assert response.usage is not None and (response.usage.input_tokens, response.usage.output_tokens) == (4321, 9)
    sent = server.requests[0]
    assert sent.path == "/v1/responses"
    assert sent.headers["authorization"] == f"Bearer {KEY_VALUE}"
    assert (sent.operation, sent.operation_id) == ("inference", "op-resp")
    body = sent.body
    assert body["model"] == "gpt-test" and body["instructions"] == "You are a notebook agent."
    assert body["store"] is False and body["stream"] is True and body["max_output_tokens"] == 256
    assert body["input"] == [{"type": "message", "role": "user", "content": "Load data.csv"}]
    assert "messages" not in body and "context_management" not in body


def test_history_becomes_items_and_tools_are_flat_and_not_strict(
    server: LLMServer, provider: ResponsesProvider
) -> None:
    server.script(text("Both read."))
    history = [
        ChatMessage(role="user", content="Compare a.py and b.py"),
        ChatMessage(
            role="assistant",
            content="Reading both.",
            tool_calls=[
                ToolCall(id="call_a", name="read_file", arguments='{"path": "a.py"}'),
                ToolCall(id="call_b", name="read_file", arguments='{"path": "b.py"}'),
            ],
        ),
        ChatMessage(role="tool", tool_call_id="call_a", name="read_file", content="A"),
        ChatMessage(role="tool", tool_call_id="call_b", name="read_file", content="B", is_error=True),
    ]
    schema = ToolSchema(name="read_file", description="Read a file", parameters={"type": "object"})

    provider.complete(make_request(messages=history, tools=[schema]))

    body = server.requests[0].body
    assert body["input"] == [
        {"type": "message", "role": "user", "content": "Compare a.py and b.py"},
        {"type": "message", "role": "assistant", "content": "Reading both."},
        {"type": "function_call", "call_id": "call_a", "name": "read_file", "arguments": '{"path": "a.py"}'},
        {"type": "function_call", "call_id": "call_b", "name": "read_file", "arguments": '{"path": "b.py"}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "A"},
        {"type": "function_call_output", "call_id": "call_b", "output": "B"},
    ]
    assert body["tools"] == [
        {"type": "function", "name": "read_file", "description": "Read a file",
         "parameters": {"type": "object"}, "strict": False}
    ]


def test_a_result_without_its_call_is_refused_by_the_server(server: LLMServer, provider: ResponsesProvider) -> None:
    orphan = [ChatMessage(role="user", content="hi"), ChatMessage(role="tool", tool_call_id="nope", content="x")]
    with pytest.raises(RequestRejectedError, match="No tool call found"):
        provider.complete(make_request(messages=orphan))


def test_streamed_function_calls_are_assembled(server: LLMServer, provider: ResponsesProvider) -> None:
    server.script(tool_calls(("python", {"code": "df.describe()"}), ("list_files", {"path": "."}), content="Checking."))
    response = provider.complete(make_request())
    assert response.finish_reason == "tool_calls" and response.text == "Checking."
    assert [(c.id, c.name, json.loads(c.arguments)) for c in response.tool_calls] == [
        ("call_0", "python", {"code": "df.describe()"}),
        ("call_1", "list_files", {"path": "."}),
    ]


@pytest.mark.parametrize("stream", [True, False])
def test_output_limit_is_length(server: LLMServer, provider: ResponsesProvider, stream: bool) -> None:
    server.script(text("cut sh", finish="length"))
    response = provider.complete(make_request(stream=stream))
    assert response.finish_reason == "length" and response.text == "cut sh"


def test_non_streamed_answer(server: LLMServer, provider: ResponsesProvider) -> None:
    server.script(tool_calls(("python", {"code": "1"}), content="Running.", input_tokens=77))
    response = provider.complete(make_request(stream=False))
    assert server.requests[0].body["stream"] is False
    assert response.text == "Running." and response.finish_reason == "tool_calls"
    assert response.tool_calls[0].name == "python" and response.usage is not None
    assert response.usage.input_tokens == 77


def test_overflow_is_typed_and_never_retried(server: LLMServer, provider: ResponsesProvider) -> None:
    server.script(overflow(), text("never reached"))
    with pytest.raises(ContextOverflowError, match="exceeds the context window"):
        provider.complete(make_request())
    assert len(server.requests) == 1


def test_overflow_in_a_failed_stream(server: LLMServer, provider: ResponsesProvider) -> None:
    failed = {
        "type": "response.failed",
        "response": {"status": "failed", "error": {"code": "context_length_exceeded",
                                                    "message": "Your input exceeds the context window of this model."}},
    }
    server.script(stream_error(failed), text("never reached"))
    with pytest.raises(ContextOverflowError):
        provider.complete(make_request())
    assert len(server.requests) == 1


def test_error_event_and_server_errors_are_retried(server: LLMServer, provider: ResponsesProvider) -> None:
    event = {"type": "error", "code": "server_error", "message": "The server had an error."}
    server.script(stream_error(event), server_error(502), text("third time"))
    assert provider.complete(make_request()).text == "third time"
    assert len(server.requests) == 3
    assert {r.operation_id for r in server.requests} == {"op-resp"}


def test_server_errors_exhaust_bounded_retries(server: LLMServer, provider: ResponsesProvider) -> None:
    server.script(*[server_error(500) for _ in range(5)])
    with pytest.raises(ServerError, match="gave up after 3 attempts"):
        provider.complete(make_request())


@pytest.mark.parametrize("reply", [truncated("The answer starts", chunks=1), empty_stream()])
def test_a_stream_without_completion_is_a_failure(server: LLMServer, provider: ResponsesProvider, reply: Reply) -> None:
    server.script(reply, reply, reply, reply)
    with pytest.raises(IncompleteResponseError):
        provider.complete(make_request())


def test_malformed_event_is_bad_response(server: LLMServer, provider: ResponsesProvider) -> None:
    server.script(malformed())
    with pytest.raises(BadResponseError):
        provider.complete(make_request())


def test_a_native_window_is_replayed_first_in_input(server: LLMServer, provider: ResponsesProvider) -> None:
    window = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Load data.csv"}]},
        {"type": "compaction", "id": "cmp_1", "encrypted_content": server.native.issue("gpt-test", "s")},
    ]
    native = NativeContinuation(provider="openai", model="gpt-test", kind="openai.responses.compact",
                                payload={"items": window})
    server.script(text("continuing"))
    provider.complete(make_request(native=native, messages=[ChatMessage(role="user", content="next")]))
    body = server.requests[0].body
    assert body["input"] == [*window, {"type": "message", "role": "user", "content": "next"}]
    assert server.native.replayed == [window[1]["encrypted_content"]]


def test_an_item_of_another_kind_is_not_replayed(server: LLMServer, provider: ResponsesProvider) -> None:
    native = NativeContinuation(provider="anthropic", model="gpt-test", kind="anthropic.compact_20260112",
                                payload={"type": "compaction", "content": "x"})
    server.script(text("ok"))
    provider.complete(make_request(native=native))
    assert server.requests[0].body["input"] == [{"type": "message", "role": "user", "content": "Load data.csv"}]


def test_a_compaction_item_in_the_output_is_not_mistaken_for_the_answer(
    server: LLMServer, provider: ResponsesProvider
) -> None:
    """A server that compacted in-flight (context_management) puts an item before the reply."""
    server.script(text("the reply", input_tokens=9000))
    request = make_request()
    body = provider.build_body(request)
    body["context_management"] = [{"type": "compaction", "compact_threshold": 1000}]
    data = provider.post_json(provider.endpoint(), {**body, "stream": False}, operation="inference", operation_id="x")
    assert [item["type"] for item in data["output"]] == ["compaction", "message"]
    assert provider.parse_answer(data).text == "the reply"
