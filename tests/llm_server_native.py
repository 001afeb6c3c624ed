"""The loopback server's native-compaction wire formats (used by `llm_server`).

- OpenAI Responses: `POST /v1/responses` (streamed as named events or whole), with
  `context_management: [{"type": "compaction", "compact_threshold": N}]` putting an encrypted
  `compaction` item before the reply when the input reaches N; `POST /v1/responses/compact`
  returning a `response.compaction` object whose `output` is every user message of the
  input followed by one `compaction` item.
- Anthropic Messages: the `compact_20260112` edit (beta header `compact-2026-01-12`,
  `trigger.value` at least 50,000) puts a `compaction` block before the reply when the input
  reaches the trigger; `pause_after_compaction` ends the answer there (`stop_reason:
  "compaction"`); a replayed block makes the server ignore everything before it.

What the documentation says a server refuses, this one refuses with HTTP 400: a compaction
item or block it did not issue, or issued for another model (items are model-bound); a
compaction block without the beta header and a declared edit; a trigger below 50,000; a
`function_call_output` with no `function_call` before it. The `NativeLedger` remembers what
was issued (and what was replayed) so tests can look.
"""

from __future__ import annotations

import json
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

from llm_server import CHARS_PER_TOKEN, Reply, _Answer, _split

RESPONSES_PATH = "/v1/responses"
RESPONSES_COMPACT_PATH = "/v1/responses/compact"
COMPACT_BETA = "compact-2026-01-12"
COMPACT_EDIT = "compact_20260112"
MIN_TRIGGER = 50_000
DEFAULT_TRIGGER = 150_000
DEFAULT_SUMMARY = "Summary of the earlier conversation."

RESPONSES_OVERFLOW = {
    "error": {
        "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
        "type": "invalid_request_error",
        "param": "input",
        "code": "context_length_exceeded",
    }
}


def _invalid(message: str, code: str = "invalid_request_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": "invalid_request_error", "code": code, "message": message}}


@dataclass
class Issued:
    model: str
    summary: str


@dataclass
class NativeLedger:
    """Compaction state the server handed out, by its opaque content."""

    issued: dict[str, Issued] = field(default_factory=dict)
    replayed: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def issue(self, model: str, summary: str) -> str:
        opaque = "gAAAAB" + secrets.token_urlsafe(48)
        with self._lock:
            self.issued[opaque] = Issued(model, summary)
        return opaque

    def check(self, opaque: Any, model: str) -> str | None:
        """Why a replayed item is refused, or None (and the replay is recorded)."""
        with self._lock:
            found = self.issued.get(opaque) if isinstance(opaque, str) else None
            if found is None:
                return "the encrypted content was not issued by this server or was modified"
            if found.model != model:
                return f"the compaction item was made for {found.model}, not {model}"
            self.replayed.append(opaque)
        return None

    def summary(self, opaque: str) -> str:
        with self._lock:
            return self.issued[opaque].summary


def _crude(value: Any) -> int:
    return max(1, len(json.dumps(value)) // CHARS_PER_TOKEN)


# -- OpenAI Responses -----------------------------------------------------------------------


def _input_problem(items: Any, model: str, ledger: NativeLedger) -> str | None:
    if not isinstance(items, list) or not items:
        return "input must be a non-empty list of items"
    calls: set[str] = set()
    for item in items:
        if not isinstance(item, dict):
            return "input items must be objects"
        kind = item.get("type", "message")
        if kind == "compaction":
            problem = ledger.check(item.get("encrypted_content"), model)
            if problem:
                return problem
        elif kind == "function_call":
            calls.add(str(item.get("call_id")))
        elif kind == "function_call_output" and item.get("call_id") not in calls:
            return f"No tool call found for function call output with call_id {item.get('call_id')}."
    return None


def _user_texts(items: list[dict[str, Any]]) -> list[str]:
    texts = []
    for item in items:
        if item.get("type", "message") != "message" or item.get("role") != "user":
            continue
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        texts.append(str(content))
    return texts


def _user_item(text: str, index: int) -> dict[str, Any]:
    return {
        "id": f"msg_user_{index}",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [{"type": "input_text", "text": text}],
    }


class ResponsesAnswer(_Answer):
    """Writes one reply to `POST /v1/responses` or `POST /v1/responses/compact`."""

    def send(self) -> None:
        reply, handler, body = self.reply, self.handler, self.body
        ledger = handler.server.owner.native
        if reply.kind == "error":
            handler._send_body(reply.status, reply.body if reply.body is not None else RESPONSES_OVERFLOW, reply.headers)
            return
        problem = _input_problem(body.get("input"), self.model, ledger) if body.get("model") else "model is required"
        if problem:
            handler._send_body(400, {"error": {"message": problem, "type": "invalid_request_error", "code": None}})
            return
        if self.record.path == RESPONSES_COMPACT_PATH:
            handler._send_body(200, self._compacted(ledger))
            return
        self.compaction = self._threshold_compaction(ledger)
        if reply.kind == "malformed" and not self.stream:
            handler._send_body(200, '{"output": [')
        elif reply.kind == "empty" and not self.stream:
            handler._send_body(200, "")
        elif not self.stream:
            handler._send_body(200, self._response("completed" if reply.kind != "truncated" else "in_progress"))
        else:
            handler.start_stream()
            if reply.kind == "malformed":
                handler.write_chunk(b'event: response.created\ndata: {"type": "response.created", \n\n')
            elif reply.kind == "stream_error":
                self._named(reply.body)
            elif reply.kind == "pings":
                while not handler.server.owner._pause(reply.chunk_delay_s):
                    handler.write_chunk(b": ping\n\n")
            elif reply.kind != "empty":
                self._stream()
            handler.end_stream()

    @property
    def body(self) -> dict[str, Any]:
        return self.record.body if isinstance(self.record.body, dict) else {}

    # -- compaction -------------------------------------------------------------------------

    def _compacted(self, ledger: NativeLedger) -> dict[str, Any]:
        items = self.body["input"]
        summary = self.reply.text or DEFAULT_SUMMARY
        output = [_user_item(text, n) for n, text in enumerate(_user_texts(items))]
        output.append({"id": "cmp_" + secrets.token_hex(6), "type": "compaction",
                       "encrypted_content": ledger.issue(self.model, summary)})
        compacted: dict[str, Any] = {
            "id": "resp_cmp_" + secrets.token_hex(6),
            "object": "response.compaction",
            "created_at": 1_770_000_000,
            "output": output,
        }
        if self.reply.usage:
            compacted["usage"] = self._usage(_crude(items), _crude(output))
        return compacted

    def _threshold_compaction(self, ledger: NativeLedger) -> dict[str, Any] | None:
        for entry in self.body.get("context_management") or []:
            if isinstance(entry, dict) and entry.get("type") == "compaction":
                threshold = entry.get("compact_threshold")
                if isinstance(threshold, int) and self.input_tokens >= threshold:
                    opaque = ledger.issue(self.model, self.reply.text or DEFAULT_SUMMARY)
                    return {"id": "cmp_" + secrets.token_hex(6), "type": "compaction", "encrypted_content": opaque}
        return None

    # -- the answer -------------------------------------------------------------------------

    def _usage(self, input_tokens: int, output_tokens: int) -> dict[str, Any]:
        return {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": self.reply.cached_input_tokens},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        }

    def _items(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = [self.compaction] if self.compaction else []
        if self.reply.text:
            items.append({
                "id": "msg_test", "type": "message", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": self.reply.text, "annotations": []}],
            })
        items += [
            {"id": f"fc_{n}", "type": "function_call", "call_id": f"call_{n}", "name": name,
             "arguments": arguments, "status": "completed"}
            for n, (name, arguments) in enumerate(self.reply.calls)
        ]
        return items

    def _response(self, status: str) -> dict[str, Any]:
        cut_short = status == "completed" and self.finish == "length"
        response: dict[str, Any] = {
            "id": "resp_test", "object": "response", "created_at": 1_770_000_000, "model": self.model,
            "status": "incomplete" if cut_short else status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut_short else None,
            "output": self._items() if status != "in_progress" else [],
        }
        if self.reply.usage and status != "in_progress":
            response["usage"] = self._usage(self.input_tokens, self.output_tokens)
        return response

    def _named(self, data: Any) -> None:
        payload = dict(data) if isinstance(data, dict) else {"type": "error", "message": str(data)}
        self._event(payload, str(payload.get("type", "error")))

    def _stream(self) -> None:
        self._named({"type": "response.created", "response": self._response("in_progress")})
        self._named({"type": "response.in_progress", "response": self._response("in_progress")})
        index = 0
        if self.compaction:
            for kind in ("response.output_item.added", "response.output_item.done"):
                self._named({"type": kind, "output_index": index, "item": self.compaction})
            index += 1
        if self.reply.text:
            item = {"id": "msg_test", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
            self._named({"type": "response.output_item.added", "output_index": index, "item": item})
            for piece in self._pieces():
                self._pause_between_chunks()
                self._named({"type": "response.output_text.delta", "item_id": "msg_test", "output_index": index,
                             "content_index": 0, "delta": piece})
            self._named({"type": "response.output_text.done", "item_id": "msg_test", "output_index": index,
                         "content_index": 0, "text": self.reply.text})
            index += 1
        for n, (name, arguments) in enumerate(self.reply.calls):
            item = {"id": f"fc_{n}", "type": "function_call", "call_id": f"call_{n}", "name": name,
                    "arguments": "", "status": "in_progress"}
            self._named({"type": "response.output_item.added", "output_index": index, "item": item})
            for part in _split(arguments, self.reply.argument_deltas):
                self._named({"type": "response.function_call_arguments.delta", "item_id": f"fc_{n}",
                             "output_index": index, "delta": part})
            self._named({"type": "response.output_item.done", "output_index": index,
                         "item": {**item, "arguments": arguments, "status": "completed"}})
            index += 1
        if self.reply.kind == "truncated":
            return
        final = self._response("completed")
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        self._named({"type": kind, "response": final})


# -- Anthropic compact_20260112 ---------------------------------------------------------------


@dataclass
class AnthropicCompaction:
    """What the compaction edit does to one Messages request."""

    error: dict[str, Any] | None = None
    block: dict[str, Any] | None = None
    """The compaction block made for this request, if the trigger fired."""
    pause: bool = False
    input_tokens: int | None = None
    """The input as the server counts it (content before a replayed block is ignored)."""


def _blocks(message: Any) -> list[dict[str, Any]]:
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def anthropic_compaction(record: Any, reply: Reply, ledger: NativeLedger, model: str) -> AnthropicCompaction:
    body = record.body if isinstance(record.body, dict) else {}
    messages = body.get("messages") or []
    betas = {b.strip() for b in record.headers.get("anthropic-beta", "").split(",") if b.strip()}
    edits = (body.get("context_management") or {}).get("edits") or []
    edit = next((e for e in edits if isinstance(e, dict) and e.get("type") == COMPACT_EDIT), None)
    if edit is not None and COMPACT_BETA not in betas:
        return AnthropicCompaction(_invalid(f"context_management edit {COMPACT_EDIT} requires the {COMPACT_BETA} beta"))
    start = 0
    for index, message in enumerate(messages):
        for block in _blocks(message):
            if block.get("type") != "compaction":
                continue
            if edit is None:
                return AnthropicCompaction(_invalid(
                    "compaction blocks require the compact_20260112 edit to be declared in context_management"
                ))
            problem = ledger.check(block.get("encrypted_content"), model)
            if problem:
                return AnthropicCompaction(_invalid(problem))
            start = index
    counted = reply.input_tokens or _crude({k: v for k, v in body.items() if k != "messages"} | {"messages": messages[start:]})
    if edit is None:
        return AnthropicCompaction(input_tokens=counted if start else None)
    trigger = (edit.get("trigger") or {}).get("value", DEFAULT_TRIGGER)
    if not isinstance(trigger, int) or trigger < MIN_TRIGGER:
        return AnthropicCompaction(_invalid(f"trigger value must be at least {MIN_TRIGGER}, got {trigger}"))
    if counted < trigger:
        return AnthropicCompaction(input_tokens=counted)
    summary = reply.text or DEFAULT_SUMMARY
    block = {"type": "compaction", "content": summary, "encrypted_content": ledger.issue(model, summary)}
    return AnthropicCompaction(block=block, pause=bool(edit.get("pause_after_compaction")), input_tokens=counted)
