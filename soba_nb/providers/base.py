"""Provider-neutral request and response types, and the `Provider` protocol.

Every provider (OpenAI-compatible, Anthropic, the embedded local model) turns a
`ModelRequest` into its own wire format and returns a `ModelResponse`. The agent
loop and the compaction summarizer only ever see these types.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Literal, Protocol

from msgspec import UNSET
from pydantic import BaseModel, ConfigDict, Field

from soba_nb.config import MAX_CONTEXT_WINDOW
from soba_nb.messages import ChatMessage, ToolCall, ToolSchema
from soba_nb.transcript.entries import NativeContinuation, UsageEntry

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
    """The whole prompt, cached part included."""
    output_tokens: int = 0
    cached_input_tokens: int | None = None
    """The part of `input_tokens` read from the provider's prompt cache; None when the
    provider did not say."""

    def entry(
        self,
        *,
        provider: str,
        model: str,
        operation: Operation,
        operation_id: str,
        sent_tokens: int | None = None,
        sent_image_tokens: int = 0,
        truncated: bool = False,
    ) -> UsageEntry:
        """The transcript's `usage` entry of these figures (`sent_image_tokens`: the part of
        `sent_tokens` that is our estimate of the images; 0 is left out)."""
        cached = self.cached_input_tokens
        return UsageEntry(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cached_input_tokens=UNSET if cached is None else cached,
            provider=provider,
            model=model,
            operation_id=operation_id,
            operation=operation,
            sent_tokens=sent_tokens,
            sent_image_tokens=sent_image_tokens or UNSET,
            truncated=truncated,
        )


def token_figure(value: Any) -> int | None:
    """`value` when it can be a count of tokens a server reports: an int (not a bool) from 0 to
    `MAX_CONTEXT_WINDOW`; else None. A server's words are data (SPEC §12): a negative usage
    figure would hide the session's size from its budget and its cost from the cap, and
    `true` is no count."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_CONTEXT_WINDOW:
        return value
    return None


def cached_part(details: Any, name: str, input_tokens: int) -> int | None:
    """`details[name]` when it is a count within `input_tokens` (a server's figures are data:
    a negative or larger one is not a count of this prompt), else None."""
    value = details.get(name) if isinstance(details, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= input_tokens:
        return value
    return None


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
    stopped_at_tokens: int | None = None
    """Set when the server streamed on past `maxOutputTokens` and the stream was stopped there:
    about how many tokens (our count) had come (finish `length`; tool calls still arriving are
    kept with the arguments that came, cut)."""


SpendCheck = Callable[[ModelRequest], None]
"""Called before a request is sent; raises (a `RequestNotSent`) when it must not be (the
session's spending cap, SPEC §11)."""

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
