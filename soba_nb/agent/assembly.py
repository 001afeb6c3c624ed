"""The one way a session is assembled: which transcript, then an open session, then its
settings; the magics, the CLI, the demo and the benchmarks all come through here.

- `choose_layout(folder, session_file=..., new=...)`: the transcript a session uses — the
  one asked for, else the folder's latest, else a new one (`soba_nb.layout`);
- `open_session(config, layout, ...)`: the session on it (transcript opened and locked,
  counter, token index, limits, compactor, flight records), its model bound on first use
  from `provider_factory` (default: the configuration's provider);
- `reconfigure(session, config, ...)`: new settings for an open session (soba.json edited,
  `%config SobaMagics.…`, `%auto_compact`).

What the preflight would measure of a transcript opened read-only is `soba_nb.agent.measure`.
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from soba_nb.agent.limits import session_counter
from soba_nb.agent.session import AgentSession
from soba_nb.compaction.budget_state import has_saved_state, tail_is_plain
from soba_nb.config import SobaConfig
from soba_nb.layout import SessionLayout, named_like_transcripts
from soba_nb.paths import shown
from soba_nb.printable import printable
from soba_nb.providers.base import Provider


def choose_layout(
    folder: Path, *, session_file: Path | None = None, new: bool = False, notify: Callable[[str], None] = print
) -> SessionLayout:
    """The transcript to use: `session_file` when given (`%soba --session PATH`), else the
    latest in `folder` unless `new`, else a new one there. A transcript passed over because it
    is a link (never resumed, never written through: `layout.session_transcripts`) is named
    to `notify` in one line, with the session used instead."""
    if session_file is not None:
        return SessionLayout(session_file)
    latest = None if new else SessionLayout.latest(folder)
    chosen = latest if latest is not None else SessionLayout.new(folder)
    if not new:
        skipped = _links_passed_over(folder, latest)
        if skipped:
            more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
            what = "resumed session" if latest is not None else "new session"
            notify(
                f"{printable(shown(skipped[-1]))}{more}: a link, so not resumed (soba never writes a transcript "
                f"through a link); {what} {chosen.session_id} ({printable(shown(chosen.transcript))})"
            )
    return chosen


def _links_passed_over(folder: Path, latest: SessionLayout | None) -> list[Path]:
    """The links in `folder` named like transcripts that are newer than `latest` (all of them
    when there is none), oldest first."""
    since = latest.transcript.lstat().st_mtime if latest is not None else None
    return [
        path
        for path, info in named_like_transcripts(folder)
        if stat.S_ISLNK(info.st_mode) and (since is None or info.st_mtime >= since)
    ]


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
    if layout.transcript.exists() and not has_saved_state(layout.transcript):
        # Opened cold, it will count: `TokenCounter.load`
        session_counter(config).load(plain_text=tail_is_plain(layout.transcript))
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
