"""The one way a session is assembled: which transcript, then an open session, then its
settings; the magics, the CLI, the demo and the benchmarks all come through here.

- `choose_layout(folder, session_file=..., new=...)`: the transcript a session uses — the
  one asked for, else the folder's latest, else a new one (`soba_nb.layout`);
- `open_session(config, layout, ...)`: the session on it (transcript opened and locked,
  counter, token index, limits, compactor, flight records), its model bound on first use
  from `provider_factory` (default: the configuration's provider);
- `reconfigure(session, config, ...)`: new settings for an open session (soba.json edited,
  `%config SobaMagics.…`, `%auto_compact`);
- `measure_recorded(transcript, config)`: what the preflight would measure, for a
  transcript opened read-only (`soba-nb budget`, `inspect`), with the same counter and the
  same system prompt and tools as an open session, from what a session keeps beside it (read,
  never written) — or, for a transcript copied without it, from its last usage figure on.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from soba_nb.agent.prompt import SYSTEM_PROMPT
from soba_nb.agent.session import AgentSession, session_counter, session_limits
from soba_nb.agent.tools import TOOL_SCHEMAS, tool_schemas_for
from soba_nb.compaction.budget import BudgetTracker, Measurement
from soba_nb.compaction.budget_state import BudgetStateFile
from soba_nb.compaction.model_input import fixed_tokens
from soba_nb.config import SobaConfig
from soba_nb.layout import SessionLayout
from soba_nb.providers.base import Provider
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.store import Transcript
from soba_nb.transcript.token_index import TokenIndex
from soba_nb.window import model_key, usage_ceiling


def choose_layout(folder: Path, *, session_file: Path | None = None, new: bool = False) -> SessionLayout:
    """The transcript to use: `session_file` when given (`%soba --session PATH`), else the
    latest in `folder` unless `new`, else a new one there."""
    if session_file is not None:
        return SessionLayout(session_file)
    latest = None if new else SessionLayout.latest(folder)
    return latest if latest is not None else SessionLayout.new(folder)


def open_session(
    config: SobaConfig,
    layout: SessionLayout,
    *,
    project_root: Path,
    namespace: dict[str, Any] | None = None,
    notebook: str | None = None,
    provider: Provider | None = None,
    provider_factory: Callable[[SobaConfig], Provider] | None = None,
) -> AgentSession:
    """A session on `layout`'s transcript (created with its header when new). `provider`
    binds that provider as it is; `provider_factory` makes one from the configuration on
    first use (default: `soba_nb.providers.make_provider`)."""
    if layout.transcript.exists() and not layout.budget.exists():
        session_counter(config).load()  # opened cold, it will count: `TokenCounter.load`
    return AgentSession(
        config,
        layout=layout,
        project_root=project_root,
        namespace=namespace,
        notebook=notebook,
        provider=provider,
        provider_factory=provider_factory,
    )


def reconfigure(
    session: AgentSession, config: SobaConfig, *, auto: bool | None = None, idle_timeout_s: float | None = None
) -> AgentSession:
    """New settings for an open session: the configuration (a model change rebinds the
    model), `%auto_compact` (kept in the transcript) and the idle limit."""
    session.apply_config(config)
    if auto is not None:
        session.set_auto(auto)
    if idle_timeout_s is not None:
        session.set_idle_timeout(idle_timeout_s)
    return session


def measure_recorded(transcript: Transcript, config: SobaConfig | None, counter: TokenCounter | None = None) -> tuple[TokenCounter, Measurement]:
    """The counter and the measurement an open session would make of `transcript`'s path
    (its configuration's counter; `counter` when there is no configuration). The budget
    state and the counts beside the transcript are read, never written; without them the
    path is measured from its last usage figure on (the rest is counted if the measurement's
    `estimated` is read)."""
    if config is not None:
        counter = session_counter(config)
    assert counter is not None, "a counter or a configuration"
    saved = BudgetStateFile(transcript.file).load()
    if saved is not None and saved.counter == counter.key:
        counter.prime(saved.counts)
    counter.backfill = TokenIndex.open(transcript.file, counter.key, writable=False, keys_of=transcript.own_ids).read_counts
    tools = TOOL_SCHEMAS
    if config is not None:
        hard_limit = session_limits(config, transcript).hard_limit
        tools = tool_schemas_for(hard_limit, fixed_tokens(SYSTEM_PROMPT, TOOL_SCHEMAS, counter))
    tracker = BudgetTracker(counter, fixed_tokens(SYSTEM_PROMPT, tools, counter))
    if config is not None:
        tracker.distrust_usage_from(usage_ceiling(transcript.windows, model_key(config)))
    tracker.offer(saved)
    return counter, tracker.measure(transcript.path_view())
