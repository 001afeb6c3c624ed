"""The embedded model as an OpenAI-compatible server on 127.0.0.1, in its own process.

The notebook kernel talks to it like to any llama.cpp or vLLM server (`POST
/v1/chat/completions`, streamed or not, usage included; `GET /props` and `/v1/models` say
the window), so a crash, a hang or an out-of-memory of the model is a failed request in
the cell, never a dead kernel. One generation runs at a time; a client that hangs up stops
its generation at the next token (a cancel in the notebook closes the connection).

A prompt that does not fit the window is refused with OpenAI's own overflow error (400,
`context_length_exceeded`, stating the limit), before any computation.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from soba_nb.engine.chat import ChatTemplate, RequestError, parse_messages
from soba_nb.engine.llama import LlamaModel
from soba_nb.engine.sampling import Sampler
from soba_nb.engine.tokenizer import GGUFTokenizer
from soba_nb.engine.tool_text import ToolBlockFilter, parse_tool_calls

DEFAULT_MAX_TOKENS = 512
MAX_BODY_BYTES = 64 * 1024 * 1024
"""A request body larger than this is refused (413) before it is read."""


@dataclass
class Engine:
    """What serving needs: the model, its tokenizer and template, one KV cache and a lock."""

    model: LlamaModel
    tokenizer: GGUFTokenizer
    template: ChatTemplate
    name: str
    stop_ids: frozenset[int]
    """End of turn, and every control token: generation stops at any of them."""

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self.cache = self.model.new_cache()

    @property
    def n_ctx(self) -> int:
        return self.model.hp.n_ctx


@dataclass
class Generation:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


def generate(
    engine: Engine,
    prompt: list[int],
    max_tokens: int,
    on_text: Callable[[str], None],
    should_stop: Callable[[], bool],
    on_prompt_progress: Callable[[int, int], None] | None = None,
) -> Generation | None:
    """Sample up to `max_tokens` after `prompt`; None when `should_stop` (the client left).
    `on_prompt_progress(processed, total)` while the prompt is computed, chunk by chunk."""
    model, tokenizer = engine.model, engine.tokenizer
    budget = min(max_tokens, engine.n_ctx - len(prompt))
    sampler = Sampler()
    decoder = tokenizer.stream()
    logits = model.prefill(engine.cache, prompt, should_stop=should_stop, on_chunk=on_prompt_progress)
    if logits is None:
        return None
    pieces: list[str] = []
    produced = 0
    finish = "length"
    while produced < budget:
        token = sampler.next(logits, engine.cache.tokens)
        if token in engine.stop_ids:
            finish = "stop"
            break
        produced += 1
        piece = decoder.feed(token)
        if piece:
            pieces.append(piece)
            on_text(piece)
        if should_stop():
            return None
        if produced < budget:
            logits = model.forward(engine.cache, [token])
    rest = decoder.flush()
    if rest:
        pieces.append(rest)
        on_text(rest)
    return Generation("".join(pieces), finish, len(prompt), produced)


def _overflow(limit: int, requested: int) -> dict[str, Any]:
    return {
        "error": {
            "message": f"This model's maximum context length is {limit} tokens. However, your messages "
            f"resulted in {requested} tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: EngineServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet: the kernel's user never sees server logs."""

    # -- routes ------------------------------------------------------------------------

    def do_GET(self) -> None:
        engine = self.server.engine
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/v1/health"):
            self._json(200, {"status": "ok"})
        elif path == "/props":
            self._json(
                200,
                {"default_generation_settings": {"n_ctx": engine.n_ctx}, "model_path": engine.name},
            )
        elif path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [{"id": engine.name, "object": "model", "max_model_len": engine.n_ctx}],
                },
            )
        else:
            self._json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != "/v1/chat/completions":
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._json(
                413,
                {
                    "error": {
                        "message": f"request body over {MAX_BODY_BYTES} bytes",
                        "type": "invalid_request_error",
                    }
                },
            )
            return
        try:
            body = json.loads(self.rfile.read(length) or b"null")
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
            self._complete(body)
        except (RequestError, ValueError) as exc:
            self._json(400, {"error": {"message": str(exc), "type": "invalid_request_error"}})

    # -- completion --------------------------------------------------------------------

    def _complete(self, body: dict[str, Any]) -> None:
        engine = self.server.engine
        system, conversation, tools = parse_messages(body)
        prompt = engine.tokenizer.encode(
            engine.template.render(system, conversation, tools), special=True
        )
        if len(prompt) >= engine.n_ctx:
            self._json(400, _overflow(engine.n_ctx, len(prompt)))
            return
        max_tokens = (
            body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
        )
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            raise RequestError("max_tokens must be a positive integer")
        stream = bool(body.get("stream"))
        usage_wanted = bool((body.get("stream_options") or {}).get("include_usage"))
        answer = _Answer(self, engine.name, stream, usage_wanted, tools_offered=bool(tools))
        with engine.lock:
            result = generate(engine, prompt, max_tokens, answer.text, answer.client_gone, answer.prompt_progress)
        if result is not None:
            answer.finish(result)

    # -- writing -----------------------------------------------------------------------

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Answer:
    """Writes one completion, streamed (SSE) or whole; knows when the client has left."""

    def __init__(
        self, handler: Handler, model: str, stream: bool, usage: bool, *, tools_offered: bool
    ):
        self.handler, self.model, self.stream, self.usage = handler, model, stream, usage
        self.filter = ToolBlockFilter() if tools_offered else None
        self.tools_offered = tools_offered
        self.id = f"chatcmpl-{uuid.uuid4().hex[:16]}"
        self.gone = False
        if stream:
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.send_header("Cache-Control", "no-cache")
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            self._event({"role": "assistant", "content": ""})

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def _write(self, payload: Any) -> None:
        data = f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()
        try:
            self.handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.handler.wfile.flush()
        except OSError:
            self.gone = True

    def _event(self, delta: dict[str, Any], finish: str | None = None) -> None:
        self._write(self._chunk(delta, finish))

    def prompt_progress(self, processed: int, total: int) -> None:
        """How far the prompt is computed, as llama.cpp's server says it (`prompt_progress`):
        a long prompt takes a while on a slow machine, and this is progress, not silence."""
        if self.stream:
            chunk = self._chunk({})
            chunk["prompt_progress"] = {"processed": processed, "total": total}
            self._write(chunk)

    def text(self, piece: str) -> None:
        if not self.stream:
            return
        shown = self.filter.feed(piece) if self.filter is not None else piece
        if shown:
            self._event({"content": shown})

    def client_gone(self) -> bool:
        """True once the client hung up: a write failed, or the socket reads as closed (a
        client that cancelled while the prompt was being computed has read nothing yet)."""
        if self.gone:
            return True
        connection = self.handler.connection
        try:
            readable, _, _ = select.select([connection], [], [], 0)
            self.gone = bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            self.gone = True
        return self.gone

    def finish(self, result: Generation) -> None:
        text, calls = parse_tool_calls(result.text) if self.tools_offered else (result.text, [])
        finish = "tool_calls" if calls and result.finish_reason == "stop" else result.finish_reason
        usage = {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
        }
        wire_calls = [
            {
                "index": i,
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(calls)
        ]
        if not self.stream:
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if wire_calls:
                message["tool_calls"] = [
                    {k: v for k, v in call.items() if k != "index"} for call in wire_calls
                ]
            choice = {"index": 0, "message": message, "finish_reason": finish}
            self.handler._json(
                200,
                {
                    "id": self.id,
                    "object": "chat.completion",
                    "model": self.model,
                    "choices": [choice],
                    "usage": usage,
                },
            )
            return
        rest = self.filter.flush() if self.filter is not None else ""
        if rest:
            self._event({"content": rest})
        if wire_calls:
            self._event({"tool_calls": wire_calls})
        self._event({}, finish)
        if self.usage:
            self._write(
                {
                    "id": self.id,
                    "object": "chat.completion.chunk",
                    "model": self.model,
                    "choices": [],
                    "usage": usage,
                }
            )
        self._write("[DONE]")
        try:
            self.handler.wfile.write(b"0\r\n\r\n")
            self.handler.wfile.flush()
        except OSError:
            self.gone = True


class EngineServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0):
        super().__init__((host, port), Handler)
        self.engine = engine

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"
