"""A loopback model that disagrees with us: its own token count, its own (smaller) window.

`DisagreeingModel` answers like `conftest.ScriptedModel` (inference replies from a queue,
summaries separately) but first counts each request its own way — o200k tokens of the
message texts times `factor` — and reports that figure as the usage. When a request is over
its real `window`, it answers the way a given server kind does:

- "openai": HTTP 400 `context_length_exceeded`, stating the limit and the request's size;
- "llamacpp": HTTP 200 with an empty body or stream (llama.cpp's answer to a streamed
  oversized prompt; asked without streaming it is empty too here, the worst case);
- "ollama": no error at all: the prompt is cut to the window silently and the usage says so.

Every request it judged is kept in `judged` as (operation, its count, accepted?).
"""

from __future__ import annotations

import json
from typing import Any

from conftest import ScriptedModel
from llm_server import LLMServer, RecordedRequest, Reply, http_error

from soba_nb.tokens import get_encoding


def _texts(body: dict[str, Any]) -> list[str]:
    texts: list[str] = []
    system = body.get("system")
    if isinstance(system, str):
        texts.append(system)
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(json.dumps(part) for part in content)
        for call in message.get("tool_calls") or []:
            texts.append(json.dumps(call))
    texts.extend(json.dumps(tool) for tool in body.get("tools") or [])
    return texts


class DisagreeingModel(ScriptedModel):
    """A server whose count is `factor` × o200k and whose real window is `window`."""

    def __init__(self, server: LLMServer, *, factor: float = 1.0, window: int = 10**9, kind: str = "openai"):
        super().__init__(server)
        self.factor = factor
        self.window = window
        self.kind = kind
        self.judged: list[tuple[str | None, int, bool]] = []

    def count(self, request: RecordedRequest) -> int:
        encoding = get_encoding("o200k_base")
        body = request.body if isinstance(request.body, dict) else {}
        return int(self.factor * sum(len(encoding.encode(text)) for text in _texts(body)))

    def __call__(self, request: RecordedRequest) -> Reply:
        tokens = self.count(request)
        fits = tokens <= self.window
        self.judged.append((request.operation, tokens, fits))
        if not fits and self.kind == "openai":
            return http_error(
                400,
                {
                    "error": {
                        "message": f"This model's maximum context length is {self.window} tokens. "
                        f"However, your messages resulted in {tokens} tokens.",
                        "type": "invalid_request_error",
                        "code": "context_length_exceeded",
                    }
                },
            )
        if not fits and self.kind == "llamacpp":
            return Reply(kind="empty")
        reply = super().__call__(request)
        reply.input_tokens = min(tokens, self.window)
        return reply

    def accepted_over_window(self) -> list[int]:
        """Counts of requests the server would have had to refuse (or cut) but did not."""
        return [tokens for _, tokens, fits in self.judged if not fits and self.kind != "ollama"]
