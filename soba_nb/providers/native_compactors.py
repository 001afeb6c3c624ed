"""Native compaction on the provider side (SPEC §5 item 2): `NativeCompactor` implementations.

Our barrier decides when to compact; these ask the provider for its own compaction of the
region the capsule replaces, through the provider's HTTP life cycle (key, `X-Soba-Operation:
compaction` headers, deadline, cancel, retries, error classification):

- OpenAI Responses: the standalone `POST /responses/compact` with the region as `input`;
  its `output` (the user messages, then one encrypted `compaction` item) replaces the
  region in later inputs, verbatim. Kind `openai.responses.compact`.
- Anthropic Messages: the region with the `compact_20260112` edit (beta `compact-2026-01-12`),
  `pause_after_compaction: true`, and a trigger at our soft limit, lowered to the size of
  the request so that it fires, never below the documented minimum of 50,000 input tokens
  (a smaller request is refused here without a call). The answer's `compaction` block is
  the item. Kind `anthropic.compact_20260112`.

Each request is checked against the session's spending cap before it leaves (`SpendCheck`),
and its usage figures go to `on_usage` (`operation: compaction`) whenever the provider
answered (our own counts, marked estimated, when the answer carries none). A provider that does not compact (no item in the answer, a null summary, the
request below its minimum) raises `NativeRefused`; after a request the server rejected (4xx: the model or
server does not offer the feature), this session stops asking, so a model without native
compaction costs one refused request, not one per compaction.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from soba_nb.compaction.native_continuation import (
    NativeRefused,
    NativeRequest,
    NativeTarget,
    UsageSink,
)
from soba_nb.providers.anthropic import (
    ANTHROPIC_KIND,
    BETA_HEADER,
    COMPACT_BETA,
    MIN_COMPACT_TRIGGER_TOKENS,
    AnthropicProvider,
    compact_edit,
)
from soba_nb.providers.anthropic import usage_from_wire as anthropic_usage
from soba_nb.providers.base import ModelRequest, Provider, SpendCheck, Usage
from soba_nb.providers.classify import classify_stream_error
from soba_nb.providers.errors import RequestRejectedError
from soba_nb.providers.responses import RESPONSES_KIND, ResponsesProvider, input_items
from soba_nb.providers.responses import usage_from_wire as responses_usage
from soba_nb.transcript.entries import NativeContinuation
from soba_nb.transcript.estimated import estimated_usage, tokens_of_chars

RESPONSES_COMPACTION_OBJECT = "response.compaction"
COMPACTION_ITEM = "compaction"
COMPACTION_BLOCK = "compaction"
CLOSING_USER_TURN = "(Context compaction point: the conversation continues after this.)"
"""Sent after a region that ends with an assistant message: the Messages API wants the last
turn to be the user's (some models refuse an assistant prefill)."""


class _Remembering:
    """Stops asking after the server rejected the feature once (a 4xx other than overflow)."""

    target: NativeTarget

    def __init__(self, spend_check: SpendCheck | None = None) -> None:
        self.rejected: str | None = None
        self.spend_check = spend_check

    def _check(self) -> None:
        if self.rejected is not None:
            raise NativeRefused(f"not asked again: the server rejected it earlier ({self.rejected})")

    def _remember(self, exc: RequestRejectedError) -> None:
        self.rejected = str(exc)

    def _check_spend(self, request: NativeRequest) -> None:
        if self.spend_check is not None:
            self.spend_check(
                ModelRequest(
                    system=request.system, messages=list(request.messages), max_output_tokens=request.max_output_tokens,
                    operation="compaction", operation_id=request.operation_id, input_tokens=request.input_tokens,
                )
            )

    def _report(self, usage: Usage | None, request: NativeRequest, answer: dict[str, Any], on_usage: UsageSink | None) -> None:
        if on_usage is None:
            return
        if usage is None:
            # No figures: priced from our own counts (SPEC §16): the request as counted, and
            # the answer by its length (an encrypted item is longer than its tokens: fail-closed).
            received = tokens_of_chars(len(json.dumps(answer, ensure_ascii=False)))
            on_usage(estimated_usage(
                request.input_tokens, received, provider=self.target.provider, model=self.target.model,
                operation_id=request.operation_id, operation="compaction",
            ))
            return
        on_usage(usage.entry(
            provider=self.target.provider, model=self.target.model, operation="compaction",
            operation_id=request.operation_id,
        ))


class ResponsesNative(_Remembering):
    """`POST /responses/compact` for a `ResponsesProvider`."""

    def __init__(self, provider: ResponsesProvider, spend_check: SpendCheck | None = None):
        super().__init__(spend_check)
        self.provider = provider
        self.target = NativeTarget(provider.name, provider.model, frozenset({RESPONSES_KIND}))

    def compact(
        self, request: NativeRequest, *, cancel: threading.Event, timeout_s: float, on_usage: UsageSink | None = None
    ) -> NativeContinuation:
        self._check()
        self._check_spend(request)
        body: dict[str, Any] = {
            "model": self.provider.model,
            "input": input_items(list(request.messages), request.native),
        }
        if request.system:
            body["instructions"] = request.system
        try:
            data = self.provider.post_json(
                self.provider.compact_endpoint(), body, operation="compaction",
                operation_id=request.operation_id, cancel=cancel, timeout_s=timeout_s,
            )
        except RequestRejectedError as exc:
            self._remember(exc)
            raise
        self._report(responses_usage(data.get("usage")), request, data, on_usage)
        if data.get("error"):
            raise classify_stream_error(self.provider.source, data)
        output = data.get("output")
        if data.get("object") != RESPONSES_COMPACTION_OBJECT or not isinstance(output, list):
            raise self.provider.bad_answer("not a response.compaction object", {"object": data.get("object")})
        items = [item for item in output if isinstance(item, dict)]
        if not any(item.get("type") == COMPACTION_ITEM and item.get("encrypted_content") for item in items):
            raise NativeRefused("the answer has no compaction item")
        return NativeContinuation(
            provider=self.target.provider, model=self.target.model, kind=RESPONSES_KIND, payload={"items": items}
        )


class AnthropicNative(_Remembering):
    """The `compact_20260112` edit with `pause_after_compaction` for an `AnthropicProvider`."""

    def __init__(self, provider: AnthropicProvider, spend_check: SpendCheck | None = None):
        super().__init__(spend_check)
        self.provider = provider
        self.target = NativeTarget(provider.name, provider.model, frozenset({ANTHROPIC_KIND}))

    def compact(
        self, request: NativeRequest, *, cancel: threading.Event, timeout_s: float, on_usage: UsageSink | None = None
    ) -> NativeContinuation:
        self._check()
        if request.input_tokens < MIN_COMPACT_TRIGGER_TOKENS:
            raise NativeRefused(
                f"the history to compact is about {request.input_tokens:,} tokens, below the provider's "
                f"minimum of {MIN_COMPACT_TRIGGER_TOKENS:,}"
            )
        self._check_spend(request)
        body = self.provider.build_body(
            ModelRequest(
                system=request.system,
                messages=list(request.messages),
                tools=list(request.tools),
                max_output_tokens=request.max_output_tokens,
                operation="compaction",
                operation_id=request.operation_id,
                stream=False,
                native=request.native,
            )
        )
        messages = body["messages"]
        if messages and messages[-1]["role"] == "assistant":
            messages.append({"role": "user", "content": [{"type": "text", "text": CLOSING_USER_TURN}]})
        body["context_management"] = compact_edit(min(request.soft_limit, request.input_tokens), pause=True)
        try:
            data = self.provider.post_json(
                self.provider.endpoint(), body, operation="compaction", operation_id=request.operation_id,
                headers={BETA_HEADER: COMPACT_BETA}, cancel=cancel, timeout_s=timeout_s,
            )
        except RequestRejectedError as exc:
            self._remember(exc)
            raise
        self._report(anthropic_usage(data.get("usage")), request, data, on_usage)
        if data.get("type") == "error" or data.get("error"):
            raise classify_stream_error(self.provider.source, data)
        content = data.get("content")
        blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
        block = next((b for b in blocks if b.get("type") == COMPACTION_BLOCK), None)
        if block is None:
            raise NativeRefused(f"the provider answered without compacting (stop_reason {data.get('stop_reason')!r})")
        if not isinstance(block.get("content"), str) or not block["content"]:
            raise NativeRefused("the provider's compaction produced no summary")
        return NativeContinuation(
            provider=self.target.provider, model=self.target.model, kind=ANTHROPIC_KIND, payload=block
        )


def native_compactor_for(
    provider: Provider, spend_check: SpendCheck | None = None
) -> ResponsesNative | AnthropicNative | None:
    """The native compaction a provider offers, or None (Chat Completions, local models)."""
    if isinstance(provider, ResponsesProvider):
        return ResponsesNative(provider, spend_check)
    if isinstance(provider, AnthropicProvider):
        return AnthropicNative(provider, spend_check)
    return None
