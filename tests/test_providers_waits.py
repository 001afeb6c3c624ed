"""Long waits end: a silent server, a stalled or endless stream, a cancel (SPEC §9).

Found under attack: a server that stalled before or after its headers took 484 s to fail
(4 × 120 s read timeouts), an endless stream 600 s, and a cancel waited for the next byte.
Now a silence longer than the idle limit ends the attempt (retried once), a stream of
keep-alive pings is a silence, and a cancel ends any wait within a second.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from llm_server import LLMServer, pings, text

from soba_nb.config import ModelSettings
from soba_nb.providers.anthropic import AnthropicProvider
from soba_nb.providers.base import ChatMessage, ModelRequest
from soba_nb.providers.errors import Cancelled, ProviderTimeout, StalledError
from soba_nb.providers.openai import OpenAIProvider

IDLE_S = 1.0
FAST = {"backoff_base_s": 0.01, "backoff_max_s": 0.02, "jitter_ratio": 0.0}
SLACK_S = 1.5
"""What a loaded CI machine may add to a bound."""


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as running:
        yield running


def request(stream: bool = True) -> ModelRequest:
    return ModelRequest(
        system="s", messages=[ChatMessage(role="user", content="hi")], max_output_tokens=16, operation_id="op_1", stream=stream
    )


def provider(server: LLMServer, kind: str = "openai") -> OpenAIProvider | AnthropicProvider:
    if kind == "anthropic":
        settings = ModelSettings(provider="anthropic", base_url=server.anthropic_url, api_key_env="SOBA_TEST_UNSET_KEY")
        return AnthropicProvider(settings, idle_timeout_s=IDLE_S, **FAST)
    return OpenAIProvider(ModelSettings(base_url=server.url, api_key_env="SOBA_TEST_UNSET_KEY"), idle_timeout_s=IDLE_S, **FAST)


def timed(call) -> tuple[BaseException | None, float]:
    started = time.monotonic()
    try:
        call()
    except BaseException as exc:  # the test looks at which
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [True, False])
def test_a_server_silent_before_its_headers_fails_after_two_idle_limits(server, kind, stream):
    server.script(*[text("late", delay_s=30)] * 4)
    with provider(server, kind) as p:
        error, took = timed(lambda: p.complete(request(stream)))
    assert isinstance(error, StalledError) and "no data from the server for 1 s" in str(error)
    assert "gave up after 2 attempts" in str(error)
    assert len(server.requests) == 2  # retried once, not four times
    assert took < 2 * IDLE_S + SLACK_S


def test_a_stream_that_stalls_after_its_headers_fails_after_the_idle_limit(server):
    # Headers and the first (empty) chunk come at once, then nothing.
    server.script(*[text("one two three four", chunks=4, chunk_delay_s=30)] * 2)
    with provider(server) as p:
        error, took = timed(lambda: p.complete(request()))
    assert isinstance(error, StalledError) and "gave up after 2 attempts" in str(error)
    assert len(server.requests) == 2 and took < 2 * IDLE_S + SLACK_S


def test_an_endless_stream_of_pings_is_a_stall(server):
    server.script(pings(0.1), pings(0.1))
    with provider(server) as p:
        error, took = timed(lambda: p.complete(request()))
    assert isinstance(error, StalledError)
    assert took < 2 * IDLE_S + SLACK_S


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
    slow = OpenAIProvider(ModelSettings(base_url=server.url, api_key_env="SOBA_TEST_UNSET_KEY"), idle_timeout_s=60)
    with slow as p:
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
