"""Anthropic Messages provider, through a real loopback server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from llm_server import LLMServer, malformed, overflow, server_error, stream_error, text, tool_calls

from soba_nb.config import ModelSettings
from soba_nb.providers.anthropic import AnthropicProvider
from soba_nb.providers.base import ChatMessage, ModelRequest, ToolCall, ToolSchema
from soba_nb.providers.errors import (
    BadResponseError,
    ContextOverflowError,
    MissingApiKeyError,
    ServerError,
)

KEY_ENV = "SOBA_TEST_ANTHROPIC_KEY"
FAST_RETRIES: dict[str, Any] = {"max_retries": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.02}


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as running:
        yield running


@pytest.fixture
def provider(server: LLMServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[AnthropicProvider]:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    settings = ModelSettings(
        provider="anthropic", base_url=server.anthropic_url, api_key_env=KEY_ENV, name="claude-test"
    )
    with AnthropicProvider(settings, **FAST_RETRIES) as opened:
        yield opened


def make_request(**overrides: object) -> ModelRequest:
    fields: dict[str, object] = {
        "system": "You are a notebook agent.",
        "messages": [ChatMessage(role="user", content="Load data.csv")],
        "max_output_tokens": 512,
        "operation_id": "op-anth",
    }
    fields.update(overrides)
    return ModelRequest.model_validate(fields)


def test_streamed_text_usage_and_headers(server: LLMServer, provider: AnthropicProvider) -> None:
    server.script(text("Loaded 120000 rows.", chunks=3, input_tokens=4321, output_tokens=9))
    shown: list[str] = []

    response = provider.complete(make_request(), on_text=shown.append)

    assert len(shown) == 3
    assert "".join(shown) == response.text == "Loaded 120000 rows."
    assert response.finish_reason == "stop"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (4321, 9)
    sent = server.requests[0]
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant-test"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert (sent.operation, sent.operation_id) == ("inference", "op-anth")


def test_body_has_top_level_system_and_merged_tool_results(
    server: LLMServer, provider: AnthropicProvider
) -> None:
    history = [
        ChatMessage(role="user", content="Compare a.py and b.py"),
        ChatMessage(
            role="assistant",
            content="Reading both.",
            tool_calls=[
                ToolCall(id="toolu_a", name="read_file", arguments='{"path": "a.py"}'),
                ToolCall(id="toolu_b", name="read_file", arguments='{"path": "b.py"}'),
            ],
        ),
        ChatMessage(role="tool", tool_call_id="toolu_a", content="A"),
        ChatMessage(role="tool", tool_call_id="toolu_b", content="no such file", is_error=True),
    ]
    schema = ToolSchema(name="read_file", description="Read a file", parameters={"type": "object"})
    provider.complete(make_request(messages=history, tools=[schema]))

    body = server.requests[0].body
    assert body["system"] == "You are a notebook agent."
    assert body["max_tokens"] == 512
    assert body["tools"] == [
        {"name": "read_file", "description": "Read a file", "input_schema": {"type": "object"}}
    ]
    assert [message["role"] for message in body["messages"]] == ["user", "assistant", "user"]
    assistant = body["messages"][1]["content"]
    assert assistant[0] == {"type": "text", "text": "Reading both."}
    assert assistant[1] == {
        "type": "tool_use",
        "id": "toolu_a",
        "name": "read_file",
        "input": {"path": "a.py"},
    }
    results = body["messages"][2]["content"]
    assert results == [
        {"type": "tool_result", "tool_use_id": "toolu_a", "content": "A"},
        {
            "type": "tool_result",
            "tool_use_id": "toolu_b",
            "content": "no such file",
            "is_error": True,
        },
    ]


def test_streamed_tool_use_with_input_json_deltas(
    server: LLMServer, provider: AnthropicProvider
) -> None:
    arguments = {"command": "pytest -q", "timeout_s": 60}
    server.script(tool_calls(("shell", arguments), content="Running the tests.", argument_deltas=4))

    response = provider.complete(make_request())

    assert response.text == "Running the tests."
    assert response.finish_reason == "tool_calls"
    assert [(call.id, call.name) for call in response.tool_calls] == [("toolu_0", "shell")]
    assert json.loads(response.tool_calls[0].arguments) == arguments


@pytest.mark.parametrize(("neutral", "expected"), [("length", "length"), ("stop", "stop")])
def test_stop_reasons_are_normalised(
    server: LLMServer, provider: AnthropicProvider, neutral: str, expected: str
) -> None:
    server.script(text("x", finish=neutral))
    assert provider.complete(make_request()).finish_reason == expected


def test_non_streaming_answer(server: LLMServer, provider: AnthropicProvider) -> None:
    server.script(
        tool_calls(("python", {"code": "df.shape"}), content="Checking.", input_tokens=77)
    )

    response = provider.complete(make_request(stream=False))

    assert server.requests[0]["stream"] is False
    assert response.text == "Checking."
    assert response.finish_reason == "tool_calls"
    assert json.loads(response.tool_calls[0].arguments) == {"code": "df.shape"}
    assert response.usage is not None and response.usage.input_tokens == 77


def test_overflow_is_typed_with_limit_and_never_retried(
    server: LLMServer, provider: AnthropicProvider
) -> None:
    server.script(overflow())

    with pytest.raises(ContextOverflowError) as caught:
        provider.complete(make_request())

    assert (caught.value.limit, caught.value.requested) == (200000, 210000)
    assert len(server.requests) == 1


def test_overloaded_error_event_mid_stream_is_retried(
    server: LLMServer, provider: AnthropicProvider
) -> None:
    server.script(
        stream_error(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        ),
        text("second try"),
    )
    assert provider.complete(make_request()).text == "second try"
    assert len(server.requests) == 2


def test_server_errors_exhaust_bounded_retries(
    server: LLMServer, provider: AnthropicProvider
) -> None:
    server.script(*[server_error(503)] * 5)

    with pytest.raises(ServerError, match="gave up after 3 attempts"):
        provider.complete(make_request())

    assert len(server.requests) == 3
    assert {request.operation_id for request in server.requests} == {"op-anth"}


def test_malformed_body_is_bad_response(server: LLMServer, provider: AnthropicProvider) -> None:
    server.script(malformed())
    with pytest.raises(BadResponseError):
        provider.complete(make_request(stream=False))
    assert len(server.requests) == 1


def test_base_url_with_v1_is_not_doubled(
    server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "k")
    settings = ModelSettings(
        provider="anthropic", base_url=server.anthropic_url + "/v1/", api_key_env=KEY_ENV
    )
    with AnthropicProvider(settings) as provider:
        provider.complete(make_request())
    assert server.requests[0].path == "/v1/messages"


def test_missing_key_for_public_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with (
        AnthropicProvider(ModelSettings(provider="anthropic", api_key_env=KEY_ENV)) as provider,
        pytest.raises(MissingApiKeyError, match=KEY_ENV),
    ):
        provider.complete(make_request())
