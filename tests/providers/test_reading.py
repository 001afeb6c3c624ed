"""A local server reading a long prompt is not a stall (SPEC §17).

Before its first byte, a server on this machine or a private network gets 1 s per 40 prompt
tokens, never less than the idle limit; after the first byte, for a short prompt, and for a
public server, the idle limit of SPEC §12 holds. Against the real loopback server with a 1 s
idle limit, so a "long" prompt is a few hundred tokens; a public server is the same loopback
server reached under a public-looking name (a transport that stands in for DNS).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from llm_server import LLMServer, reset, text

from soba_nb.config import ModelSettings
from soba_nb.providers.base import ChatMessage, ModelRequest, ToolSchema
from soba_nb.providers.errors import ServerError, StalledError
from soba_nb.providers.feed import WAITING
from soba_nb.providers.openai import OpenAIProvider
from soba_nb.providers.reading import (
    LOCAL_READING_TOKENS_PER_S,
    is_private_server,
    prompt_tokens,
    reading_allowance_s,
)
from soba_nb.providers.waits import IDLE_SETTING, Silence

IDLE_S = 1.0
LONG_PROMPT_TOKENS = 160
"""4 s of reading allowance at 40 tokens a second: four idle limits."""
SHORT_PROMPT_TOKENS = 20
"""Half a second at 40 tokens a second: the idle limit holds."""
SLACK_S = 1.5
"""What a loaded CI machine may add to a bound."""
FAST = {"backoff_base_s": 0.01, "backoff_max_s": 0.02, "jitter_ratio": 0.0}
PUBLIC_URL = "http://models.example.com/v1"


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as running:
        yield running


def request(tokens: int | None) -> ModelRequest:
    return ModelRequest(
        system="s", messages=[ChatMessage(role="user", content="hi")], max_output_tokens=16, operation_id="op_1",
        input_tokens=tokens,
    )  # fmt: skip


def local(server: LLMServer, **options: float) -> OpenAIProvider:
    settings = ModelSettings(base_url=server.url, api_key_env="SOBA_TEST_UNSET_KEY")
    return OpenAIProvider(settings, **{"idle_timeout_s": IDLE_S, **FAST, **options})  # type: ignore[arg-type]


class ToLoopback(httpx.HTTPTransport):
    """Sends every request to the loopback server, whatever host its URL names: a public
    server's name, resolved by this instead of DNS."""

    def __init__(self, server: LLMServer):
        super().__init__()
        self.port = server.port

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.url = request.url.copy_with(scheme="http", host="127.0.0.1", port=self.port)
        return super().handle_request(request)


def timed(call) -> tuple[object, float]:
    started = time.monotonic()
    try:
        outcome: object = call()
    except Exception as exc:  # the test looks at which
        outcome = exc
    return outcome, time.monotonic() - started


# -- which servers are local ---------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:11434/v1", "http://127.8.9.10:8080/v1", "http://[::1]:8080/v1", "http://localhost:8080/v1",
        "http://LOCALHOST/v1", "http://10.1.2.3:4000", "http://172.16.0.1/v1", "http://172.31.255.254/v1",
        "https://192.168.1.20:8443/v1", "http://[fd12:3456::1]:8000/v1", "http://[fe80::1%25eth0]:8000/v1",
        "http://169.254.10.1/v1", "http://[::ffff:127.0.0.1]:8080/v1",
    ],
)  # fmt: skip
def test_loopback_private_and_link_local_addresses_are_local(url):
    assert is_private_server(url)


@pytest.mark.parametrize(
    "url",
    [
        "https://api.openai.com/v1", "https://api.anthropic.com", "http://8.8.8.8/v1", "http://172.32.0.1/v1",
        "http://11.0.0.1/v1", "http://100.64.0.1/v1", "http://[2001:db8::1]/v1", "http://ollama.lan:11434/v1",
        "http://litellm:4000", "http://localhost.example.com/v1", "http://127.0.0.1.nip.io/v1", "not a url",
    ],
)  # fmt: skip
def test_public_addresses_and_other_names_are_not_local(url):
    # Names are not resolved (a lookup may block for seconds): only `localhost` is taken as local.
    assert not is_private_server(url)


# -- the allowance -------------------------------------------------------------------------


def test_a_local_server_gets_one_second_per_40_prompt_tokens_and_never_less_than_the_idle_limit():
    assert LOCAL_READING_TOKENS_PER_S == 40
    assert reading_allowance_s(12_400, 60.0) == 310.0  # a laptop's 10,000-token session: minutes
    assert reading_allowance_s(2_000, 60.0) == 60.0  # a short prompt: the idle limit
    assert reading_allowance_s(0, 5.0) == 5.0


def test_the_prompt_is_the_request_s_own_count_else_its_text():
    assert prompt_tokens(request(12_400)) == 12_400
    uncounted = ModelRequest(
        system="x" * 400, messages=[ChatMessage(role="user", content="y" * 3_600)], max_output_tokens=16,
        operation_id="op_2", tools=[ToolSchema(name="python", description="z" * 400, parameters={})],
    )  # fmt: skip
    assert prompt_tokens(uncounted) == (400 + 3_600 + 400 + len("{}")) // 4  # a summary request carries no count


def test_the_silence_waits_for_the_allowance_before_the_first_byte_and_the_idle_limit_after():
    now = [0.0]
    silence = Silence(60.0, reading_s=310.0, reading_tokens=12_400, clock=lambda: now[0])
    now[0] = 300.0
    assert not silence.expired()
    assert silence.remaining() == 0.0  # no retry after minutes of reading: it would read it all again
    silence.progress()  # the first byte of the answer
    now[0] = 361.0
    assert silence.expired() and "for 60 s (mid-answer)" in str(silence.stalled("s", headers=True))
    short = Silence(60.0, reading_s=10.0, clock=lambda: now[0])
    now[0] = 422.0
    assert short.expired() and short.reading_s == 60.0


# -- end to end, against the loopback server ------------------------------------------------


def test_a_long_prompt_to_a_local_server_waits_past_the_idle_limit_and_completes(server):
    server.script(text("read it all", delay_s=2.5 * IDLE_S))
    statuses: list[str] = []
    with local(server) as provider:
        answer, took = timed(lambda: provider.complete(request(LONG_PROMPT_TOKENS), on_wait=statuses.append))
    assert getattr(answer, "text", answer) == "read it all"
    assert took > 2 * IDLE_S and len(server.requests) == 1
    assert set(statuses) == {f"the model is reading {LONG_PROMPT_TOKENS} tokens"}  # the cell's status line


def test_a_local_server_that_reads_past_its_allowance_stalls_there_and_is_not_asked_again(server):
    server.script(text("late", delay_s=30), text("late"))
    with local(server) as provider:
        error, took = timed(lambda: provider.complete(request(LONG_PROMPT_TOKENS)))
    allowance = LONG_PROMPT_TOKENS / LOCAL_READING_TOKENS_PER_S
    assert isinstance(error, StalledError)
    message = str(error)
    assert f"nothing of the answer came for {allowance:.0f} s (before the headers)" in message
    assert f"read {LONG_PROMPT_TOKENS:,} prompt tokens" in message and IDLE_SETTING in message and "\n" not in message
    assert allowance <= took < allowance + SLACK_S and len(server.requests) == 1


def test_a_short_prompt_to_a_local_server_still_stalls_at_the_idle_limit(server):
    server.script(text("late", delay_s=30))
    statuses: list[str] = []
    with local(server) as provider:
        error, took = timed(lambda: provider.complete(request(SHORT_PROMPT_TOKENS), on_wait=statuses.append))
    assert isinstance(error, StalledError) and f"came for {IDLE_S:g} s (before the headers)" in str(error)
    assert took < IDLE_S + SLACK_S and set(statuses) == {WAITING}


def test_a_stall_after_the_first_byte_of_a_long_prompt_ends_at_the_idle_limit(server):
    server.script(text("aabbccdd", chunks=4, delay_s=2 * IDLE_S, stall_after=2, stall_s=30))
    shown: list[str] = []
    with local(server) as provider:
        error, took = timed(lambda: provider.complete(request(LONG_PROMPT_TOKENS), on_text=shown.append))
    assert isinstance(error, StalledError) and f"came for {IDLE_S:g} s (mid-answer)" in str(error)
    assert "".join(shown) == "aabb"
    assert 2 * IDLE_S + IDLE_S <= took < 2 * IDLE_S + IDLE_S + SLACK_S  # the read, then one idle limit


def test_prompt_progress_ends_the_allowance_like_any_first_byte(server):
    # llama.cpp says how far it has read: after that, a silence of one idle limit is a stall.
    server.script(text("done", prompt_progress=(64, 128), prompt_progress_delay_s=0.1, chunk_delay_s=30))
    with local(server) as provider:
        error, took = timed(lambda: provider.complete(request(LONG_PROMPT_TOKENS)))
    assert isinstance(error, StalledError) and f"came for {IDLE_S:g} s (mid-answer)" in str(error)
    assert IDLE_S <= took < IDLE_S + SLACK_S


def test_a_failure_after_a_long_read_is_not_retried(server):
    # A dropped connection after two idle limits of reading: asking again would read it all again.
    failing = reset()
    failing.delay_s = 2 * IDLE_S
    server.script(failing, text("again"))
    with local(server, max_retries=3) as provider:
        error, took = timed(lambda: provider.complete(request(LONG_PROMPT_TOKENS)))
    assert isinstance(error, ServerError) and "not retried: the local server had been reading the prompt" in str(error)
    assert len(server.requests) == 1 and took < 2 * IDLE_S + SLACK_S


def test_a_public_server_keeps_the_idle_limit_for_a_long_prompt(server, monkeypatch):
    monkeypatch.setenv("SOBA_TEST_KEY", "sk-test-not-a-secret")
    server.script(text("late", delay_s=30))
    settings = ModelSettings(base_url=PUBLIC_URL, api_key_env="SOBA_TEST_KEY")
    statuses: list[str] = []
    with httpx.Client(transport=ToLoopback(server)) as client, OpenAIProvider(settings, client=client, idle_timeout_s=IDLE_S) as provider:
        error, took = timed(lambda: provider.complete(request(LONG_PROMPT_TOKENS), on_wait=statuses.append))
    assert isinstance(error, StalledError) and f"came for {IDLE_S:g} s (before the headers)" in str(error)
    assert took < IDLE_S + SLACK_S and set(statuses) == {WAITING}
    assert len(server.requests) == 1  # it did reach the (loopback) server
