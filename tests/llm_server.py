"""A real loopback LLM server for tests, speaking both wire formats.

`LLMServer` runs a stdlib `ThreadingHTTPServer` on 127.0.0.1 (a free port) in a
background thread and answers

- `POST /v1/chat/completions` in OpenAI Chat Completions style,
- `POST /v1/messages` in Anthropic Messages style (with the `compact_20260112` edit), and
- `POST /v1/responses` and `POST /v1/responses/compact` in OpenAI Responses style
  (`llm_server_native` has both native-compaction formats and what they refuse),

streamed (SSE over chunked transfer encoding, flushed chunk by chunk) or not, as the
request asks. Other routes (a llama.cpp `GET /props`, an Ollama `POST /api/show`, a vLLM
`GET /v1/models`) answer what a test registered with `route`; any other path is a 404.
Answers follow a script: a queue of `Reply` objects (build them with
`text`, `tool_calls`, `overflow`, `rate_limited`, `server_error`, `http_error`,
`stream_error`, `truncated`, `empty_stream`, `malformed`, `pings`, `ping_events`, `endless`),
or callables that receive the
`RecordedRequest` and return a `Reply`. When the queue is empty the default reply is
used. Every request is recorded (method, path, headers, JSON body, time, whether the
client hung up mid-answer).

    with LLMServer() as server:
        server.script(text("Hello", chunks=3), rate_limited(retry_after=0.2))
        provider = OpenAIProvider(ModelSettings(base_url=server.url))
        ...
        assert server.requests[0].operation == "inference"

        server.route("GET", "/props", body={"default_generation_settings": {"n_ctx": 8192}})
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHARS_PER_TOKEN = 4
"""Crude token count used for default usage figures."""
IMAGE_TOKENS = 255
"""What an image counts in the default usage figures (OpenAI's rule for a small one)."""
OPENAI_PATH = "/v1/chat/completions"
ANTHROPIC_PATH = "/v1/messages"
RESPONSES_PATHS = ("/v1/responses", "/v1/responses/compact")
POLL_INTERVAL_S = 0.02

OPENAI_OVERFLOW = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens. "
        "However, your messages resulted in 9000 tokens.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
ANTHROPIC_OVERFLOW = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 210000 tokens > 200000 maximum",
    },
}
# Neutral finish words → each wire format's own word.
OPENAI_FINISH = {"stop": "stop", "tool_calls": "tool_calls", "length": "length"}
ANTHROPIC_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


@dataclass
class Reply:
    """One scripted answer. Build with the helper functions below."""

    kind: str = "answer"
    """"answer", "error", "stream_error", "truncated", "empty" or "malformed"."""
    text: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)
    """Tool calls as (name, JSON arguments text)."""
    chunks: int = 1
    """Text is streamed in this many pieces."""
    chunk_delay_s: float = 0.0
    argument_deltas: int = 3
    """Each call's arguments are streamed in this many pieces."""
    delay_s: float = 0.0
    """Wait before answering at all (before the status line)."""
    input_tokens: int | None = None
    """Reported prompt size; None means a crude count of the request."""
    output_tokens: int | None = None
    cached_input_tokens: int = 0
    """The part of the prompt reported as read from the cache, in each format's own way
    (Chat Completions `prompt_tokens_details.cached_tokens`, Responses
    `input_tokens_details.cached_tokens`, Anthropic `cache_read_input_tokens` beside an
    `input_tokens` that leaves it out); 0 reports none, as before."""
    usage: bool = True
    """Report usage at all (streams: only when the client asks for it, like OpenAI)."""
    finish: str | None = None
    """Neutral finish word ("stop", "tool_calls", "length"); None chooses by content."""
    status: int = 200
    body: Any = None
    """Error body (dict or text); for overflows None picks the endpoint's own style."""
    headers: dict[str, str] = field(default_factory=dict)
    stall_after: int = 0
    """With `stall_s`: the stream stops for `stall_s` after this many pieces of text."""
    stall_s: float = 0.0
    prompt_progress: tuple[int, ...] = ()
    """OpenAI streams: before the answer, one chunk per figure, `prompt_progress_delay_s`
    apart, saying how much of the prompt is computed (llama.cpp's `prompt_progress`)."""
    prompt_progress_delay_s: float = 0.0


ScriptItem = Reply | Callable[["RecordedRequest"], Reply]


def text(content: str = "Hello from the test server.", *, chunks: int = 1, **options: Any) -> Reply:
    """A text answer, streamed in `chunks` pieces (options: any `Reply` field)."""
    return Reply(text=content, chunks=chunks, **options)


def tool_calls(*calls: tuple[str, Any], content: str = "", **options: Any) -> Reply:
    """An answer calling tools: `tool_calls(("read_file", {"path": "a.py"}), ...)`."""
    wire = [(name, args if isinstance(args, str) else json.dumps(args)) for name, args in calls]
    return Reply(text=content, calls=wire, **options)


def overflow(**options: Any) -> Reply:
    """HTTP 400 context overflow in the endpoint's own wording."""
    return Reply(kind="error", status=400, **options)


def rate_limited(
    retry_after: float | str | None = 1, message: str = "Rate limit reached for requests"
) -> Reply:
    """HTTP 429 with a Retry-After header (seconds or an HTTP date)."""
    headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
    body = {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": message, "code": "rate_limit_exceeded"},
    }
    return Reply(kind="error", status=429, body=body, headers=headers)


def server_error(status: int = 500, message: str = "internal server error") -> Reply:
    """HTTP 5xx."""
    return Reply(
        kind="error", status=status, body={"error": {"message": message, "type": "server_error"}}
    )


def http_error(status: int, body: Any, headers: dict[str, str] | None = None) -> Reply:
    """Any error status with a body given verbatim (dict → JSON)."""
    return Reply(kind="error", status=status, body=body, headers=headers or {})


def stream_error(body: Any) -> Reply:
    """A 200 stream whose only event is an error object (Anthropic's `event: error`, or
    vLLM / llama.cpp's `data: {"error": ...}`)."""
    return Reply(kind="stream_error", body=body)


def truncated(content: str = "The answer starts but", *, chunks: int = 2, **options: Any) -> Reply:
    """A 200 stream that sends some text and ends with no finish reason and no [DONE]."""
    return Reply(kind="truncated", text=content, chunks=chunks, **options)


def empty_stream() -> Reply:
    """A 200 answer with an empty body (some servers' answer to an oversized prompt)."""
    return Reply(kind="empty")


def reset() -> Reply:
    """The connection is dropped without a byte of answer (a reset)."""
    return Reply(kind="reset")


def pings(interval_s: float = 0.2) -> Reply:
    """A 200 stream that never answers: SSE comment lines (keep-alive pings) until the client
    hangs up or the server closes."""
    return Reply(kind="pings", chunk_delay_s=interval_s)


def ping_events(interval_s: float = 0.2) -> Reply:
    """A 200 stream that never answers, in events rather than comments: Anthropic's
    `event: ping` after `message_start`, or OpenAI-style chunks with an empty delta."""
    return Reply(kind="ping_events", chunk_delay_s=interval_s)


def endless(piece: str = "more words ", interval_s: float = 0.0) -> Reply:
    """A 200 stream of answer text that never finishes: `piece` every `interval_s`, on and on
    past any output limit, until the client hangs up or the server closes."""
    return Reply(kind="endless", text=piece, chunk_delay_s=interval_s)


def malformed() -> Reply:
    """A 200 answer whose JSON (body or stream chunk) does not parse."""
    return Reply(kind="malformed")


@dataclass
class RecordedRequest:
    """One request as the server received it. Indexing reads the JSON body: `req["model"]`."""

    path: str
    headers: dict[str, str]
    """Header names lower-cased."""
    body: Any
    raw: bytes
    time: float
    """`time.monotonic()` when the request arrived."""
    disconnected: bool = False
    """The client hung up before the answer was fully written."""
    completed: bool = False
    """The whole answer was written."""
    method: str = "POST"
    """HTTP method, upper case."""

    def __getitem__(self, key: str) -> Any:
        return self.body[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.body.get(key, default) if isinstance(self.body, dict) else default

    @property
    def operation(self) -> str | None:
        return self.headers.get("x-soba-operation")

    @property
    def operation_id(self) -> str | None:
        return self.headers.get("x-soba-operation-id")

    @property
    def wire(self) -> str:
        if self.path in RESPONSES_PATHS:
            return "responses"
        return "anthropic" if self.path == ANTHROPIC_PATH else "openai"

    def images(self) -> list[RecordedImage]:
        """The images the request carries, in order, each where its wire format puts them:
        Chat Completions `image_url` parts (data: URLs) of a user message, Anthropic `image`
        blocks inside a `tool_result`, Responses `input_image` items of a user message."""
        found: list[RecordedImage] = []
        if self.wire == "anthropic":
            for message in self.get("messages") or []:
                for block in message.get("content") if isinstance(message.get("content"), list) else []:
                    if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
                        for inner in block["content"]:
                            if inner.get("type") == "image":
                                source = inner["source"]
                                found.append(RecordedImage(source["media_type"], base64.b64decode(source["data"]), "tool_result"))
            return found
        key = "input" if self.wire == "responses" else "messages"
        for message in self.get(key) or []:
            content = message.get("content")
            if message.get("role") != "user" or not isinstance(content, list):
                continue
            for part in content:
                url = (part.get("image_url") or {}).get("url") if part.get("type") == "image_url" else part.get("image_url")
                if part.get("type") in ("image_url", "input_image") and isinstance(url, str):
                    head, _, data = url.partition(",")
                    found.append(RecordedImage(head.removeprefix("data:").split(";")[0], base64.b64decode(data), part["type"]))
        return found


@dataclass(frozen=True)
class RecordedImage:
    """An image a request carried."""

    mime: str
    data: bytes
    shape: str
    """The part or block that carried it: `image_url`, `input_image` or `tool_result`."""


@dataclass(frozen=True)
class Route:
    """A canned answer for one method and path (see `LLMServer.route`)."""

    status: int = 200
    body: Any = None
    """dict or list → JSON; text is sent verbatim (so "" is an empty body and "<html>" is
    not JSON); None is an empty body."""
    delay_s: float = 0.0
    """Wait before answering at all (before the status line)."""
    headers: dict[str, str] = field(default_factory=dict)


class _ClientGone(Exception):
    """The client closed the connection while we were writing."""


def _split(content: str, pieces: int) -> list[str]:
    """`content` in up to `pieces` consecutive non-empty parts."""
    if not content:
        return []
    size = max(1, -(-len(content) // max(1, pieces)))
    return [content[i : i + size] for i in range(0, len(content), size)]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet: tests assert on `LLMServer.requests` instead."""

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        self.server.owner._track(self.connection, add=False)
        super().finish()

    def do_GET(self) -> None:
        record = self._receive("GET")
        if not self._answer_route(record):
            self._send_body(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        record = self._receive("POST")
        owner = self.server.owner
        if self._answer_route(record):
            return
        if self.path not in (OPENAI_PATH, ANTHROPIC_PATH, *RESPONSES_PATHS):
            self._send_body(404, {"error": {"message": f"no route {self.path}"}})
            return
        reply = owner._next_reply(record)
        try:
            if reply.delay_s and owner._pause(reply.delay_s):
                return
            if reply.kind == "reset":
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            if self.path in RESPONSES_PATHS:
                from llm_server_native import ResponsesAnswer

                ResponsesAnswer(self, record, reply).send()
            else:
                _Answer(self, record, reply).send()
            record.completed = True
        except (_ClientGone, BrokenPipeError, ConnectionResetError):
            record.disconnected = True
            self.close_connection = True

    def _receive(self, method: str) -> RecordedRequest:
        """Read the request body and record the request."""
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = None
        headers = {key.lower(): value for key, value in self.headers.items()}
        record = RecordedRequest(self.path, headers, body, raw, time.monotonic(), method=method)
        self.server.owner._record(record)
        return record

    def _answer_route(self, record: RecordedRequest) -> bool:
        """Answer a registered route; False when none matches the method and path."""
        owner = self.server.owner
        route = owner._route_for(record.method, record.path)
        if route is None:
            return False
        try:
            if route.delay_s and owner._pause(route.delay_s):
                return True
            self._send_body(route.status, "" if route.body is None else route.body, route.headers)
            record.completed = True
        except (BrokenPipeError, ConnectionResetError):
            record.disconnected = True
            self.close_connection = True
        return True

    # -- low-level writing ----------------------------------------------------------

    def _send_body(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def write_chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        except OSError as exc:
            raise _ClientGone from exc

    def end_stream(self) -> None:
        self.write_chunk(b"")


class _Answer:
    """Writes one reply in the wire format of the request's endpoint."""

    def __init__(self, handler: _Handler, record: RecordedRequest, reply: Reply):
        self.handler = handler
        self.record = record
        self.reply = reply
        self.anthropic = record.wire == "anthropic"
        body = record.body if isinstance(record.body, dict) else {}
        self.stream = bool(body.get("stream"))
        self.model = str(body.get("model", "test-model"))
        self.wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        # An image costs what a vision model charges for a small one, not its base64 text.
        images = record.images() if isinstance(record.body, dict) else []
        image_chars = sum(4 * -(-len(image.data) // 3) for image in images)
        crude_input = max(1, (len(record.raw) - image_chars) // CHARS_PER_TOKEN + IMAGE_TOKENS * len(images))
        crude_output = max(1, len(reply.text) // CHARS_PER_TOKEN)
        self.input_tokens = crude_input if reply.input_tokens is None else reply.input_tokens
        self.output_tokens = crude_output if reply.output_tokens is None else reply.output_tokens
        neutral = reply.finish or ("tool_calls" if reply.calls else "stop")
        wire_finish = (ANTHROPIC_STOP if self.anthropic else OPENAI_FINISH).get(neutral, neutral)
        self.finish: str | None = None if reply.kind == "truncated" else wire_finish
        self.compaction: dict[str, Any] | None = None
        """A compaction block or item made for this request (native compaction)."""
        self.pause = False
        self.pieces_sent = 0
        """Text pieces streamed so far (`Reply.stall_after`)."""

    def send(self) -> None:
        reply, handler = self.reply, self.handler
        if self.anthropic and reply.kind != "error":
            from llm_server_native import anthropic_compaction

            native = anthropic_compaction(self.record, reply, handler.server.owner.native, self.model)
            if native.error is not None:
                handler._send_body(400, native.error)
                return
            if native.input_tokens is not None and reply.input_tokens is None:
                self.input_tokens = native.input_tokens
            self.compaction, self.pause = native.block, native.pause
            if self.pause:
                self.finish = "compaction"
        if reply.kind == "error":
            body = (
                reply.body
                if reply.body is not None
                else (ANTHROPIC_OVERFLOW if self.anthropic else OPENAI_OVERFLOW)
            )
            handler._send_body(reply.status, body, reply.headers)
        elif reply.kind == "malformed" and not self.stream:
            handler._send_body(200, '{"choices": [{"message": ')
        elif reply.kind == "empty" and not self.stream:
            handler._send_body(200, "")
        elif not self.stream:
            handler._send_body(
                200, self._anthropic_message() if self.anthropic else self._openai_completion()
            )
        else:
            handler.start_stream()
            if reply.kind == "malformed":
                self._event({"type": "message_start"} if self.anthropic else {"choices": []})
                handler.write_chunk(b'data: {"choices": [{"delta": \n\n')
            elif reply.kind == "stream_error":
                self._event(reply.body, "error" if self.anthropic else None)
            elif reply.kind == "pings":
                while not handler.server.owner._pause(reply.chunk_delay_s):
                    handler.write_chunk(b": ping\n\n")
            elif reply.kind in ("ping_events", "endless"):
                self._forever(reply.kind == "endless")
            elif reply.kind != "empty":
                (self._anthropic_stream if self.anthropic else self._openai_stream)()
            handler.end_stream()

    def _event(self, data: Any, name: str | None = None) -> None:
        prefix = f"event: {name}\n" if name else ""
        payload = data if isinstance(data, str) else json.dumps(data)
        self.handler.write_chunk(f"{prefix}data: {payload}\n\n".encode())

    def _pieces(self) -> list[str]:
        return _split(self.reply.text, self.reply.chunks)

    def _pause_between_chunks(self) -> None:
        owner = self.handler.server.owner
        if self.reply.chunk_delay_s and owner._pause(self.reply.chunk_delay_s):
            raise _ClientGone("server closing")
        stalls_now = self.reply.stall_s and self.pieces_sent == self.reply.stall_after > 0
        if stalls_now and owner._pause(self.reply.stall_s):
            raise _ClientGone("server closing")
        self.pieces_sent += 1

    def _forever(self, text: bool) -> None:
        """`ping_events` (no content, ever) or `endless` text, until the client goes."""
        if self.anthropic:
            start = {"id": "msg_test", "type": "message", "role": "assistant", "model": self.model, "content": []}
            self._event({"type": "message_start", "message": start}, "message_start")
        else:
            self._event(self._openai_chunk({"role": "assistant", "content": ""}))
        if text and self.anthropic:
            block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
            self._event(block, "content_block_start")
        while not self.handler.server.owner._pause(self.reply.chunk_delay_s):
            if not text:
                if self.anthropic:
                    self._event({"type": "ping"}, "ping")
                else:
                    self._event(self._openai_chunk({}))
            elif self.anthropic:
                delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": self.reply.text}}
                self._event(delta, "content_block_delta")
            else:
                self._event(self._openai_chunk({"content": self.reply.text}))

    # -- OpenAI Chat Completions ----------------------------------------------------

    def _openai_chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "model": self.model,
            "choices": [choice],
        }

    def _openai_usage(self) -> dict[str, Any]:
        total = self.input_tokens + self.output_tokens
        usage: dict[str, Any] = {
            "prompt_tokens": self.input_tokens,
            "completion_tokens": self.output_tokens,
            "total_tokens": total,
        }
        if self.reply.cached_input_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": self.reply.cached_input_tokens}
        return usage

    def _anthropic_input(self) -> dict[str, int]:
        """Anthropic's `input_tokens` leaves out what was read from the cache."""
        cached = self.reply.cached_input_tokens
        if not cached:
            return {"input_tokens": self.input_tokens}
        return {"input_tokens": self.input_tokens - cached, "cache_read_input_tokens": cached}

    def _openai_stream(self) -> None:
        self._event(self._openai_chunk({"role": "assistant", "content": ""}))
        owner = self.handler.server.owner
        for processed in self.reply.prompt_progress:
            if owner._pause(self.reply.prompt_progress_delay_s):
                raise _ClientGone("server closing")
            chunk = self._openai_chunk({})
            chunk["prompt_progress"] = {"processed": processed, "total": max(self.reply.prompt_progress)}
            self._event(chunk)
        for piece in self._pieces():
            self._pause_between_chunks()
            self._event(self._openai_chunk({"content": piece}))
        for index, (name, arguments) in enumerate(self.reply.calls):
            start = {
                "index": index,
                "id": f"call_{index}",
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            self._event(self._openai_chunk({"tool_calls": [start]}))
            for part in _split(arguments, self.reply.argument_deltas):
                self._event(
                    self._openai_chunk(
                        {"tool_calls": [{"index": index, "function": {"arguments": part}}]}
                    )
                )
        if self.reply.kind == "truncated":
            return
        self._event(self._openai_chunk({}, self.finish))
        if self.reply.usage and self.wants_usage:
            self._event(
                {
                    "id": "chatcmpl-test",
                    "model": self.model,
                    "choices": [],
                    "usage": self._openai_usage(),
                }
            )
        self._event("[DONE]")

    def _openai_completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.reply.text or None}
        if self.reply.calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": args},
                }
                for i, (name, args) in enumerate(self.reply.calls)
            ]
        answer: dict[str, Any] = {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish}],
        }
        if self.reply.usage:
            answer["usage"] = self._openai_usage()
        return answer

    # -- Anthropic Messages ---------------------------------------------------------

    def _anthropic_stream(self) -> None:
        usage = {**self._anthropic_input(), "output_tokens": 1} if self.reply.usage else {}
        start = {
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "usage": usage,
        }
        self._event({"type": "message_start", "message": start}, "message_start")
        self._event({"type": "ping"}, "ping")
        index = 0
        if self.compaction is not None:
            opened = {"type": "compaction", "content": None, "encrypted_content": None}
            self._event({"type": "content_block_start", "index": 0, "content_block": opened}, "content_block_start")
            delta = {"type": "compaction_delta", **{k: self.compaction[k] for k in ("content", "encrypted_content")}}
            self._event({"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta")
            self._event({"type": "content_block_stop", "index": 0}, "content_block_stop")
            index = 1
        if self.reply.text and not self.pause:
            self._event(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                },
                "content_block_start",
            )
            for piece in self._pieces():
                self._pause_between_chunks()
                delta = {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": piece},
                }
                self._event(delta, "content_block_delta")
            self._event({"type": "content_block_stop", "index": index}, "content_block_stop")
            index += 1
        for offset, (name, arguments) in enumerate([] if self.pause else self.reply.calls):
            block = {"type": "tool_use", "id": f"toolu_{offset}", "name": name, "input": {}}
            self._event(
                {"type": "content_block_start", "index": index, "content_block": block},
                "content_block_start",
            )
            for part in _split(arguments, self.reply.argument_deltas):
                delta = {"type": "input_json_delta", "partial_json": part}
                self._event(
                    {"type": "content_block_delta", "index": index, "delta": delta},
                    "content_block_delta",
                )
            self._event({"type": "content_block_stop", "index": index}, "content_block_stop")
            index += 1
        if self.reply.kind == "truncated":
            return
        end = {
            "type": "message_delta",
            "delta": {"stop_reason": self.finish, "stop_sequence": None},
        }
        if self.reply.usage:
            end["usage"] = {"output_tokens": self.output_tokens}
        self._event(end, "message_delta")
        self._event({"type": "message_stop"}, "message_stop")

    def _anthropic_message(self) -> dict[str, Any]:
        content: list[dict[str, Any]] = [self.compaction] if self.compaction is not None else []
        if not self.pause:
            content += [{"type": "text", "text": self.reply.text}] if self.reply.text else []
            content += [
                {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": json.loads(args)}
                for i, (name, args) in enumerate(self.reply.calls)
            ]
        answer: dict[str, Any] = {
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": self.finish,
        }
        if self.reply.usage:
            answer["usage"] = {
                **self._anthropic_input(),
                "output_tokens": self.output_tokens,
            }
        return answer


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: LLMServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients hanging up (cancel tests, shutdown) are expected; anything else is printed."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LLMServer:
    """The loopback server. Use as a context manager, or call `close()`."""

    def __init__(self, default_reply: Reply | None = None):
        self.default_reply = default_reply or text()
        """Answered when the script is empty."""
        self._lock = threading.Lock()
        self._script: deque[ScriptItem] = deque()
        self._requests: list[RecordedRequest] = []
        self._routes: dict[tuple[str, str], Route] = {}
        from llm_server_native import NativeLedger

        self.native = NativeLedger()
        """Native compaction items this server issued and saw replayed."""
        self._connections: set[socket.socket] = set()
        self._closing = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": POLL_INTERVAL_S},
            daemon=True,
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """Base URL for OpenAI-compatible clients (ends in /v1)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        """Base URL for Anthropic clients (they add /v1/messages)."""
        return f"http://127.0.0.1:{self.port}"

    def script(self, *replies: ScriptItem) -> None:
        """Queue replies, answered in order, one per request."""
        with self._lock:
            self._script.extend(replies)

    def route(
        self,
        method: str,
        path: str,
        *,
        status: int = 200,
        body: Any = None,
        delay_s: float = 0.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer every `method` request for `path` (query string ignored) with a canned
        reply; registering the same method and path again replaces it."""
        route = Route(status=status, body=body, delay_s=delay_s, headers=headers or {})
        with self._lock:
            self._routes[(method.upper(), path)] = route

    @property
    def pending(self) -> int:
        """Scripted replies not used yet."""
        with self._lock:
            return len(self._script)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, in order (a copy of the list)."""
        with self._lock:
            return list(self._requests)

    def wait_until(self, condition: Callable[[], bool], timeout_s: float = 2.0) -> bool:
        """Poll `condition` until it holds or `timeout_s` passes; returns its last value."""
        ends_at = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() >= ends_at:
                return False
            time.sleep(POLL_INTERVAL_S)
        return True

    def close(self) -> None:
        """Stop serving, wake any scripted delays, and drop open connections."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self._thread.join()

    def __enter__(self) -> LLMServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- used by the handler threads ------------------------------------------------

    def _record(self, record: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(record)

    def _route_for(self, method: str, path: str) -> Route | None:
        with self._lock:
            return self._routes.get((method, path.split("?", 1)[0]))

    def _next_reply(self, record: RecordedRequest) -> Reply:
        with self._lock:
            item = self._script.popleft() if self._script else self.default_reply
        return item(record) if callable(item) else item

    def _pause(self, seconds: float) -> bool:
        """Sleep; True when the server is closing (the caller should stop answering)."""
        return self._closing.wait(seconds)

    def _track(self, connection: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)
