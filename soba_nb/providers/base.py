"""Provider-neutral request and response types, and the `Provider` protocol.

Every provider (OpenAI-compatible, Anthropic, the embedded local model) turns a
`ModelRequest` into its own wire format and returns a `ModelResponse`. The agent
loop and the compaction summarizer only ever see these types.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from soba_nb.messages import ChatMessage, ToolCall, ToolSchema
from soba_nb.transcript.entries import NativeContinuation

Operation = Literal["inference", "compaction"]

__all__ = [
    "ChatMessage",
    "ModelRequest",
    "ModelResponse",
    "Operation",
    "Provider",
    "TextCallback",
    "ToolCall",
    "ToolSchema",
    "Usage",
]


class Usage(BaseModel):
    """Token figures a provider reported for one request."""

    input_tokens: int
    output_tokens: int = 0


class ModelRequest(BaseModel):
    """Everything one inference (or summary) request carries."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    """`native` is a transcript struct (msgspec), checked by type."""

    system: str
    messages: list[ChatMessage]
    tools: list[ToolSchema] = Field(default_factory=list)
    max_output_tokens: int
    operation: Operation = "inference"
    operation_id: str
    stream: bool = True
    input_tokens: int | None = None
    """Our count of the input (never sent); error messages quote it."""
    near_window: bool = False
    """The input is near the model's window (at or past the soft limit; never sent): an
    empty answer is then read as a context overflow, not retried as a glitch."""
    native: NativeContinuation | None = None
    """Provider-side compaction state replayed before `messages` (SPEC §5 item 2); only set
    for the provider and model that produced it."""


class ModelResponse(BaseModel):
    """A finished answer."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    """`tool_calls` are message structs (msgspec), checked by type."""

    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: str
    """Normalised: "stop", "tool_calls", "length" (or the provider's own word otherwise)."""
    usage: Usage | None = None
    model: str
    provider: str


TextCallback = Callable[[str], None]
WaitCallback = Callable[[str], None]


class Provider(Protocol):
    """What the agent loop and the summarizer need from a model server."""

    name: str
    """Provider kind, e.g. "openai", "anthropic", "local"."""
    model: str

    def complete(
        self,
        request: ModelRequest,
        *,
        on_text: TextCallback | None = None,
        cancel: threading.Event | None = None,
        timeout_s: float | None = None,
        on_wait: WaitCallback | None = None,
    ) -> ModelResponse:
        """Send the request and return the finished answer.

        `on_text` receives answer text as it streams. `cancel`, when set, aborts
        the request and closes the stream (raises `Cancelled`). `timeout_s` is an
        overall deadline for the whole request including retries (raises
        `ProviderTimeout`). `on_wait`, while nothing has arrived yet, is called a few times
        a second with what is going on ("waiting for the model"). Errors are the classes in
        `soba_nb.providers.errors`.
        """
        ...
