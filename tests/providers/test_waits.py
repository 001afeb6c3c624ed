"""Every wait on a provider ends at the idle limit; a stream past maxOutputTokens is stopped.

SPEC §12. Against the real loopback server with real timing and a 1 s idle limit: a server
silent before its headers, one that stalls after them or mid-answer, a stream of keep-alives
(SSE comments, Anthropic `ping` events, empty OpenAI deltas), slow errors, a long Retry-After,
an answer that never ends — and a slow answer that keeps coming, which is not a wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from llm_server import LLMServer, endless, ping_events, pings, rate_limited, server_error, text

from soba_nb.config import ModelSettings
from soba_nb.providers.anthropic import AnthropicProvider
from soba_nb.providers.anthropic import hidden_content as anthropic_hidden
from soba_nb.providers.base import ChatMessage, ModelRequest
from soba_nb.providers.errors import (
    Cancelled,
    ProviderError,
    ProviderTimeout,
    RateLimitError,
    ServerError,
    StalledError,
)
from soba_nb.providers.openai import OpenAIProvider
from soba_nb.providers.output_count import OutputCount, stop_tokens
from soba_nb.providers.responses import ResponsesProvider
from soba_nb.providers.responses import hidden_content as responses_hidden
from soba_nb.providers.waits import (
    IDLE_SETTING,
    AnswerOverrun,
    Silence,
    TextSink,
    content_text,
)
from soba_nb.tokens import get_encoding

IDLE_S = 1.0
FAST = {"backoff_base_s": 0.01, "backoff_max_s": 0.02, "jitter_ratio": 0.0}
SLACK_S = 1.5
"""What a loaded CI machine may add to a bound."""
MAX_OUTPUT_TOKENS = 16
WIRES = ["openai", "anthropic", "responses"]

Provider = OpenAIProvider | AnthropicProvider | ResponsesProvider


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as running:
        yield running


def request(stream: bool = True) -> ModelRequest:
    return ModelRequest(
        system="s",
        messages=[ChatMessage(role="user", content="hi")],
        max_output_tokens=MAX_OUTPUT_TOKENS,
        operation_id="op_1",
        stream=stream,
    )


def provider(server: LLMServer, kind: str = "openai", **options: float) -> Provider:
    options = {"idle_timeout_s": IDLE_S, **FAST, **options}
    if kind == "anthropic":
        settings = ModelSettings(provider="anthropic", base_url=server.anthropic_url, api_key_env="SOBA_TEST_UNSET_KEY")
        return AnthropicProvider(settings, **options)  # type: ignore[arg-type]
    if kind == "responses":
        settings = ModelSettings(base_url=server.url, api_key_env="SOBA_TEST_UNSET_KEY", api="responses")
        return ResponsesProvider(settings, **options)  # type: ignore[arg-type]
    return OpenAIProvider(ModelSettings(base_url=server.url, api_key_env="SOBA_TEST_UNSET_KEY"), **options)  # type: ignore[arg-type]


def timed(call) -> tuple[BaseException | None, float]:
    started = time.monotonic()
    try:
        call()
    except BaseException as exc:  # the test looks at which
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


def assert_stalled(error: BaseException | None, where: str) -> None:
    assert isinstance(error, StalledError), error
    message = str(error)
    assert f"nothing of the answer came for {IDLE_S:g} s ({where}" in message
    assert IDLE_SETTING in message and "\n" not in message


# -- (a) before the headers: one idle limit, retries included --------------------------


@pytest.mark.parametrize("kind", WIRES)
@pytest.mark.parametrize("stream", [True, False])
def test_a_server_silent_before_its_headers_fails_at_one_idle_limit_not_retried(server, kind, stream):
    server.script(*[text("late", delay_s=30)] * 4)
    with provider(server, kind) as p:
        error, took = timed(lambda: p.complete(request(stream)))
    assert_stalled(error, "before the headers")
    assert len(server.requests) == 1  # a retry would start a second wait of the same length
    assert took < IDLE_S + SLACK_S


def test_slow_server_errors_are_retried_only_within_the_same_wait(server):
    # Each 503 comes just before the idle limit: four of them used to take four idle limits.
    slow = server_error(503)
    slow.delay_s = 0.9 * IDLE_S
    server.script(*[slow] * 6)
    with provider(server, max_retries=3) as p:
        error, took = timed(lambda: p.complete(request()))
    assert isinstance(error, ProviderError)
    assert len(server.requests) <= 2
    assert took < IDLE_S + SLACK_S


def test_a_retry_after_longer_than_what_is_left_of_the_wait_is_not_waited_for(server):
    server.script(rate_limited(retry_after=5), text("too late"))
    with provider(server, retry_after_cap_s=10) as p:
        error, took = timed(lambda: p.complete(request()))
    assert isinstance(error, RateLimitError)
    assert f"not retried: a 5.0 s wait would pass the idle limit of {IDLE_S:g} s, {IDLE_SETTING}" in str(error)
    assert took < SLACK_S and len(server.requests) == 1


def test_a_short_retry_after_is_still_honoured_inside_the_wait(server):
    server.script(rate_limited(retry_after=0.3), text("done"))
    with provider(server, retry_after_cap_s=10) as p:
        assert p.complete(request()).text == "done"
    assert len(server.requests) == 2


def test_a_connect_timeout_is_retried_on_a_new_connection_inside_the_wait():
    # Only the connection failed (not the idle limit): a fresh one may work, so it is retried.
    tries: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        tries.append(request)
        raise httpx.ConnectTimeout("connect timed out", request=request)

    settings = ModelSettings(base_url="http://127.0.0.1:9/v1", api_key_env="SOBA_TEST_UNSET_KEY")
    client = httpx.Client(transport=httpx.MockTransport(refuse))
    with OpenAIProvider(settings, client=client, idle_timeout_s=IDLE_S, max_retries=2, **FAST) as p:
        error, took = timed(lambda: p.complete(request()))
    client.close()
    assert isinstance(error, ServerError) and "no connection within" in str(error)
    assert "gave up after 3 attempts" in str(error) and len(tries) == 3 and took < SLACK_S


# -- (b) keep-alives are not the answer growing -------------------------------------------


@pytest.mark.parametrize("kind", WIRES)
def test_an_endless_stream_of_comment_pings_is_a_stall(server, kind):
    server.script(pings(0.05), pings(0.05))
    with provider(server, kind) as p:
        error, took = timed(lambda: p.complete(request()))
    assert_stalled(error, "after the headers, only pings or empty events")
    assert len(server.requests) == 1 and took < IDLE_S + SLACK_S


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_an_endless_stream_of_ping_events_or_empty_deltas_is_a_stall(server, kind):
    # Anthropic sends real `event: ping` events; an OpenAI-style server could send empty deltas.
    server.script(ping_events(0.05), ping_events(0.05))
    with provider(server, kind) as p:
        error, took = timed(lambda: p.complete(request()))
    assert_stalled(error, "after the headers, only pings or empty events")
    assert len(server.requests) == 1 and took < IDLE_S + SLACK_S


# -- (c) after the headers and mid-answer ---------------------------------------------------


def test_a_stream_that_stalls_after_its_headers_fails_at_the_idle_limit(server):
    # Headers and the first (empty) chunk come at once, then nothing.
    server.script(*[text("one two three four", chunks=4, chunk_delay_s=30)] * 2)
    with provider(server) as p:
        error, took = timed(lambda: p.complete(request()))
    assert_stalled(error, "after the headers")
    assert len(server.requests) == 1 and took < IDLE_S + SLACK_S


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_stream_that_stalls_mid_answer_fails_one_idle_limit_after_its_last_piece(server, kind):
    server.script(text("aabbccdd", chunks=4, stall_after=2, stall_s=30))
    shown: list[str] = []
    with provider(server, kind) as p:
        error, took = timed(lambda: p.complete(request(), on_text=shown.append))
    assert_stalled(error, "mid-answer")
    assert "".join(shown) == "aabb"
    assert IDLE_S <= took < IDLE_S + SLACK_S


@pytest.mark.parametrize("kind", WIRES)
def test_a_slow_answer_that_keeps_coming_is_progress_not_a_wait(server, kind):
    # 8 pieces 0.35 s apart: nearly three idle limits in all, never one without a piece.
    words = "a slow local model streams on "
    server.script(text(words, chunks=8, chunk_delay_s=0.35))
    with provider(server, kind) as p:
        started = time.monotonic()
        answer = p.complete(request())
        took = time.monotonic() - started
    assert answer.text == words and answer.finish_reason == "stop"
    assert took > 2 * IDLE_S


def test_a_long_prompt_computed_chunk_by_chunk_is_progress_not_a_wait(server):
    """A server that says how far it has computed the prompt (llama.cpp's `prompt_progress`,
    and the embedded engine's) is working: three idle limits of prompt before the first word."""
    server.script(text("done", prompt_progress=tuple(range(512, 4608, 512)), prompt_progress_delay_s=0.35))
    with provider(server) as p:
        started = time.monotonic()
        answer = p.complete(request())
        took = time.monotonic() - started
    assert answer.text == "done" and took > 2 * IDLE_S


def test_a_prompt_progress_that_does_not_move_is_a_stall(server):
    """A figure repeated (or going back) is a keep-alive, not progress."""
    server.script(text("never", prompt_progress=(512,) * 12, prompt_progress_delay_s=0.25))
    with provider(server) as p:
        started = time.monotonic()
        with pytest.raises(StalledError) as caught:
            p.complete(request())
        took = time.monotonic() - started
    assert "nothing of the answer came" in str(caught.value)
    assert IDLE_S <= took < IDLE_S + SLACK_S


# -- (d) an answer that streams on past maxOutputTokens -------------------------------------


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_an_endless_answer_is_stopped_past_max_output_tokens_with_finish_length(server, kind):
    server.script(endless("word ", interval_s=0.001))
    shown: list[str] = []
    with provider(server, kind) as p:
        started = time.monotonic()
        answer = p.complete(request(), on_text=shown.append)
        took = time.monotonic() - started
    assert answer.finish_reason == "length" and answer.tool_calls == []
    assert answer.text == "".join(shown)  # what was shown is kept, nothing more
    tokens = len(get_encoding("o200k_base").encode_ordinary(answer.text))
    assert stop_tokens(MAX_OUTPUT_TOKENS) < tokens <= stop_tokens(MAX_OUTPUT_TOKENS) + 70  # stopped there, in tokens
    assert answer.stopped_at_tokens is not None and answer.stopped_at_tokens > stop_tokens(MAX_OUTPUT_TOKENS)
    assert took < SLACK_S + IDLE_S
    assert server.wait_until(lambda: server.requests[0].disconnected, timeout_s=5)  # the stream was closed


def test_an_answer_within_max_output_tokens_is_never_stopped(server):
    within = "word " * MAX_OUTPUT_TOKENS  # a whole limit's worth of tokens
    server.script(text(within, chunks=16))
    with provider(server) as p:
        answer = p.complete(request())
    assert answer.text == within and answer.finish_reason == "stop"


def test_a_non_streamed_answer_is_never_stopped_at_the_limit(server):
    long = "y " * (stop_tokens(MAX_OUTPUT_TOKENS) * 2)
    server.script(text(long))
    with provider(server) as p:
        answer = p.complete(request(stream=False))
    assert answer.text == long and answer.finish_reason == "stop"


# -- the deadline and cancel still end any wait ---------------------------------------------


def test_a_deadline_shorter_than_the_idle_limit_wins(server):
    server.script(text("late", delay_s=30))
    with provider(server) as p:
        error, took = timed(lambda: p.complete(request(), timeout_s=0.5))
    assert isinstance(error, ProviderTimeout) and took < 0.5 + SLACK_S


@pytest.mark.parametrize("where", ["before the headers", "mid-stream"])
def test_a_cancel_ends_the_wait_within_a_second(server, where):
    if where == "before the headers":
        server.script(text("late", delay_s=30))
    else:
        server.script(text("one two three", chunks=3, chunk_delay_s=30))
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    with provider(server, idle_timeout_s=60) as p:
        error, took = timed(lambda: p.complete(request(), cancel=cancel))
    assert isinstance(error, Cancelled)
    assert took < 0.3 + 1.0


def test_answers_still_stream_whole(server):
    server.script(text("Hello there, all of it.", chunks=6, chunk_delay_s=0.05), text("plain", usage=True))
    shown: list[str] = []
    with provider(server) as p:
        assert p.complete(request(), on_text=shown.append).text == "Hello there, all of it."
        assert "".join(shown) == "Hello there, all of it."
        assert p.complete(request(stream=False)).text == "plain"


# -- the pieces, without a server -------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_silence_clock_is_reset_only_by_progress():
    clock = FakeClock()
    silence = Silence(10, clock=clock)
    clock.now = 6
    silence.heard()  # a ping: the clock runs on
    assert silence.remaining() == 4 and not silence.expired()
    silence.progress()
    clock.now = 15
    assert silence.remaining() == 1 and silence.keepalives == 0
    clock.now = 16.5
    assert silence.expired() and silence.remaining() == 0


def test_the_sink_grows_the_answer_and_stops_it_clearly_past_the_limit():
    clock = FakeClock()
    silence = Silence(10, clock=clock)
    shown: list[str] = []
    sink = TextSink(shown.append, silence=silence, count=OutputCount(MAX_OUTPUT_TOKENS, "openai", "gpt-4o"))
    clock.now = 9
    sink.grow("")  # an empty delta is no progress
    assert silence.remaining() == 1
    sink("abc")
    assert silence.remaining() == 10 and sink.delivered and shown == ["abc"]
    sink.grow(" x" * (stop_tokens(MAX_OUTPUT_TOKENS) - 1))  # within the stopping point: still fine
    with pytest.raises(AnswerOverrun):
        sink(" d" * 200)
    assert sink.shown == ["abc", " d" * 200]  # what was shown before stopping is kept


def test_only_content_counts_as_growth_in_each_wire_format():
    assert content_text({"role": "assistant", "content": ""}, skip=("role", "content")) == ""
    assert content_text({"reasoning_content": "think"}, skip=("role", "content")) == "think"
    tool = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}
    assert sorted(content_text(tool, skip=("role", "content", "type", "id", "index"))) == sorted("ls{}")
    assert anthropic_hidden("ping", {"type": "ping"}) == ""
    assert anthropic_hidden("content_block_delta", {"delta": {"type": "text_delta", "text": "hi"}}) == ""
    assert anthropic_hidden("content_block_delta", {"delta": {"type": "thinking_delta", "thinking": "hm"}}) == "hm"
    assert anthropic_hidden("content_block_delta", {"delta": {"type": "input_json_delta", "partial_json": '{"a'}}) == '{"a'
    assert responses_hidden("response.in_progress", {"response": {"status": "in_progress"}}) == ""
    assert responses_hidden("response.output_text.delta", {"delta": "hi"}) == ""
    assert responses_hidden("response.reasoning_summary_text.delta", {"delta": "why"}) == "why"
    assert responses_hidden("response.function_call_arguments.delta", {"delta": '{"p'}) == '{"p'


def test_content_of_any_depth_is_counted_without_recursion():
    nested: object = "abc"
    for _ in range(5000):
        nested = {"x": [nested]}
    assert content_text(nested) == "abc"
