"""One agent session: its transcript, provider, token counter and compaction engine.

Sessions live next to the notebook in `<notebook-stem>.soba/<session-id>.jsonl`. Opening
a folder resumes its latest session (leaf, capsule and budget come back from the file)
unless a new one is asked for.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from soba_nb.agent.kernel_state import describe_namespace
from soba_nb.agent.skills import load_skill
from soba_nb.agent.summarizer import ProviderSummarizer
from soba_nb.agent.tools import TOOL_SCHEMAS
from soba_nb.compaction.engine import Compactor, EngineSettings
from soba_nb.compaction.flight import FLIGHT_FILE, FlightRecorder
from soba_nb.compaction.triggers import Thresholds
from soba_nb.config import SobaConfig
from soba_nb.providers import make_provider
from soba_nb.providers.base import Provider
from soba_nb.providers.errors import ProviderError
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    LeafEntry,
    SessionEntry,
    SkillEntry,
)
from soba_nb.transcript.store import Transcript

SESSION_SUFFIX = ".jsonl"
SESSIONS_FOLDER_SUFFIX = ".soba"

SYSTEM_PROMPT = """\
You are soba, a coding agent working inside the user's Jupyter notebook.
You run Python in the notebook's own kernel with the `python` tool: variables you create \
stay in the user's namespace, and the user's variables (dataframes, models, paths) are \
there for you to inspect. You can read, write, edit and list files in the project folder \
and run shell commands with a time limit. Every call you make is recorded as a receipt.

Work in small verified steps: inspect before you change, run what you wrote, and report \
what you did and what you found. Prefer the `python` tool for data work (pandas, plots). \
Never print secrets. Use the `checkpoint` tool when you reach a milestone or change plan. \
When the work is done, answer in concise Markdown.\
"""


def sessions_dir_for(notebook: Path) -> Path:
    """`<notebook-stem>.soba/` next to the notebook."""
    return notebook.parent / f"{notebook.stem}{SESSIONS_FOLDER_SUFFIX}"


def new_session_id() -> str:
    """Sortable by creation time: `20261202T143700Z-1a2b`."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(2)}"


def session_files(folder: Path) -> list[Path]:
    """Session transcripts in a folder, oldest first (flight records excluded)."""
    if not folder.is_dir():
        return []
    files = [p for p in folder.glob(f"*{SESSION_SUFFIX}") if p.name != FLIGHT_FILE]
    return sorted(files, key=lambda p: (p.stat().st_mtime, p.name))


def latest_session(folder: Path) -> Path | None:
    files = session_files(folder)
    return files[-1] if files else None


def thresholds_from(config: SobaConfig) -> Thresholds:
    c = config.compaction
    return Thresholds(
        hard_limit=config.hard_limit,
        soft_limit=config.soft_limit,
        auto=c.auto,
        compact_on_turn_complete=c.compact_on_turn_complete,
        compact_on_milestone=c.compact_on_milestone,
        min_tokens_for_auto_compact=c.min_tokens_for_auto_compact,
        min_reclaimable_tokens=c.min_reclaimable_tokens,
        min_savings_ratio=c.min_savings_ratio,
        keep_recent_tokens=c.keep_recent_tokens,
    )


def counter_for(config: SobaConfig) -> TokenCounter:
    """The embedded model counts with its own tokenizer; other models by family (tokens.py)."""
    if config.model.provider == "local":
        from soba_nb.resolution import embedded_model_installed

        if embedded_model_installed():
            from soba_nb.providers.local_model import count_tokens

            return TokenCounter.exact(f"{config.model.name} (GGUF vocabulary)", count_tokens)
    return TokenCounter.for_model(config.model.provider, config.model.name)


class RewindError(ValueError):
    """The rewind target names no checkpoint or entry of this session."""


class AgentSession:
    """The state behind `%soba`: transcript, provider, counter, compactor, namespace."""

    def __init__(
        self,
        config: SobaConfig,
        *,
        sessions_dir: Path,
        project_root: Path,
        namespace: dict[str, Any] | None = None,
        notebook: str | None = None,
        session_file: Path | None = None,
        new: bool = False,
        provider: Provider | None = None,
        provider_factory: Callable[[SobaConfig], Provider] | None = None,
    ):
        self.config = config
        self.sessions_dir = sessions_dir
        self.project_root = project_root
        self.namespace: dict[str, Any] = {} if namespace is None else namespace
        self.notebook = notebook
        self._provider_factory = provider_factory
        self._provider = provider
        path = session_file
        if path is None and not new:
            path = latest_session(sessions_dir)
        if path is None:
            path = sessions_dir / f"{new_session_id()}{SESSION_SUFFIX}"
        header = SessionEntry(notebook=notebook, model=f"{config.model.provider}/{config.model.name}")
        self.transcript = Transcript.open(path, create_header=header)
        self.session_id = path.stem
        self.counter = counter_for(config)
        self.compactor = Compactor(
            self.transcript,
            self.counter,
            self._engine_settings(),
            system=SYSTEM_PROMPT,
            tools=TOOL_SCHEMAS,
            summarizer=None,
            flight=FlightRecorder(sessions_dir / FLIGHT_FILE),
            kernel_state=lambda: describe_namespace(self.namespace),
        )

    # -- configuration -------------------------------------------------------------------

    def _engine_settings(self) -> EngineSettings:
        return EngineSettings(
            thresholds=thresholds_from(self.config),
            timeout_ms=self.config.compaction.timeout_ms,
            max_output_tokens=self.config.model.max_output_tokens,
            session_id=self.session_id,
        )

    def apply_config(self, config: SobaConfig) -> None:
        """New settings (e.g. `%auto_compact off`); a model change also changes the provider."""
        model_changed = config.model != self.config.model
        self.config = config
        self.compactor.update_settings(self._engine_settings())
        if model_changed:
            self._provider = None
            self.compactor.summarizer = None

    @property
    def provider(self) -> Provider:
        """Created on first use, so `%budget` works without a configured key."""
        if self._provider is None:
            if self._provider_factory is not None:
                self._provider = self._provider_factory(self.config)
            elif self.config.provider_source.startswith("no model"):
                raise ProviderError(self.config.provider_source)
            else:
                self._provider = make_provider(self.config.model)
        if self.compactor.summarizer is None:
            self.compactor.summarizer = ProviderSummarizer(self._provider)
        return self._provider

    def ensure_summarizer(self) -> None:
        """Connect the summarizer (the session's model); fall back silently if none is available."""
        try:
            _ = self.provider
        except Exception:  # no key / no model: compaction uses the deterministic capsule
            self.compactor.summarizer = None

    # -- navigation ----------------------------------------------------------------------

    @property
    def file(self) -> Path:
        return self.transcript.file

    def resolve_target(self, target: str) -> str:
        """An entry id for a checkpoint id (`ck_…`) or an entry id."""
        found = self.transcript.find_checkpoint(target)
        if found is not None:
            return found.id
        entry = self.transcript.get(target)
        if entry is None or isinstance(entry, LeafEntry):
            raise RewindError(f"rewind: {target!r} is neither a checkpoint nor an entry id of {self.file.name}")
        return entry.id

    def rewind(self, target: str) -> LeafEntry:
        """Move the leaf; later work branches from there and the model input is rebuilt."""
        return self.transcript.rewind(self.resolve_target(target))

    def checkpoints(self) -> list[CheckpointEntry | CapsuleEntry]:
        """Checkpoints and capsules on the current path."""
        return [e for e in self.transcript.path_view() if isinstance(e, CheckpointEntry | CapsuleEntry)]

    def capsules(self) -> list[CapsuleEntry]:
        return [e for e in self.transcript.path_view() if isinstance(e, CapsuleEntry)]

    def activate_skill(self, name: str) -> SkillEntry:
        skill = load_skill(self.project_root, name)
        written = self.transcript.append(SkillEntry(name=skill.name, path=str(skill.path), content=skill.content))
        assert isinstance(written, SkillEntry)
        return written

    def close(self) -> None:
        self.transcript.close()
