"""Shared provider machinery: retries, deadlines, cancellation, keys, SSE, the factory.

Behaviour is checked through the real loopback server with the OpenAI-style provider
(the machinery is the same for every HTTP provider); the pure parts also directly.
"""

from __future__ import annotations

import importlib.util
import random
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from llm_server import (
    LLMServer,
    Reply,
    empty_stream,
    http_error,
    overflow,
    rate_limited,
    server_error,
    text,
    tool_calls,
)

from soba_nb.config import ModelSettings
from soba_nb.providers import make_provider
from soba_nb.providers.anthropic import AnthropicProvider
from soba_nb.providers.base import ChatMessage, ModelRequest
from soba_nb.providers.errors import (
    Cancelled,
    ContextOverflowError,
    IncompleteResponseError,
    MissingApiKeyError,
    ProviderError,
    ProviderTimeout,
    RateLimitError,
    RequestRejectedError,
    ServerError,
)
from soba_nb.providers.http import is_local_url, read_api_key
from soba_nb.providers.openai import OpenAIProvider
from soba_nb.providers.retry import Deadline, RetryPolicy, call_with_retries
from soba_nb.providers.sse import iter_sse_events

MAX_RETRIES = 2
TINY_BACKOFF = {"backoff_base_s": 0.01, "backoff_max_s": 0.02}
QUICK_S = 1.5
"""A failure that must come 'quickly' comes within this many seconds."""


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as running:
        yield running


def open_provider(server: LLMServer, **options: object) -> OpenAIProvider:
    settings = ModelSettings(base_url=server.url, api_key_env="SOBA_TEST_UNSET_KEY")
    return OpenAIProvider(settings, **{"max_retries": MAX_RETRIES, **TINY_BACKOFF, **options})  # type: ignore[arg-type]


@pytest.fixture
def provider(server: LLMServer) -> Iterator[OpenAIProvider]:
    with open_provider(server) as opened:
        yield opened


def make_request(**overrides: object) -> ModelRequest:
    fields: dict[str, object] = {
        "system": "system",
        "messages": [ChatMessage(role="user", content="hello")],
        "max_output_tokens": 64,
        "operation": "compaction",
        "operation_id": "op-retry",
    }
    fields.update(overrides)
    return ModelRequest.model_validate(fields)


# -- retries through the server -----------------------------------------------------


def test_rate_limit_waits_for_retry_after_then_succeeds(
    server: LLMServer, provider: OpenAIProvider
) -> None:
    server.script(rate_limited(retry_after=0.3), text("done"))

    assert provider.complete(make_request()).text == "done"

    first, second = server.requests
    assert second.time - first.time >= 0.28
    for request in (first, second):
        assert (request.operation, request.operation_id) == ("compaction", "op-retry")


def test_retry_after_is_capped(server: LLMServer) -> None:
    server.script(rate_limited(retry_after=30), text("done"))
    started = time.monotonic()
    with open_provider(server, retry_after_cap_s=0.05) as provider:
        assert provider.complete(make_request()).text == "done"
    assert time.monotonic() - started < QUICK_S


def test_server_error_then_success(server: LLMServer, provider: OpenAIProvider) -> None:
    server.script(server_error(500), text("recovered"))
    assert provider.complete(make_request(stream=False)).text == "recovered"
    assert len(server.requests) == 2
    assert all(request.operation_id == "op-retry" for request in server.requests)


def test_rate_limit_mentioning_context_is_not_an_overflow(server: LLMServer) -> None:
    server.script(rate_limited(retry_after=None, message="maximum context length is 8192 tokens"))
    with open_provider(server, max_retries=0) as provider, pytest.raises(RateLimitError):
        provider.complete(make_request())


@pytest.mark.parametrize(
    "reply", [overflow(), http_error(400, {"error": {"message": "unknown model"}})]
)
def test_overflow_and_rejections_are_never_retried(
    server: LLMServer, provider: OpenAIProvider, reply: object
) -> None:
    server.script(reply, text("must not be reached"))  # type: ignore[arg-type]
    with pytest.raises((ContextOverflowError, RequestRejectedError)):
        provider.complete(make_request())
    assert len(server.requests) == 1


def test_empty_200_stream_fails_after_bounded_retries(
    server: LLMServer, provider: OpenAIProvider
) -> None:
    server.script(*[empty_stream()] * (MAX_RETRIES + 3))

    with pytest.raises(IncompleteResponseError, match=f"gave up after {MAX_RETRIES + 1} attempts"):
        provider.complete(make_request())

    assert len(server.requests) == MAX_RETRIES + 1


def test_empty_200_body_is_an_incomplete_answer_that_is_retried(
    server: LLMServer, provider: OpenAIProvider
) -> None:
    server.script(empty_stream(), text("second time"))
    assert provider.complete(make_request(stream=False)).text == "second time"
    assert len(server.requests) == 2


def test_an_empty_stream_is_retried_as_a_plain_request_to_get_the_real_error(
    server: LLMServer, provider: OpenAIProvider
) -> None:
    """llama.cpp answers an oversized streamed prompt with an empty 200 stream, and the
    same prompt without streaming with its real error: an overflow, never retried again."""
    server.script(empty_stream(), overflow())
    with pytest.raises(ContextOverflowError):
        provider.complete(make_request(stream=True))
    first, second = server.requests
    assert first["stream"] is True and second["stream"] is False
    assert "stream_options" not in second.body


LITELLM_OVERFLOW = {
    "error": {
        "message": "litellm.ContextWindowExceededError: litellm.BadRequestError: ContextWindowExceededError: "
        "OpenAIException - This model's maximum context length is 2048 tokens. However, you requested 3051 "
        "tokens (3031 in the messages, 20 in the completion). Please reduce the length of the messages or "
        "completion.\nmodel=team-smol. context_window_fallbacks=None. fallbacks=None.",
        "type": "invalid_request_error",
        "param": None,
        "code": "400",
    }
}
"""LiteLLM 1.108's answer to an oversized unstreamed request to llama.cpp: the server's words, wrapped."""


def test_an_empty_streamed_answer_is_asked_again_unstreamed_and_a_hidden_overflow_shows(
    server: LLMServer, provider: OpenAIProvider
) -> None:
    """LiteLLM answers an oversized streamed request with HTTP 200 and one empty
    `finish_reason: stop` chunk (no text, no usage): a finished answer that says nothing. The
    same request unstreamed gets the 400 that states the window (SPEC §13)."""
    server.script(text("", usage=False), http_error(400, LITELLM_OVERFLOW))
    with pytest.raises(ContextOverflowError) as info:
        provider.complete(make_request(stream=True))
    assert (info.value.limit, info.value.requested) == (2048, 3031)
    assert [r["stream"] for r in server.requests] == [True, False]


def test_an_empty_streamed_answer_asked_again_shows_the_plain_answer(
    server: LLMServer, provider: OpenAIProvider
) -> None:
    server.script(text(""), text("The real answer."))
    shown: list[str] = []
    response = provider.complete(make_request(stream=True), on_text=shown.append)
    assert response.text == "The real answer." and "".join(shown) == "The real answer."
    assert [r["stream"] for r in server.requests] == [True, False]


def test_an_empty_answer_is_asked_again_once_only(server: LLMServer, provider: OpenAIProvider) -> None:
    """Empty again unstreamed: the model had nothing to say, and that is its answer."""
    server.script(text(""), text(""), text("never asked"))
    response = provider.complete(make_request(stream=True))
    assert response.text == "" and response.finish_reason == "stop"
    assert [r["stream"] for r in server.requests] == [True, False]


@pytest.mark.parametrize(
    "reply",
    [tool_calls(("python", {"code": "1"})), text("", finish="length"), text("Hi.")],
    ids=["a tool call", "empty at the length limit", "text"],
)
def test_an_answer_that_says_something_or_stopped_at_its_limit_is_not_asked_again(
    server: LLMServer, provider: OpenAIProvider, reply: Reply
) -> None:
    server.script(reply, text("never asked"))
    provider.complete(make_request(stream=True))
    assert len(server.requests) == 1


@pytest.mark.parametrize("stream", [True, False])
def test_an_empty_answer_near_the_window_is_an_overflow_not_a_glitch(
    server: LLMServer, provider: OpenAIProvider, stream: bool
) -> None:
    """llama.cpp / Ollama answer a prompt at or over their real window with an empty 200:
    for a request near the window that is an overflow (recovery), not four retries."""
    server.script(*[empty_stream()] * (MAX_RETRIES + 3))
    with pytest.raises(ContextOverflowError, match="near the model's window") as info:
        provider.complete(make_request(stream=stream, near_window=True, input_tokens=7900))
    assert "about 7,900 tokens" in str(info.value) and info.value.limit is None
    # A streamed request is asked once more without streaming (to get a real error if the
    # server has one); nothing beyond that.
    assert len(server.requests) == (2 if stream else 1)


def test_connection_refused_is_retried_then_server_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = ModelSettings(base_url=f"http://127.0.0.1:{port}/v1", api_key_env="")
    expected = f"connection failed.*after {MAX_RETRIES + 1} attempts"
    with (
        OpenAIProvider(settings, max_retries=MAX_RETRIES, **TINY_BACKOFF) as provider,  # type: ignore[arg-type]
        pytest.raises(ServerError, match=expected),
    ):
        provider.complete(make_request())


def test_bad_base_url_scheme_is_a_clear_error_without_retries() -> None:
    """The configuration refuses such a URL (test_config); a provider handed one anyway (a
    recorded config, a settings object built in code) still fails in one line, unretried."""
    settings = ModelSettings(api_key_env="")
    settings.base_url = "ftp://127.0.0.1:1/v1"  # a Struct's own checks run when it is made, not on assignment
    with (
        OpenAIProvider(settings) as provider,
        pytest.raises(ProviderError, match="baseUrl") as caught,
    ):
        provider.complete(make_request())
    assert "attempts" not in str(caught.value)


# -- cancellation and deadlines -------------------------------------------------------


def test_cancel_mid_stream_closes_the_connection(
    server: LLMServer, provider: OpenAIProvider
) -> None:
    server.script(text("word " * 40, chunks=40, chunk_delay_s=0.02))
    cancel = threading.Event()
    shown: list[str] = []

    def show(piece: str) -> None:
        shown.append(piece)
        if len(shown) == 2:
            cancel.set()

    with pytest.raises(Cancelled):
        provider.complete(make_request(), on_text=show, cancel=cancel)

    assert len(shown) == 2
    (request,) = server.requests
    assert server.wait_until(lambda: request.disconnected), (
        "the server kept writing to an open connection"
    )
    assert not request.completed


def test_cancel_during_backoff_wait(server: LLMServer) -> None:
    server.script(rate_limited(retry_after=10))
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    started = time.monotonic()
    with open_provider(server, retry_after_cap_s=20) as provider, pytest.raises(Cancelled):
        provider.complete(make_request(), cancel=cancel, timeout_s=30)
    assert time.monotonic() - started < QUICK_S
    assert len(server.requests) == 1


def test_cancel_set_before_the_call_sends_nothing(
    server: LLMServer, provider: OpenAIProvider
) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        provider.complete(make_request(), cancel=cancel)
    assert server.requests == []


def test_deadline_shorter_than_server_delay(server: LLMServer, provider: OpenAIProvider) -> None:
    server.script(text("late", delay_s=5))
    started = time.monotonic()
    with pytest.raises(ProviderTimeout, match="deadline of 0.3 s"):
        provider.complete(make_request(), timeout_s=0.3)
    assert time.monotonic() - started < QUICK_S
    assert len(server.requests) == 1


def test_deadline_while_a_slow_stream_trickles(server: LLMServer, provider: OpenAIProvider) -> None:
    server.script(text("slow " * 50, chunks=50, chunk_delay_s=0.05))
    started = time.monotonic()
    with pytest.raises(ProviderTimeout):
        provider.complete(make_request(), on_text=lambda _piece: None, timeout_s=0.4)
    assert time.monotonic() - started < QUICK_S


def test_retry_after_longer_than_deadline_fails_at_once(server: LLMServer) -> None:
    server.script(rate_limited(retry_after=20))
    started = time.monotonic()
    with (
        open_provider(server, retry_after_cap_s=60) as provider,
        pytest.raises(ProviderTimeout, match="429"),
    ):
        provider.complete(make_request(), timeout_s=2)
    assert time.monotonic() - started < QUICK_S


# -- pure machinery -------------------------------------------------------------------


@given(st.integers(min_value=0, max_value=20), st.integers(min_value=0, max_value=2**32))
def test_backoff_grows_and_stays_within_cap_and_jitter(retry_index: int, seed: int) -> None:
    policy = RetryPolicy(backoff_base_s=0.5, backoff_max_s=8.0, jitter_ratio=0.25)
    delay = policy.delay_s(retry_index, ServerError("x"), random.Random(seed))
    base = min(8.0, 0.5 * 2**retry_index)
    assert base <= delay <= base * 1.25


def test_retry_after_is_used_as_given_up_to_the_cap() -> None:
    policy = RetryPolicy(retry_after_cap_s=10)
    rng = random.Random(0)
    assert policy.delay_s(0, RateLimitError("x", retry_after_s=2.5), rng) == 2.5
    assert policy.delay_s(0, RateLimitError("x", retry_after_s=99), rng) == 10


def test_call_with_retries_counts_attempts() -> None:
    attempts: list[int] = []

    def flaky(index: int) -> str:
        attempts.append(index)
        if index < 2:
            raise ServerError("boom")
        return "ok"

    result = call_with_retries(
        flaky,
        policy=RetryPolicy(max_retries=3, backoff_base_s=0),
        deadline=Deadline(5),
        source="test",
    )
    assert (result, attempts) == ("ok", [0, 1, 2])


def test_deadline_with_fake_clock() -> None:
    now = [100.0]
    deadline = Deadline(2.0, clock=lambda: now[0])
    assert deadline.remaining() == 2.0 and not deadline.expired()
    now[0] = 102.5
    assert deadline.expired() and deadline.remaining() == 0.0
    with pytest.raises(ProviderTimeout):
        deadline.check("test")
    assert Deadline(None).remaining() == float("inf")


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:8080/v1", True),
        ("http://localhost:11434/v1", True),
        ("http://[::1]:8000/v1", True),
        ("http://192.168.1.20:1234/v1", True),
        ("http://gpu-box.local:8000/v1", True),
        ("https://api.openai.com/v1", False),
        ("https://api.anthropic.com", False),
        ("https://8.8.8.8/v1", False),
    ],
)
def test_local_servers_are_recognised(url: str, local: bool) -> None:
    assert is_local_url(url) is local


def test_api_key_comes_only_from_the_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOBA_TEST_KEY_A", "key-a")
    monkeypatch.delenv("SOBA_TEST_KEY_B", raising=False)
    assert read_api_key("SOBA_TEST_KEY_A", "https://api.openai.com/v1") == "key-a"
    assert read_api_key("SOBA_TEST_KEY_B", "http://127.0.0.1:1/v1") is None
    with pytest.raises(MissingApiKeyError, match="SOBA_TEST_KEY_B") as caught:
        read_api_key("SOBA_TEST_KEY_B", "https://api.openai.com/v1")
    assert "key-a" not in str(caught.value)


# -- SSE parsing ----------------------------------------------------------------------


def test_sse_events_names_multiline_data_comments_and_done() -> None:
    lines = [
        ": keep-alive",
        "event: message_start",
        'data: {"a":',
        "data: 1}",
        "",
        "data:no-space",
        "",
        "data: [DONE]",
    ]
    events = list(iter_sse_events(lines))
    assert [(event.event, event.data) for event in events] == [
        ("message_start", '{"a":\n1}'),
        ("message", "no-space"),
        ("message", "[DONE]"),
    ]
    assert events[-1].is_done and not events[0].is_done


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\r\n"))))
def test_sse_parser_never_crashes(lines: list[str]) -> None:
    for event in iter_sse_events(lines):
        assert isinstance(event.data, str)


# -- factory --------------------------------------------------------------------------


def test_factory_builds_the_named_provider() -> None:
    openai = make_provider(ModelSettings(provider="openai"))
    anthropic = make_provider(ModelSettings(provider="anthropic"), max_retries=1)
    try:
        assert isinstance(openai, OpenAIProvider)
        assert isinstance(anthropic, AnthropicProvider) and anthropic.policy.max_retries == 1
    finally:
        openai.close()
        anthropic.close()


def test_factory_builds_the_local_provider_lazily() -> None:
    """The embedded model is only loaded on first use, so building it is cheap."""
    if importlib.util.find_spec("soba_nb.providers.local") is None:
        pytest.skip("soba_nb.providers.local is not present")
    assert make_provider(ModelSettings(provider="local")).name == "local"


def test_factory_explains_the_local_extra_when_it_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda _name: None)
    with pytest.raises(ProviderError, match=r"soba-nb\[local\]"):
        make_provider(ModelSettings(provider="local"))
