"""Provider-neutral request and response types, and the `Provider` protocol.

Every provider (OpenAI-compatible, Anthropic, the embedded local model) turns a
`ModelRequest` into its own wire format and returns a `ModelResponse`. The agent
loop and the compaction summarizer only ever see these types.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal, Protocol

from pydantic import BaseModel, Field

Operation = Literal["inference", "compaction"]


class ToolCall(BaseModel):
    """One tool call the model asked for."""

    id: str
    """Provider call id; tool results refer to it."""
    name: str
    arguments: str = "{}"
    """The JSON text of the arguments, exactly as the model produced it."""


class ChatMessage(BaseModel):
    """One message of model input, in a provider-neutral shape."""

    role: Literal["user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    """Only on assistant messages."""
    tool_call_id: str | None = None
    """Only on tool messages: the call this result answers."""
    name: str | None = None
    """Only on tool messages: the tool's name."""
    is_error: bool = False
    """Only on tool messages: the tool failed."""


class ToolSchema(BaseModel):
    """A tool the model may call: name, description and JSON schema of its parameters."""

    name: str
    description: str
    parameters: dict[str, object]


class Usage(BaseModel):
    """Token figures a provider reported for one request."""

    input_tokens: int
    output_tokens: int = 0


class ModelRequest(BaseModel):
    """Everything one inference (or summary) request carries."""

    system: str
    messages: list[ChatMessage]
    tools: list[ToolSchema] = Field(default_factory=list)
    max_output_tokens: int
    operation: Operation = "inference"
    operation_id: str
    stream: bool = True


class ModelResponse(BaseModel):
    """A finished answer."""

    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: str
    """Normalised: "stop", "tool_calls", "length" (or the provider's own word otherwise)."""
    usage: Usage | None = None
    model: str
    provider: str


TextCallback = Callable[[str], None]


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
    ) -> ModelResponse:
        """Send the request and return the finished answer.

        `on_text` receives answer text as it streams. `cancel`, when set, aborts
        the request and closes the stream (raises `Cancelled`). `timeout_s` is an
        overall deadline for the whole request including retries (raises
        `ProviderTimeout`). Errors are the classes in `soba_nb.providers.errors`.
        """
        ...
