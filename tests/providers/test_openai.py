"""OpenAI-compatible provider, through a real loopback server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from llm_server import (
    LLMServer,
    http_error,
    malformed,
    overflow,
    stream_error,
    text,
    tool_calls,
    truncated,
)

from soba_nb.config import ModelSettings
from soba_nb.providers.base import ChatMessage, ModelRequest, ToolCall, ToolSchema
from soba_nb.providers.errors import (
    BadResponseError,
    ContextOverflowError,
    IncompleteResponseError,
    MissingApiKeyError,
    RequestRejectedError,
)
from soba_nb.providers.openai import OpenAIProvider

KEY_ENV = "SOBA_TEST_OPENAI_KEY"
FAST_RETRIES: dict[str, Any] = {"max_retries": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.02}


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as running:
        yield running


@pytest.fixture
def provider(server: LLMServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIProvider]:
    monkeypatch.delenv(KEY_ENV, raising=False)
    settings = ModelSettings(base_url=server.url, api_key_env=KEY_ENV, name="test-model")
    with OpenAIProvider(settings, **FAST_RETRIES) as opened:
        yield opened


def make_request(**overrides: object) -> ModelRequest:
    fields: dict[str, object] = {
        "system": "You are a notebook agent.",
        "messages": [ChatMessage(role="user", content="Load data.csv")],
        "max_output_tokens": 256,
        "operation_id": "op-123",
    }
    fields.update(overrides)
    return ModelRequest.model_validate(fields)


def test_streamed_text_reaches_callback_in_chunks(
    server: LLMServer, provider: OpenAIProvider
) -> None:
    server.script(text("The data has 3 columns.", chunks=4, input_tokens=1234, output_tokens=7))
    shown: list[str] = []

    response = provider.complete(make_request(), on_text=shown.append)

    assert len(shown) == 4
    assert "".join(shown) == response.text == "The data has 3 columns."
    assert response.finish_reason == "stop"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (1234, 7)
    assert response.provider == "openai"


def test_stream_asks_for_usage_and_sends_openai_shapes(
    server: LLMServer, provider: OpenAIProvider
) -> None:
    history = [
        ChatMessage(role="user", content="Read a.py"),
        ChatMessage(
            role="assistant",
            tool_calls=[ToolCall(id="call_a", name="read_file", arguments='{"path": "a.py"}')],
        ),
        ChatMessage(role="tool", tool_call_id="call_a", name="read_file", content="print(1)"),
    ]
    schema = ToolSchema(name="read_file", description="Read a file", parameters={"type": "object"})
    provider.complete(make_request(messages=history, tools=[schema]))

    body = server.requests[0].body
    assert body["model"] == "test-model"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 256
    assert body["messages"][0] == {"role": "system", "content": "You are a notebook agent."}
    assert body["messages"][2]["tool_calls"] == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
        }
    ]
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "call_a", "content": "print(1)"}
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file",
                "parameters": {"type": "object"},
            },
        }
    ]


def test_openai_host_gets_max_completion_tokens() -> None:
    provider = OpenAIProvider(ModelSettings())
    try:
        assert "max_completion_tokens" in provider.build_body(make_request())
    finally:
        provider.close()


def test_streamed_tool_call_arguments_are_assembled_from_deltas(
    server: LLMServer, provider: OpenAIProvider
) -> None:
    arguments = {"path": "notebooks/analysis.py", "content": "x = 1\n" * 5}
    server.script(
        tool_calls(("write_file", arguments), ("list_files", {"path": "."}), argument_deltas=5)
    )

    response = provider.complete(make_request())

    assert response.finish_reason == "tool_calls"
    assert [call.name for call in response.tool_calls] == ["write_file", "list_files"]
    assert json.loads(response.tool_calls[0].arguments) == arguments
    assert json.loads(response.tool_calls[1].arguments) == {"path": "."}
    assert response.tool_calls[0].id != response.tool_calls[1].id


def test_stream_without_usage_gives_none(server: LLMServer, provider: OpenAIProvider) -> None:
    server.script(text("ok", usage=False))
    assert provider.complete(make_request()).usage is None


def test_length_finish_is_normalised(server: LLMServer, provider: OpenAIProvider) -> None:
    server.script(text("cut", finish="length"))
    assert provider.complete(make_request()).finish_reason == "length"


@pytest.mark.parametrize(
    "reply", [text("All done.", input_tokens=50), tool_calls(("python", {"code": "1+1"}))]
)
def test_non_streaming_answers(server: LLMServer, provider: OpenAIProvider, reply: object) -> None:
    server.script(reply)  # type: ignore[arg-type]
    response = provider.complete(make_request(stream=False))

    assert server.requests[0]["stream"] is False
    assert "stream_options" not in server.requests[0].body
    assert response.usage is not None
    if response.tool_calls:
        assert response.finish_reason == "tool_calls"
        assert json.loads(response.tool_calls[0].arguments) == {"code": "1+1"}
    else:
        assert (response.text, response.finish_reason, response.usage.input_tokens) == (
            "All done.",
            "stop",
            50,
        )


def test_operation_headers_on_every_request(server: LLMServer, provider: OpenAIProvider) -> None:
    provider.complete(make_request(operation="compaction", operation_id="op-7"))
    provider.complete(make_request(operation_id="op-8", stream=False))

    first, second = server.requests
    assert (first.operation, first.operation_id) == ("compaction", "op-7")
    assert (second.operation, second.operation_id) == ("inference", "op-8")


def test_overflow_is_typed_with_limit_and_never_retried(
    server: LLMServer, provider: OpenAIProvider
) -> None:
    server.script(overflow())

    with pytest.raises(ContextOverflowError) as caught:
        provider.complete(make_request())

    assert (caught.value.limit, caught.value.requested) == (8192, 9000)
    assert len(server.requests) == 1


def test_overflow_inside_a_200_stream(server: LLMServer, provider: OpenAIProvider) -> None:
    """vLLM and llama.cpp may report a failure as an error object inside the stream."""
    message = "request (9000 tokens) exceeds the available context size (8192 tokens)"
    server.script(
        stream_error({"error": {"message": message, "type": "exceed_context_size_error"}})
    )

    with pytest.raises(ContextOverflowError) as caught:
        provider.complete(make_request())

    assert (caught.value.limit, caught.value.requested) == (8192, 9000)
    assert len(server.requests) == 1


def test_malformed_stream_chunk_is_bad_response(
    server: LLMServer, provider: OpenAIProvider
) -> None:
    server.script(malformed())
    with pytest.raises(BadResponseError):
        provider.complete(make_request())
    assert len(server.requests) == 1


def test_malformed_json_body_is_bad_response(server: LLMServer, provider: OpenAIProvider) -> None:
    server.script(malformed())
    with pytest.raises(BadResponseError, match="not valid JSON"):
        provider.complete(make_request(stream=False))


def test_truncated_stream_after_shown_text_fails_without_retry(
    server: LLMServer, provider: OpenAIProvider
) -> None:
    """Retrying would show the start of the answer twice."""
    server.script(truncated("Half an ans", chunks=2))
    shown: list[str] = []

    with pytest.raises(IncompleteResponseError, match="not retried"):
        provider.complete(make_request(), on_text=shown.append)

    assert "".join(shown) == "Half an ans"
    assert len(server.requests) == 1


def test_api_key_from_named_env_var(
    server: LLMServer, provider: OpenAIProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test-123")
    provider.complete(make_request())
    assert server.requests[0].headers["authorization"] == "Bearer sk-test-123"


def test_loopback_server_needs_no_key(server: LLMServer, provider: OpenAIProvider) -> None:
    provider.complete(make_request())
    assert "authorization" not in server.requests[0].headers


def test_remote_server_without_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    settings = ModelSettings(base_url="https://llm.example.com/v1", api_key_env=KEY_ENV)
    with OpenAIProvider(settings) as provider, pytest.raises(MissingApiKeyError, match=KEY_ENV):
        provider.complete(make_request())


def test_key_echoed_by_server_is_redacted(
    server: LLMServer, provider: OpenAIProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-secret-abcdef"
    monkeypatch.setenv(KEY_ENV, secret)
    server.script(http_error(401, {"error": {"message": f"Incorrect API key provided: {secret}"}}))

    with pytest.raises(RequestRejectedError) as caught:
        provider.complete(make_request())

    assert secret not in str(caught.value)
    assert "HTTP 401" in str(caught.value)
    assert server.requests[0].headers["authorization"] == f"Bearer {secret}"
