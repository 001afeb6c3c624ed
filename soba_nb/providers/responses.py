"""OpenAI Responses API (`model.api: "responses"`): `POST /v1/responses`, stateless.

What shapes this module, against Chat Completions (`openai.py`):
- the system prompt is `instructions`; the history is a list of input *items*: messages,
  `function_call` items (one per call) and `function_call_output` items (`call_id`);
- function tools are flat (`{"type": "function", "name", "parameters"}`) and strict by
  default in this API, which our schemas are not written for, so `strict: false` is sent;
- `store: false`: nothing is kept server-side, every request carries the whole input
  (stateless chaining), which is also what native compaction items need;
- streams are named events (`response.output_text.delta`, `response.output_item.done`,
  `response.completed` with the usage, `response.incomplete`, `response.failed`, `error`);
  a stream that ends before `response.completed` / `response.incomplete` is a failure.
A native continuation made by `/responses/compact` (`soba_nb.providers.native_compactors`) is replayed
verbatim at the start of `input`: its user messages and its encrypted compaction item.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from soba_nb.messages import IMAGES_LABEL, ImagePart, image_label
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
from soba_nb.providers.openai import DEFAULT_OPENAI_BASE_URL, arguments_text
from soba_nb.providers.sse import ServerSentEvent
from soba_nb.providers.waits import TextSink, content_text
from soba_nb.transcript.entries import NativeContinuation

RESPONSES_PATH = "/responses"
COMPACT_PATH = "/responses/compact"
RESPONSES_KIND = "openai.responses.compact"
"""The native kind this API replays: the output window of `POST /responses/compact`."""

INCOMPLETE_REASONS = {"max_output_tokens": "length"}
"""`incomplete_details.reason` → our finish reason (others are kept as they are)."""
ENDED = ("response.completed", "response.incomplete")
TEXT_DELTA = "response.output_text.delta"
DELTA_SUFFIX = ".delta"


def hidden_content(kind: str, payload: dict[str, Any]) -> str:
    """How much an event adds to the answer besides its shown text (counted as it is shown):
    every other `*.delta` (function-call arguments, reasoning text) and a new call's name.
    Status events (`response.in_progress`, ...) add nothing, so a stream of them is a stall
    (`providers.waits`)."""
    if kind.endswith(DELTA_SUFFIX) and kind != TEXT_DELTA:
        return content_text(payload.get("delta"))
    item = payload.get("item")
    if kind == "response.output_item.added" and isinstance(item, dict):
        return content_text(item.get("name"))
    return ""


def message_items(message: ChatMessage) -> list[dict[str, Any]]:
    """One neutral message as Responses input items."""
    if message.role == "tool":
        return [{"type": "function_call_output", "call_id": message.tool_call_id or "", "output": message.content}]
    items: list[dict[str, Any]] = []
    images = message.sent_images()
    if message.role == "user" and images:
        # The user's own plots, beside the cells block that names them (SPEC §15).
        content = [{"type": "input_text", "text": message.content}, *_image_parts(images)]
        return [{"type": "message", "role": "user", "content": content}]
    if message.content or not message.tool_calls:
        items.append({"type": "message", "role": message.role, "content": message.content})
    items += [
        {"type": "function_call", "call_id": call.id, "name": call.name, "arguments": call.arguments}
        for call in message.tool_calls
    ]
    return items


def native_items(native: NativeContinuation | None) -> list[dict[str, Any]]:
    """The replayed output window of a compaction (nothing for another kind)."""
    if native is None or native.kind != RESPONSES_KIND:
        return []
    items = native.payload.get("items")
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def input_items(request_messages: list[ChatMessage], native: NativeContinuation | None) -> list[dict[str, Any]]:
    """The whole `input`: the native window first, then the messages. The images of a run of
    tool results follow it as one user message of `input_image` items (SPEC §10)."""
    items = native_items(native)
    pending: list[ImagePart] = []
    for message in request_messages:
        if message.role != "tool" and pending:
            items.append(_images_item(pending))
            pending = []
        items += message_items(message)
        if message.role == "tool":
            pending += message.sent_images()
    if pending:
        items.append(_images_item(pending))
    return items


def _images_item(parts: list[ImagePart]) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": IMAGES_LABEL}, *_image_parts(parts)]}


def _image_parts(parts: list[ImagePart]) -> list[dict[str, Any]]:
    """Each image as an `input_text` naming it and an `input_image` holding a `data:` URL."""
    content: list[dict[str, Any]] = []
    for part in parts:
        content.append({"type": "input_text", "text": image_label(part)})
        content.append({"type": "input_image", "image_url": part.data_url(), "detail": "auto"})
    return content


def usage_from_wire(usage: Any) -> Usage | None:
    """`{"input_tokens", "output_tokens", "input_tokens_details": {"cached_tokens"}}` → `Usage`
    (the input figure includes the cached part); None when absent or malformed."""
    input_tokens = token_figure(usage.get("input_tokens")) if isinstance(usage, dict) else None
    if input_tokens is None:
        return None
    return Usage(
        input_tokens=input_tokens,
        output_tokens=token_figure(usage.get("output_tokens")) or 0,
        cached_input_tokens=cached_part(usage.get("input_tokens_details"), "cached_tokens", input_tokens),
    )


def output_text(item: dict[str, Any]) -> str:
    """The text of an output `message` item (its `output_text` parts)."""
    parts = item.get("content")
    if not isinstance(parts, list):
        return ""
    return "".join(
        str(part.get("text", "")) for part in parts if isinstance(part, dict) and part.get("type") == "output_text"
    )


def output_call(item: dict[str, Any], position: int) -> ToolCall:
    return ToolCall(
        id=str(item.get("call_id") or item.get("id") or f"call_{position}"),
        name=str(item.get("name") or ""),
        arguments=arguments_text(item.get("arguments")) or "{}",
    )


def finish_reason(response: dict[str, Any], has_calls: bool) -> str | None:
    """`completed` → "stop" / "tool_calls"; `incomplete` → "length" for the output limit;
    None for any other status (not finished)."""
    status = response.get("status")
    if status == "completed":
        return "tool_calls" if has_calls else "stop"
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return INCOMPLETE_REASONS.get(str(reason), str(reason or "incomplete"))
    return None


@dataclass
class _PartialCall:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    done: str | None = None
    """The whole arguments, once `output_item.done` or `arguments.done` gave them."""


@dataclass
class _StreamState:
    text: list[str] = field(default_factory=list)
    calls: dict[int, _PartialCall] = field(default_factory=dict)
    response: dict[str, Any] | None = None
    """The final response object (`response.completed` / `response.incomplete`)."""
    model: str | None = None

    def call(self, payload: dict[str, Any]) -> _PartialCall:
        index = payload.get("output_index")
        return self.calls.setdefault(int(index) if isinstance(index, int) else len(self.calls), _PartialCall())

    def tool_calls(self) -> list[ToolCall]:
        return [
            ToolCall(
                id=call.call_id or f"call_{index}",
                name=call.name,
                arguments=(call.done if call.done is not None else "".join(call.arguments)) or "{}",
            )
            for index, call in sorted(self.calls.items())
        ]


class ResponsesProvider(HttpProvider):
    """The Responses API over httpx; see `HttpProvider` for the constructor arguments."""

    name = "openai"
    default_base_url = DEFAULT_OPENAI_BASE_URL

    def endpoint(self) -> str:
        return f"{self.base_url}{RESPONSES_PATH}"

    def compact_endpoint(self) -> str:
        return f"{self.base_url}{COMPACT_PATH}"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "input": input_items(request.messages, request.native),
            "max_output_tokens": request.max_output_tokens,
            "stream": request.stream,
            "store": False,
        }
        if request.system:
            body["instructions"] = request.system
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                    "strict": False,
                }
                for tool in request.tools
            ]
        return body

    def parse_answer(self, data: dict[str, Any]) -> ModelResponse:
        if data.get("error"):
            raise classify_stream_error(self.source, data)
        output = data.get("output")
        if not isinstance(output, list):
            raise self.bad_answer("no output", data)
        text: list[str] = []
        calls: list[ToolCall] = []
        for position, item in enumerate(output):
            if not isinstance(item, dict):
                raise self.bad_answer("output item is not an object", data)
            if item.get("type") == "message":
                text.append(output_text(item))
            elif item.get("type") == "function_call":
                calls.append(output_call(item, position))
        reason = finish_reason(data, bool(calls))
        if reason is None:
            raise IncompleteResponseError(f"{self.source}: answer has status {data.get('status')!r}, not completed")
        return ModelResponse(
            text="".join(text),
            tool_calls=calls,
            finish_reason=reason,
            usage=usage_from_wire(data.get("usage")),
            model=str(data.get("model") or self.model),
            provider=self.name,
        )

    def parse_stream(self, events: Iterator[ServerSentEvent], emit: TextSink) -> ModelResponse:
        state = _StreamState()
        emit.calls = state.tool_calls
        for event, payload in self.json_events(events, "stream event"):
            kind = str(payload.get("type", event.event))
            try:
                emit(self._apply_event(kind, payload, state))
            except (AttributeError, TypeError, ValueError) as exc:
                # A field of an unexpected type (a list where an object belongs, ...).
                raise self.bad_answer(f"malformed {kind} event: {exc}", payload) from None
            emit.grow(hidden_content(kind, payload))
            if kind in ENDED:
                break
        if state.response is None:
            raise IncompleteResponseError(f"{self.source}: the stream ended before response.completed")
        return self._stream_result(state, emit)

    def _apply_event(self, kind: str, payload: dict[str, Any], state: _StreamState) -> str:
        """Fold one event into the state; returns the answer text it adds (to show)."""
        if kind == "error":
            raise classify_stream_error(self.source, payload)
        if kind == "response.failed":
            response = payload.get("response") or {}
            raise classify_stream_error(self.source, {"error": response.get("error") or {"message": "response failed"}})
        if kind in ("response.created", "response.in_progress") or kind in ENDED:
            response = payload.get("response") or {}
            state.model = response.get("model") if isinstance(response.get("model"), str) else state.model
            if kind in ENDED:
                state.response = response
        elif kind == TEXT_DELTA:
            delta = payload.get("delta")
            if isinstance(delta, str) and delta:
                state.text.append(delta)
                return delta
        elif kind in ("response.output_item.added", "response.output_item.done"):
            item = payload.get("item") or {}
            if item.get("type") == "function_call":
                call = state.call(payload)
                call.call_id = call.call_id or str(item.get("call_id") or "")
                call.name = call.name or str(item.get("name") or "")
                if kind == "response.output_item.done" and isinstance(item.get("arguments"), str):
                    call.done = item["arguments"]
        elif kind == "response.function_call_arguments.delta":
            delta = payload.get("delta")
            if isinstance(delta, str):
                state.call(payload).arguments.append(delta)
        elif kind == "response.function_call_arguments.done" and isinstance(payload.get("arguments"), str):
            state.call(payload).done = payload["arguments"]
        return ""

    def _stream_result(self, state: _StreamState, emit: TextSink) -> ModelResponse:
        response = state.response or {}
        calls = state.tool_calls()
        output = response.get("output")
        if isinstance(output, list):
            # A server that sends only the final object (no deltas): its output is the answer.
            items = [item for item in output if isinstance(item, dict)]
            if not state.text:
                text = "".join(output_text(item) for item in items if item.get("type") == "message")
                state.text.append(text)
                emit(text)
            if not calls:
                calls = [output_call(item, n) for n, item in enumerate(items) if item.get("type") == "function_call"]
        reason = finish_reason(response, bool(calls))
        if reason is None:
            raise IncompleteResponseError(f"{self.source}: the stream ended with status {response.get('status')!r}")
        return ModelResponse(
            text="".join(state.text),
            tool_calls=calls,
            finish_reason=reason,
            usage=usage_from_wire(response.get("usage")),
            model=state.model or self.model,
            provider=self.name,
        )
