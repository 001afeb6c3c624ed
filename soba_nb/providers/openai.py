"""OpenAI-compatible Chat Completions: OpenAI, Ollama, llama.cpp server, vLLM, LM Studio.

One wire format, many servers, chosen by `ModelSettings.base_url` (default OpenAI's
public API). Streams are requested with `stream_options.include_usage` so the final
chunk carries the usage figures (SPEC §2 `provider_usage`); servers that ignore it
simply give no usage. Tool-call arguments arrive as string fragments keyed by the
call's `index` and are assembled here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

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
from soba_nb.providers.sse import ServerSentEvent
from soba_nb.providers.waits import TextSink, content_text

DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
OPENAI_HOST = "api.openai.com"

MAX_TOKENS_FIELD = "max_tokens"
"""What OpenAI-compatible servers (Ollama, llama.cpp, vLLM, LM Studio) read."""
MAX_COMPLETION_TOKENS_FIELD = "max_completion_tokens"
"""What OpenAI's own API wants: its reasoning models refuse `max_tokens`."""

NOT_GROWTH = ("role", "content", "type", "id", "index")
"""Delta fields that are not content the model produced: the role, the shown text (counted as
it is shown), and the bookkeeping of a tool call. Anything else with text in it — tool-call
names and arguments, `reasoning_content` / `reasoning` (llama.cpp, vLLM, Ollama, LM Studio), a
refusal — grows the answer (`providers.waits`); an empty delta does not."""

FINISH_REASONS = {
    "stop": "stop",
    "eos": "stop",
    "end_turn": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "max_tokens": "length",
}


def normalise_finish_reason(reason: str, has_tool_calls: bool) -> str:
    """Map a server's finish reason to "stop" / "tool_calls" / "length" (others unchanged).

    Some servers (older Ollama, some llama.cpp templates) say "stop" after a tool call;
    the calls are what matter, so that is "tool_calls".
    """
    normalised = FINISH_REASONS.get(reason, reason)
    if normalised == "stop" and has_tool_calls:
        return "tool_calls"
    return normalised


def message_to_wire(message: ChatMessage) -> dict[str, Any]:
    """One neutral message in Chat Completions shape."""
    if message.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id or "",
            "content": message.content,
        }
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            "content": message.content or None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in message.tool_calls
            ],
        }
    images = message.sent_images()
    if message.role == "user" and images:
        # The user's own plots, beside the cells block that names them (SPEC §15).
        return {"role": "user", "content": [{"type": "text", "text": message.content}, *_image_parts(images)]}
    return {"role": message.role, "content": message.content}


def messages_to_wire(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Neutral messages in Chat Completions shape. A tool message takes only text, so the
    images of a run of tool results follow it as one `user` message of `image_url` parts
    (`data:` URLs), each named by a text part (SPEC §10)."""
    wire: list[dict[str, Any]] = []
    pending: list[ImagePart] = []
    for message in messages:
        if message.role != "tool" and pending:
            wire.append(_images_message(pending))
            pending = []
        wire.append(message_to_wire(message))
        if message.role == "tool":
            pending += message.sent_images()
    if pending:
        wire.append(_images_message(pending))
    return wire


def _images_message(parts: Sequence[ImagePart]) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": IMAGES_LABEL}, *_image_parts(parts)]}


def _image_parts(parts: Sequence[ImagePart]) -> list[dict[str, Any]]:
    """Each image as a text part naming it and an `image_url` part holding a `data:` URL."""
    content: list[dict[str, Any]] = []
    for part in parts:
        content.append({"type": "text", "text": image_label(part)})
        content.append({"type": "image_url", "image_url": {"url": part.data_url()}})
    return content


def usage_from_wire(usage: Any) -> Usage | None:
    """`{"prompt_tokens", "completion_tokens", "prompt_tokens_details": {"cached_tokens"}}`
    → `Usage` (the prompt figure includes the cached part); None when absent or malformed."""
    prompt = token_figure(usage.get("prompt_tokens")) if isinstance(usage, dict) else None
    if prompt is None:
        return None
    return Usage(
        input_tokens=prompt,
        output_tokens=token_figure(usage.get("completion_tokens")) or 0,
        cached_input_tokens=cached_part(usage.get("prompt_tokens_details"), "cached_tokens", prompt),
    )


def arguments_text(arguments: Any) -> str:
    """Arguments as JSON text; a few servers send an object instead of a string."""
    if arguments is None:
        return ""
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def whole_tool_calls(raw: Any) -> list[ToolCall]:
    """The `tool_calls` of a non-streamed message (each call complete, in order)."""
    calls = []
    for position, item in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(item, dict):
            continue
        function = item.get("function") or {}
        calls.append(
            ToolCall(
                id=str(item.get("id") or f"call_{position}"),
                name=str(function.get("name") or ""),
                arguments=arguments_text(function.get("arguments")) or "{}",
            )
        )
    return calls


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _StreamState:
    """What has arrived so far in a stream."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, _PartialCall] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Usage | None = None
    model: str | None = None
    prompt_processed: int = 0
    """How much of the prompt the server says it has computed (llama.cpp's `prompt_progress`)."""

    def prompt_advanced(self, progress: Any) -> bool:
        """Whether a chunk's `prompt_progress` says the prompt computation moved on: real
        progress (a repeated or a made-up figure is not, so a server cannot stay alive on it)."""
        processed = progress.get("processed") if isinstance(progress, dict) else None
        if not isinstance(processed, int) or isinstance(processed, bool) or processed <= self.prompt_processed:
            return False
        total = progress.get("total")
        if isinstance(total, int) and not isinstance(total, bool) and processed > total:
            return False
        self.prompt_processed = processed
        return True

    def add_tool_deltas(self, deltas: list[Any]) -> None:
        for position, delta in enumerate(deltas):
            if not isinstance(delta, dict):
                continue
            call = self.calls.setdefault(self._index_for(delta, position), _PartialCall())
            call.id = call.id or str(delta.get("id") or "")
            function = delta.get("function") or {}
            call.name = call.name or str(function.get("name") or "")
            call.arguments.append(arguments_text(function.get("arguments")))

    def _index_for(self, delta: dict[str, Any], position: int) -> int:
        """The call a delta belongs to: its `index`, else its id, else the latest call."""
        index = delta.get("index")
        if isinstance(index, int):
            return index
        call_id = delta.get("id")
        if call_id:
            known = [i for i, call in self.calls.items() if call.id == call_id]
            return known[0] if known else len(self.calls)
        return max(self.calls, default=position)

    def tool_calls(self) -> list[ToolCall]:
        return [
            ToolCall(
                id=call.id or f"call_{index}",
                name=call.name,
                arguments="".join(call.arguments) or "{}",
            )
            for index, call in sorted(self.calls.items())
        ]


class OpenAIProvider(HttpProvider):
    """Chat Completions over httpx; see `HttpProvider` for the shared constructor arguments.

    `max_tokens_field` overrides the name of the output-limit field; by default it is
    `max_completion_tokens` for api.openai.com and `max_tokens` for other servers.
    """

    name = "openai"
    default_base_url = DEFAULT_OPENAI_BASE_URL

    def __init__(self, *args: Any, max_tokens_field: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        is_openai = urlsplit(self.base_url).hostname == OPENAI_HOST
        self.max_tokens_field = max_tokens_field or (
            MAX_COMPLETION_TOKENS_FIELD if is_openai else MAX_TOKENS_FIELD
        )

    def endpoint(self) -> str:
        return f"{self.base_url}/chat/completions"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        messages = [{"role": "system", "content": request.system}] if request.system else []
        messages += messages_to_wire(request.messages)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            self.max_tokens_field: request.max_output_tokens,
            "stream": request.stream,
        }
        if request.stream:
            body["stream_options"] = {"include_usage": True}
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
                for tool in request.tools
            ]
        return body

    def parse_answer(self, data: dict[str, Any]) -> ModelResponse:
        if "error" in data:
            raise classify_stream_error(self.source, data)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self.bad_answer("no choices", data)
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise self.bad_answer("no message", data)
        calls = whole_tool_calls(message.get("tool_calls"))
        reason = choice.get("finish_reason")
        if not isinstance(reason, str):
            raise IncompleteResponseError(f"{self.source}: answer has no finish reason")
        content = message.get("content")
        return ModelResponse(
            text=content if isinstance(content, str) else "",
            tool_calls=calls,
            finish_reason=normalise_finish_reason(reason, bool(calls)),
            usage=usage_from_wire(data.get("usage")),
            model=str(data.get("model") or self.model),
            provider=self.name,
        )

    def parse_stream(self, events: Iterator[ServerSentEvent], emit: TextSink) -> ModelResponse:
        state = _StreamState()
        emit.calls = state.tool_calls
        for _event, chunk in self.json_events(events, "stream chunk"):
            try:
                shown, hidden = self._apply_chunk(chunk, state)
            except (AttributeError, TypeError, ValueError) as exc:
                # A field of an unexpected type (a list where an object belongs, ...).
                raise self.bad_answer(f"malformed chunk: {exc}", chunk) from None
            emit(shown)
            emit.grow(hidden)
            if state.prompt_advanced(chunk.get("prompt_progress")):
                emit.working()
        if state.finish_reason is None:
            raise IncompleteResponseError(
                f"{self.source}: the stream ended without a finish reason"
            )
        return ModelResponse(
            text="".join(state.text),
            tool_calls=state.tool_calls(),
            finish_reason=normalise_finish_reason(state.finish_reason, bool(state.calls)),
            usage=state.usage,
            model=state.model or self.model,
            provider=self.name,
        )

    def _apply_chunk(self, chunk: dict[str, Any], state: _StreamState) -> tuple[str, str]:
        """Fold one chunk into the state; returns the answer text it adds (to show) and the
        other content it adds (tool calls, reasoning)."""
        if "error" in chunk:
            # vLLM and llama.cpp report failures inside a 200 stream.
            raise classify_stream_error(self.source, chunk)
        state.model = state.model or (
            chunk.get("model") if isinstance(chunk.get("model"), str) else None
        )
        # The usage chunk (choices: []) comes after the finish reason; llama.cpp puts it on the last choice chunk.
        state.usage = usage_from_wire(chunk.get("usage")) or state.usage
        shown: list[str] = []
        hidden: list[str] = []
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise self.bad_answer("delta is not an object", chunk)
            content = delta.get("content")
            if isinstance(content, str) and content:
                state.text.append(content)
                shown.append(content)
            state.add_tool_deltas(delta.get("tool_calls") or [])
            hidden.append(content_text(delta, skip=NOT_GROWTH))
            if isinstance(choice.get("finish_reason"), str):
                state.finish_reason = choice["finish_reason"]
        return "".join(shown), "".join(hidden)
