"""Chat message types shared by the compaction core (model-input assembly) and providers.

Kept free of any provider or IPython import so the compaction core stays pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel


@dataclass(slots=True)
class ToolCall:
    """One tool call the model asked for."""

    id: str
    """Provider call id; tool results refer to it."""
    name: str
    arguments: str = "{}"
    """The JSON text of the arguments, exactly as the model produced it."""


@dataclass(slots=True)
class ChatMessage:
    """One message of model input, in a provider-neutral shape.

    A plain dataclass, not a validated model: model input builds one per visible entry on
    every assembly (tens of thousands on a long uncompacted path), from entries that were
    validated when they were read; requests that hold them (`ModelRequest`) still validate."""

    role: Literal["user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
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
