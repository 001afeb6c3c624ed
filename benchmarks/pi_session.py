"""The same session in pi's JSONL session format (pi 1.6.0, session version 3).

pi's format (its `docs/session-format.md` and `dist/core/session-manager.js`): a `session`
header line (not part of the tree), then entries with `type`, `id`, `parentId` and an ISO
`timestamp`; conversation turns are `message` entries holding an `AgentMessage` (`user`,
`assistant` with content blocks and provider usage, `toolResult`); `compaction` replaces the
path before `firstKeptEntryId` with its `summary`.

Each soba-nb entry becomes one pi entry with the same id and parent, so both files hold the
same number of entries and a capsule's `firstKeptEntryId` names the same entry:

    message (user)       → message {role: user, content: text}
    message (assistant)  → message {role: assistant, content: [text], usage, stopReason}
    tool_call            → message {role: assistant, content: [toolCall], usage, stopReason: toolUse}
    tool_result          → message {role: toolResult, toolCallId, toolName, content: [text]}
    usage                → usage {kind: "turn", provider, model, usage}  (not in context, like ours)
    capsule              → compaction {summary: the capsule text, firstKeptEntryId, tokensBefore}
    config               → model_change {provider, modelId}
    anything else        → custom {customType: "soba.<type>", data}  (not in context)

Every pi assistant message carries a usage figure, as pi writes them, so pi anchors its token
estimate on the latest one just as soba-nb anchors on its `usage` entries. pi's lines carry
more metadata than ours; so that the comparison cannot flatter soba-nb by handing pi more
bytes to parse, tool results are shortened (from the end) by whatever pi's lines have grown
beyond ours so far: the pi file is never larger than the soba-nb file, and a few bytes
smaller at most.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

SESSION_VERSION = 3
API = "openai-completions"

Data = dict[str, Any]


def _millis(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)


def _usage(input_tokens: int, output_tokens: int) -> Data:
    return {
        "input": input_tokens, "output": output_tokens, "cacheRead": 0, "cacheWrite": 0,
        "totalTokens": input_tokens + output_tokens,
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0},
    }  # fmt: skip


class PiConverter:
    """Converts soba-nb lines to pi lines, one for one, keeping pi's bytes ≤ ours."""

    def __init__(self, cwd: str):
        self.cwd = cwd
        self.provider = "openai"
        self.model = "gpt-4o"
        self.input_tokens = 1
        self.output_tokens = 1
        self.excess = 0
        """Bytes pi's lines so far take beyond ours (negative: fewer)."""
        self.header_id: str | None = None

    def _assistant(self, content: list[Data], stop: str, millis: int) -> Data:
        return {
            "role": "assistant", "content": content, "api": API, "provider": self.provider,
            "model": self.model, "usage": _usage(self.input_tokens, self.output_tokens),
            "stopReason": stop, "timestamp": millis,
        }  # fmt: skip

    def _entry(self, data: Data) -> Data:
        kind = data["type"]
        base = {"id": data["id"], "parentId": data["parentId"], "timestamp": data["timestamp"]}
        millis = _millis(data["timestamp"])
        if kind == "message":
            if data["role"] == "assistant":
                message = self._assistant([{"type": "text", "text": data["content"]}], "stop", millis)
            else:
                message = {"role": data["role"], "content": data["content"], "timestamp": millis}
            return {"type": "message", **base, "message": message}
        if kind == "tool_call":
            call = {"type": "toolCall", "id": data["callId"], "name": data["name"], "arguments": json.loads(data["arguments"])}
            return {"type": "message", **base, "message": self._assistant([call], "toolUse", millis)}
        if kind == "tool_result":
            message = {
                "role": "toolResult", "toolCallId": data["callId"], "toolName": data["name"],
                "content": [{"type": "text", "text": data["content"]}], "isError": data.get("isError", False),
                "timestamp": millis,
            }  # fmt: skip
            return {"type": "message", **base, "message": message}
        if kind == "usage":
            self.input_tokens, self.output_tokens = data["inputTokens"], data.get("outputTokens") or 1
            usage = _usage(self.input_tokens, self.output_tokens)
            return {"type": "usage", **base, "kind": "turn", "provider": self.provider, "model": self.model, "usage": usage}
        if kind == "capsule":
            return {
                "type": "compaction", **base, "summary": data["content"],
                "firstKeptEntryId": data["firstKeptEntryId"] or data["id"], "tokensBefore": data["tokensBefore"],
            }  # fmt: skip
        if kind == "config":
            model = data["config"]["model"]
            self.provider, self.model = model["provider"], model["name"]
            return {"type": "model_change", **base, "provider": self.provider, "modelId": self.model}
        fields = {key: value for key, value in data.items() if key not in base and key != "type"}
        return {"type": "custom", **base, "customType": f"soba.{kind}", "data": fields}

    def header(self, raw: bytes, session_id: str) -> bytes:
        """pi's header line for soba-nb's header line (pi's is not part of the tree)."""
        data = json.loads(raw)
        if data.get("type") != "session":
            raise ValueError("the first line of a soba-nb transcript must be its session header")
        self.header_id = data["id"]
        header = {"type": "session", "version": SESSION_VERSION, "id": session_id, "timestamp": data["timestamp"], "cwd": self.cwd}
        line = _dump(header)
        self.excess += len(line) - (len(raw) + 1)
        return line

    def line(self, raw: bytes) -> bytes:
        """The pi line for one soba-nb line (without its newline; pi's has one)."""
        data = json.loads(raw)
        entry = self._entry(data)
        if entry["parentId"] == self.header_id:
            entry["parentId"] = None  # the entry after pi's header is the root of the tree
        line = _dump(entry)
        over = self.excess + len(line) - (len(raw) + 1)
        if over > 0 and data["type"] == "tool_result":
            # Removing n characters of ASCII text removes at least n bytes of JSON.
            text = entry["message"]["content"][0]["text"]
            entry["message"]["content"][0]["text"] = text[: max(len(text) - over, 0)]
            line = _dump(entry)
        self.excess += len(line) - (len(raw) + 1)
        return line


    def append_item(self, data: Data) -> Data:
        """What pi's `SessionManager` is asked to append for one soba-nb entry (on-disk
        dict without id): `appendMessage(message)` or `appendUsage(kind, provider, model,
        usage)`; `beforeResponse` marks where an agent asks the model next."""
        stamp = "2026-01-01T00:00:00.000Z"
        entry = self._entry({**data, "id": "", "parentId": None, "timestamp": stamp})
        if entry["type"] == "usage":
            return {"kind": entry["kind"], "provider": entry["provider"], "model": entry["model"], "usage": entry["usage"]}
        message = entry["message"]
        message["timestamp"] = int(time.time() * 1000)
        return {"message": message, "beforeResponse": message["role"] in ("user", "toolResult")}


def _dump(entry: Data) -> bytes:
    return (json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def write_pi_session(source: Path, target: Path) -> Path:
    """Write `source` (a soba-nb transcript) as a pi session file at `target`."""
    converter = PiConverter(str(target.parent))
    with source.open("rb") as lines, target.open("wb") as out:
        out.write(converter.header(next(lines).rstrip(b"\n"), source.stem))
        for raw in lines:
            if raw.strip():
                out.write(converter.line(raw.rstrip(b"\n")))
    return target
