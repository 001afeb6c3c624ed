"""The interface the compaction core uses to reach a summarizer model.

The provider layer implements it (`soba_nb.agent.provider_summarizer.ProviderSummarizer`); tests
use an in-process fake with controllable latency, failures and outputs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from msgspec import Struct

from soba_nb.transcript.entries import UsageEntry


class RequestNotSent(RuntimeError):
    """A rule of the session kept the request from being sent (its spending cap, SPEC §11):
    the compaction goes on without that model (the deterministic capsule), never fails for it."""


class SummaryOutput(Struct, frozen=True):
    """What the summarizer model returned."""

    text: str
    finish_reason: str
    has_tool_calls: bool = False
    model: str | None = None
    provider: str | None = None
    usage: UsageEntry | None = None
    """The request's usage figures (`operation: compaction`), recorded once the operation ends."""


ProgressCallback = Callable[[int], None]
"""Receives the number of output characters generated so far."""


class Summarizer(Protocol):
    """A model that turns a summary prompt into capsule Markdown."""

    model: str
    provider: str

    def summarize(
        self,
        system: str,
        user: str,
        *,
        max_output_tokens: int,
        operation_id: str,
        cancel: threading.Event,
        on_progress: ProgressCallback | None,
        timeout_s: float,
    ) -> SummaryOutput:
        """Return the summary. Must stop promptly when `cancel` is set (raise any error;
        `RequestNotSent` when the request was not sent at all)."""
        ...

    def cut_off_usage(self, system: str, user: str, *, received_chars: int, operation_id: str) -> UsageEntry | None:
        """The `usage` entry of a request the operation's deadline cut off (SPEC §16: priced for
        what was sent): soba's own counts of the prompt and of the characters received so far,
        marked estimated; None when the model costs nothing."""
        ...
