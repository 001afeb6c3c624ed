"""Events the agent loop reports while a turn runs (the UI renders them; it never writes)."""

from __future__ import annotations

from dataclasses import dataclass

from soba_nb.compaction.outcomes import CompactionEvent


@dataclass(frozen=True)
class TextDelta:
    """A piece of the answer as it streams."""

    text: str


@dataclass(frozen=True)
class ToolStarted:
    call_id: str
    name: str
    summary: str
    """One-line summary of the arguments."""


@dataclass(frozen=True)
class ToolFinished:
    call_id: str
    name: str
    summary: str
    is_error: bool
    duration_ms: int
    preview: str
    """The first lines of the output, for a collapsed receipt."""
    images: tuple[str, ...] = ()
    """The images the call displayed, kept as artifacts: their paths relative to the notebook's
    folder (`<notebook-stem>.soba/artifacts/<sha256>.png`)."""
    declined: bool = False
    """The call never ran: the user declined it (or no one could be asked). Its result is still
    an error for the model; its receipt says `declined`."""


@dataclass(frozen=True)
class Waiting:
    """Nothing has arrived yet from the model: what it is doing, and for how long."""

    status: str
    """"waiting for the model", "the model is reading 12,400 tokens" (a local server reading a
    long prompt, SPEC §17), "loading the embedded model · 40%", …"""
    elapsed_s: float


@dataclass(frozen=True)
class Notice:
    """A one-line message for the user (errors, stops, repairs)."""

    text: str
    level: str = "info"


@dataclass(frozen=True)
class Steered:
    """A message the user sent into the running turn (the sidebar's steer, SPEC §18): it is
    in the transcript and goes to the model with the next request."""

    text: str


AgentEvent = TextDelta | ToolStarted | ToolFinished | Notice | Waiting | Steered | CompactionEvent
