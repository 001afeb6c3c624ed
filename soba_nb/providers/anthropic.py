"""Anthropic Messages API.

Differences from Chat Completions that shape this module: the system prompt is a
top-level field; tool calls are `tool_use` content blocks of the assistant message and
their results `tool_result` blocks of a *user* message (results of one batch go in one
user message, and messages of the same role are merged, since the API wants roles to
alternate); streams are named events, and the usage figures arrive in two parts
(input tokens in `message_start`, output tokens in `message_delta`).

Native continuation (beta `compact-2026-01-12`): a `compaction` block the provider made
(`soba_nb.providers.native_compactors`) is replayed in an assistant message at the start of the
conversation — the API ignores what comes before the block, so a one-line user message
opens the conversation as the API requires. Replaying the block needs the beta header and
a declared `compact_20260112` edit (the API refuses a compaction block whose strategy is not
declared); its trigger is set beyond the model's window so the provider never compacts on
its own: when to compact stays our barrier's decision.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from soba_nb.messages import ImagePart, image_label
from soba_nb.providers.base import (
    ChatMessage,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
    cached_part,
    token_figure,
)
from soba_nb.providers.classify import classify_stream_error
from soba_nb.providers.errors import IncompleteResponseError
from soba_nb.providers.http import HttpProvider
from soba_nb.providers.sse import ServerSentEvent
from soba_nb.providers.waits import TextSink, content_text
from soba_nb.transcript.entries import NativeContinuation

DEFAULT_ANTHROPIC_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
API_PREFIX = "/v1"

STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
}

ANTHROPIC_KIND = "anthropic.compact_20260112"
"""The native kind this API replays: a `compaction` content block."""
COMPACT_BETA = "compact-2026-01-12"
COMPACT_EDIT = "compact_20260112"
BETA_HEADER = "anthropic-beta"
MIN_COMPACT_TRIGGER_TOKENS = 50_000
"""The smallest `trigger.value` the API accepts for `compact_20260112` (documented)."""
REPLAY_OPENING = "(The earlier part of this conversation was compacted; its summary follows.)"

# Prompt-cache figures are part of the prompt: effective tokens count all of them.
INPUT_TOKEN_FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def normalise_stop_reason(reason: str) -> str:
    """end_turn → "stop", tool_use → "tool_calls", max_tokens → "length"; others unchanged."""
    return STOP_REASONS.get(reason, reason)


def input_tokens_from_wire(usage: Any) -> int | None:
    """The whole prompt size: uncached plus cache-written plus cache-read tokens."""
    if not isinstance(usage, dict) or token_figure(usage.get("input_tokens")) is None:
        return None
    figures = [token_figure(usage.get(name)) or 0 for name in INPUT_TOKEN_FIELDS]
    return token_figure(sum(figures))


CACHE_READ_FIELD = "cache_read_input_tokens"
"""The prompt tokens read from the cache (priced as cached input; `input_tokens` excludes them)."""


def cached_tokens_from_wire(usage: Any) -> int | None:
    """The cache-read part of the prompt, when the answer says."""
    if not isinstance(usage, dict) or (whole := input_tokens_from_wire(usage)) is None:
        return None
    return cached_part(usage, CACHE_READ_FIELD, whole)


def usage_from_wire(usage: Any) -> Usage | None:
    """A whole answer's `usage` → `Usage`; None when absent or malformed."""
    input_tokens = input_tokens_from_wire(usage)
    if input_tokens is None:
        return None
    return Usage(
        input_tokens=input_tokens,
        output_tokens=token_figure(usage.get("output_tokens")) or 0,
        cached_input_tokens=cached_tokens_from_wire(usage),
    )


NOT_GROWTH = ("type", "id")
"""Fields of a content block or delta that are bookkeeping, not content the model produced."""


def hidden_content(kind: str, payload: dict[str, Any]) -> str:
    """How much an event adds to the answer besides its shown text (`text_delta`, counted as it
    is shown): tool names and `input_json_delta` pieces, `thinking_delta`, a block's initial
    content. `ping` and the message's own events add nothing, so a stream of pings is a stall
    (`providers.waits`)."""
    if kind == "content_block_start":
        return content_text(payload.get("content_block"), skip=NOT_GROWTH)
    delta = payload.get("delta")
    if kind == "content_block_delta" and isinstance(delta, dict) and delta.get("type") != "text_delta":
        return content_text(delta, skip=NOT_GROWTH)
    return ""


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's JSON arguments as the object `tool_use.input` must be.

    Arguments the model produced that are not a JSON object are kept under "arguments"
    rather than dropped, so the model can see what it sent.
    """
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}


def message_blocks(message: ChatMessage) -> list[dict[str, Any]]:
    """The content blocks of one neutral message (empty text blocks are refused by the API)."""
    if message.role == "tool":
        images = message.sent_images()
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": message.tool_call_id or "",
            # The images a call displayed go inside its result, as image blocks (SPEC §10).
            "content": [{"type": "text", "text": message.content}, *map(_image_block, images)] if images else message.content,
        }
        if message.is_error:
            block["is_error"] = True
        return [block]
    blocks: list[dict[str, Any]] = []
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    if message.role == "user":
        # The user's own plots, beside the cells block that names them (SPEC §15).
        for part in message.sent_images():
            blocks += [{"type": "text", "text": image_label(part)}, _image_block(part)]
    for call in message.tool_calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": call.id,
                "name": call.name,
                "input": tool_input(call.arguments),
            }
        )
    return blocks


def _image_block(part: ImagePart) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": part.mime, "data": part.data}}


def native_messages(native: NativeContinuation | None) -> list[dict[str, Any]]:
    """The replayed compaction block (after a one-line opening), or nothing."""
    if native is None or native.kind != ANTHROPIC_KIND:
        return []
    return [
        {"role": "user", "content": [{"type": "text", "text": REPLAY_OPENING}]},
        {"role": "assistant", "content": [dict(native.payload)]},
    ]


def compact_edit(trigger_tokens: int, *, pause: bool) -> dict[str, Any]:
    """`context_management` declaring the `compact_20260112` edit."""
    edit: dict[str, Any] = {
        "type": COMPACT_EDIT,
        "trigger": {"type": "input_tokens", "value": max(trigger_tokens, MIN_COMPACT_TRIGGER_TOKENS)},
    }
    if pause:
        edit["pause_after_compaction"] = True
    return {"edits": [edit]}


def messages_to_wire(messages: list[ChatMessage], start: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Neutral messages → alternating user/assistant messages with content blocks.

    Tool results become user messages, so consecutive results (and a user message that
    follows them) merge into one user message, results first as the API requires. `start`:
    wire messages that come first (a replayed compaction), merged the same way.
    """
    wire: list[dict[str, Any]] = [{"role": m["role"], "content": list(m["content"])} for m in start or []]
    for message in messages:
        role = "assistant" if message.role == "assistant" else "user"
        blocks = message_blocks(message)
        if not blocks:
            continue
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)
        else:
            wire.append({"role": role, "content": blocks})
    return wire


@dataclass
class _Block:
    kind: str
    text: list[str] = field(default_factory=list)
    tool_id: str = ""
    tool_name: str = ""
    initial_input: Any = None


@dataclass
class _StreamState:
    blocks: dict[int, _Block] = field(default_factory=dict)
    stop_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int = 0
    cached_input_tokens: int | None = None
    model: str | None = None


class AnthropicProvider(HttpProvider):
    """Messages API over httpx; see `HttpProvider` for the constructor arguments."""

    name = "anthropic"
    default_base_url = DEFAULT_ANTHROPIC_BASE_URL

    def endpoint(self) -> str:
        # Accept a base URL given with or without the /v1 prefix.
        prefix = "" if self.base_url.endswith(API_PREFIX) else API_PREFIX
        return f"{self.base_url}{prefix}/messages"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def request_headers(self, request: ModelRequest) -> dict[str, str]:
        return {BETA_HEADER: COMPACT_BETA} if native_messages(request.native) else {}

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        replay = native_messages(request.native)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_output_tokens,
            "messages": messages_to_wire(request.messages, replay),
            "stream": request.stream,
        }
        if replay:
            # Declared so the block is accepted; beyond the window so it never fires.
            body["context_management"] = compact_edit(self.settings.context_window, pause=False)
        if request.system:
            body["system"] = request.system
        if request.tools:
            body["tools"] = [
                {
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.parameters,
                }
                for tool in request.tools
            ]
        return body

    def parse_answer(self, data: dict[str, Any]) -> ModelResponse:
        if data.get("type") == "error" or "error" in data:
            raise classify_stream_error(self.source, data)
        content = data.get("content")
        if not isinstance(content, list):
            raise self.bad_answer("no content", data)
        text: list[str] = []
        calls: list[ToolCall] = []
        for block in content:
            if not isinstance(block, dict):
                raise self.bad_answer("content block is not an object", data)
            if block.get("type") == "text":
                text.append(str(block.get("text", "")))
            elif block.get("type") == "tool_use":
                calls.append(
                    ToolCall(
                        id=str(block.get("id", "")),
                        name=str(block.get("name", "")),
                        arguments=json.dumps(block.get("input") or {}),
                    )
                )
        reason = data.get("stop_reason")
        if not isinstance(reason, str):
            raise IncompleteResponseError(f"{self.source}: answer has no stop reason")
        return ModelResponse(
            text="".join(text),
            tool_calls=calls,
            finish_reason=normalise_stop_reason(reason),
            usage=usage_from_wire(data.get("usage")),
            model=str(data.get("model") or self.model),
            provider=self.name,
        )

    def parse_stream(self, events: Iterator[ServerSentEvent], emit: TextSink) -> ModelResponse:
        state = _StreamState()
        emit.calls = lambda: _stream_calls(state)
        for event, payload in self.json_events(events, "stream event", until_done=False):
            kind = payload.get("type", event.event)
            if kind == "message_stop":
                break
            try:
                shown = self._apply_event(kind, payload, state)
            except (AttributeError, TypeError, ValueError) as exc:
                # A field of an unexpected type (a list where an object belongs, ...).
                raise self.bad_answer(f"malformed {kind} event: {exc}", payload) from None
            emit(shown)
            emit.grow(hidden_content(kind, payload))
        if state.stop_reason is None:
            raise IncompleteResponseError(f"{self.source}: the stream ended without a stop reason")
        return self._stream_result(state)

    def _apply_event(self, kind: str, payload: dict[str, Any], state: _StreamState) -> str:
        """Fold one event into the state; returns the answer text it adds (to show)."""
        if kind == "error":
            raise classify_stream_error(self.source, payload)
        if kind == "message_start":
            message = payload.get("message") or {}
            state.model = message.get("model") if isinstance(message.get("model"), str) else None
            state.input_tokens = input_tokens_from_wire(message.get("usage"))
            state.cached_input_tokens = cached_tokens_from_wire(message.get("usage"))
        elif kind == "content_block_start":
            block = payload.get("content_block") or {}
            state.blocks[int(payload.get("index", len(state.blocks)))] = _Block(
                kind=str(block.get("type", "")),
                text=[block["text"]]
                if isinstance(block.get("text"), str) and block["text"]
                else [],
                tool_id=str(block.get("id", "")),
                tool_name=str(block.get("name", "")),
                initial_input=block.get("input"),
            )
        elif kind == "content_block_delta":
            return self._apply_delta(payload, state)
        elif kind == "message_delta":
            delta = payload.get("delta") or {}
            if isinstance(delta.get("stop_reason"), str):
                state.stop_reason = delta["stop_reason"]
            usage = payload.get("usage") or {}
            if (output := token_figure(usage.get("output_tokens"))) is not None:
                state.output_tokens = output
            # Newer API versions repeat the (cumulative) input figures here.
            state.input_tokens = input_tokens_from_wire(usage) or state.input_tokens
            state.cached_input_tokens = cached_tokens_from_wire(usage) or state.cached_input_tokens
        return ""

    def _apply_delta(self, payload: dict[str, Any], state: _StreamState) -> str:
        block = state.blocks.get(int(payload.get("index", -1)))
        delta = payload.get("delta") or {}
        if block is None or not isinstance(delta, dict):
            raise self.bad_answer("delta for a block that was not started", payload)
        if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
            block.text.append(delta["text"])
            return str(delta["text"])
        if delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            block.text.append(delta["partial_json"])
        return ""

    def _stream_result(self, state: _StreamState) -> ModelResponse:
        text = [piece for _, block in sorted(state.blocks.items()) if block.kind == "text" for piece in block.text]
        calls = _stream_calls(state)
        usage = (
            None
            if state.input_tokens is None
            else Usage(
                input_tokens=state.input_tokens,
                output_tokens=state.output_tokens,
                cached_input_tokens=state.cached_input_tokens,
            )
        )
        return ModelResponse(
            text="".join(text),
            tool_calls=calls,
            finish_reason=normalise_stop_reason(state.stop_reason or ""),
            usage=usage,
            model=state.model or self.model,
            provider=self.name,
        )


def _stream_calls(state: _StreamState) -> list[ToolCall]:
    """The `tool_use` blocks of a stream so far, arguments as they came."""
    calls: list[ToolCall] = []
    for _index, block in sorted(state.blocks.items()):
        if block.kind == "tool_use":
            streamed = "".join(block.text)
            arguments = streamed or (json.dumps(block.initial_input) if block.initial_input else "{}")
            calls.append(ToolCall(id=block.tool_id, name=block.tool_name, arguments=arguments))
    return calls
