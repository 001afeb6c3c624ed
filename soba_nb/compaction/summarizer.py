"""The interface the compaction core uses to reach a summarizer model.

The provider layer implements it (`soba_nb.agent.provider_summarizer.ProviderSummarizer`); tests
use an in-process fake with controllable latency, failures and outputs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SummaryOutput:
    """What the summarizer model returned."""

    text: str
    finish_reason: str
    has_tool_calls: bool = False
    model: str | None = None
    provider: str | None = None


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
        """Return the summary. Must stop promptly when `cancel` is set (raise any error)."""
        ...
