"""Provider faults: every way a server misbehaves ends in a clear error or a good answer,
within a bounded time.

Scenarios run against the loopback server through the real providers (each wire format,
Chat Completions, Anthropic Messages and Responses, where the fault is wire-specific), with
a 2 s idle limit; the figure is how many ended as they should and the worst time to a
clear error. Every wait ends at one idle limit, retries included (SPEC §12), so the worst time
is the idle limit and a little.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from llm_server import (
    LLMServer,
    Reply,
    empty_stream,
    endless,
    malformed,
    overflow,
    ping_events,
    pings,
    rate_limited,
    reset,
    server_error,
    stream_error,
    text,
    truncated,
)

from soba_nb.config import ModelSettings
from soba_nb.providers.anthropic import AnthropicProvider
from soba_nb.providers.base import ChatMessage, ModelRequest
from soba_nb.providers.errors import (
    BadResponseError,
    ContextOverflowError,
    IncompleteResponseError,
    ProviderError,
    RateLimitError,
    ServerError,
    StalledError,
)
from soba_nb.providers.openai import OpenAIProvider
from soba_nb.providers.responses import ResponsesProvider

IDLE_S = 2.0
RETRIES = 3
BACKOFF = {"backoff_base_s": 0.05, "backoff_max_s": 0.2, "jitter_ratio": 0.0, "retry_after_cap_s": 1.0}
WORST_CASE_BOUND_S = IDLE_S + 3
WIRES = ("openai", "anthropic", "responses")


@dataclass(frozen=True)
class Scenario:
    name: str
    replies: Callable[[], list[Reply]]
    expect: type[BaseException] | None
    """The error class a caller must get, or None for a good answer after retries."""
    stream: bool = True
    wires: tuple[str, ...] = WIRES
    """The wire formats the loopback server can play it in."""


SCENARIOS = [
    Scenario("stall before headers", lambda: [text("x", delay_s=60)] * 2, StalledError),
    Scenario("stall after headers", lambda: [text("a b c", chunks=3, chunk_delay_s=60)] * 2, StalledError),
    Scenario("endless keep-alive stream", lambda: [pings(0.1)] * 2, StalledError),
    Scenario("endless ping events or empty deltas", lambda: [ping_events(0.1)] * 2, StalledError, wires=WIRES[:2]),
    Scenario("answer streaming on past maxOutputTokens", lambda: [endless("word ")], None, wires=WIRES[:2]),
    Scenario("connection reset, then an answer", lambda: [reset(), reset(), text("ok")], None),
    Scenario("connection reset storm", lambda: [reset()] * 6, ServerError),
    Scenario("empty 200 stream", lambda: [empty_stream()] * 6, IncompleteResponseError),
    Scenario("empty 200 body", lambda: [empty_stream()] * 6, IncompleteResponseError, stream=False),
    Scenario("429 with Retry-After", lambda: [rate_limited(0.2), text("ok")], None),
    Scenario("429 without Retry-After", lambda: [rate_limited(None), text("ok")], None),
    Scenario("429 storm", lambda: [rate_limited(0.1)] * 6, RateLimitError),
    Scenario("5xx then answer", lambda: [server_error(502), server_error(503), text("ok")], None),
    Scenario("5xx storm", lambda: [server_error(500)] * 6, ServerError),
    Scenario("malformed SSE", lambda: [malformed()] * 2, BadResponseError),
    Scenario("malformed JSON body", lambda: [malformed()] * 2, BadResponseError, stream=False),
    Scenario("stream cut short", lambda: [truncated()] * 6, IncompleteResponseError),
    Scenario("error event in the stream", lambda: [stream_error({"error": {"message": "boom", "type": "server_error"}})] * 6, ServerError),
    Scenario("context overflow", lambda: [overflow()], ContextOverflowError),
]


def make(server: LLMServer, wire: str) -> OpenAIProvider | AnthropicProvider:
    options = {"idle_timeout_s": IDLE_S, "max_retries": RETRIES, **BACKOFF}
    if wire == "anthropic":
        settings = ModelSettings(provider="anthropic", base_url=server.anthropic_url, api_key_env="SOBA_TEST_UNSET_KEY")
        return AnthropicProvider(settings, **options)  # type: ignore[arg-type]
    if wire == "responses":
        settings = ModelSettings(base_url=server.url, api_key_env="SOBA_TEST_UNSET_KEY", api="responses")
        return ResponsesProvider(settings, **options)  # type: ignore[arg-type]
    return OpenAIProvider(ModelSettings(base_url=server.url, api_key_env="SOBA_TEST_UNSET_KEY"), **options)  # type: ignore[arg-type]


@pytest.mark.timeout(600)
def test_every_provider_fault_ends_clearly_and_in_bounded_time(figures):
    passed = total = 0
    worst = 0.0
    failures: list[str] = []
    for wire in WIRES:
        for scenario in (s for s in SCENARIOS if wire in s.wires):
            total += 1
            with LLMServer() as server, make(server, wire) as provider:
                server.script(*scenario.replies())
                request = ModelRequest(
                    system="s", messages=[ChatMessage(role="user", content="hi")], max_output_tokens=16,
                    operation_id="op_faults", stream=scenario.stream,
                )
                started = time.monotonic()
                try:
                    provider.complete(request, timeout_s=60)
                    outcome: BaseException | None = None
                except ProviderError as exc:
                    outcome = exc
                took = time.monotonic() - started
            ok = (outcome is None) if scenario.expect is None else isinstance(outcome, scenario.expect)
            one_line = outcome is None or ("\n" not in str(outcome) and str(outcome).startswith(provider.source))
            if ok and one_line and took <= WORST_CASE_BOUND_S:
                passed += 1
            else:
                failures.append(f"{wire} / {scenario.name}: {type(outcome).__name__}: {outcome} ({took:.1f} s)")
            if outcome is not None:
                worst = max(worst, took)
    figures.add(
        "provider faults",
        f"scenarios passed {passed}/{total} · worst time to a clear error {worst:.1f} s (idle limit {IDLE_S:g} s)",
    )
    assert failures == []
