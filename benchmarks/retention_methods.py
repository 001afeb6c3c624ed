"""The compaction methods compared, run through the product's own code.

Every method works on the same written session, in a session opened the way `%soba` opens
one (`AgentSession`: its limits, token counter, compaction engine and kernel-state callback,
with the benchmark's namespace as the kernel's). Then:

- `compact_once`: what `%compact` runs (`ensure_summarizer`, `Compactor.compact`), with or
  without a summarizer model;
- `compact_along`: the session replayed with the engine's preflight and send check before
  every model request, as the agent loop makes them, so auto-compaction (soft triggers and
  the hard limit) fires where it would in a live session, rolling capsules up;
- `drop_oldest`: no capsule, the newest entries that fit a token budget (the baseline).

What the model would receive next is the engine's own model input (`Compactor.model_input`),
turned into text the way the embedded model's chat template receives it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.retention_sessions import EngineLoop, SyntheticSession, write_session
from soba_nb.agent import assembly
from soba_nb.agent.prompt import SYSTEM_PROMPT
from soba_nb.agent.session import AgentSession
from soba_nb.agent.tools import TOOL_SCHEMAS
from soba_nb.compaction.model_input import (
    ModelInput,
    VisibleContext,
    assemble,
    entry_tokens,
    fixed_tokens,
)
from soba_nb.compaction.outcomes import CompactionResult, Outcome
from soba_nb.compaction.planner import valid_cuts
from soba_nb.compaction.triggers import TurnState
from soba_nb.config import SobaConfig, build_config
from soba_nb.engine.tool_text import render_message
from soba_nb.layout import SessionLayout
from soba_nb.providers.base import Provider
from soba_nb.providers.errors import ProviderError
from soba_nb.transcript.entries import Entry

ProviderFactory = Callable[[SobaConfig], Provider]


@dataclass(frozen=True)
class Profile:
    """A model configuration the session runs under (its limits decide the budget)."""

    name: str
    layer: dict[str, Any]
    """A configuration layer, as in `soba.json`."""

    def config(self, **compaction: Any) -> SobaConfig:
        layer = {**self.layer, "compaction": {**self.layer.get("compaction", {}), **compaction}}
        return build_config([("retention benchmark", layer)])


LOCAL = Profile("embedded SmolLM2 (8k window)", {"model": {"provider": "local"}})
CLOUD = Profile("gpt-4o-mini (128k window)", {"model": {"provider": "openai", "name": "gpt-4o-mini"}})


@dataclass
class Run:
    """What one method left for the model to read, and what it cost."""

    text: str
    """The next request's messages as text (capsule or summary first, then the kept tail)."""
    tokens_before: int
    tokens_after: int
    seconds: float
    tail: str = ""
    """The messages after the capsule (the kept tail), when a capsule leads the input."""
    capsule_tokens: int | None = None
    compactions: int = 0
    results: list[CompactionResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _seen(agent: AgentSession, tokens_before: int, seconds: float, results: list[CompactionResult]) -> Run:
    """The run as the next request shows it: the engine's own model input."""
    built = agent.compactor.model_input()
    capsule = agent.compactor.context().capsule
    done = [r for r in results if r.outcome is Outcome.COMPLETED]
    return Run(
        model_input_text(built), tokens_before, built.tokens, seconds,
        tail=model_input_text(built, 1) if capsule is not None else "",
        capsule_tokens=entry_tokens(capsule, agent.counter) if capsule is not None else None,
        compactions=len(done), results=results,
        notes=sorted({f"{r.outcome.value}: {r.reason}" for r in results if r.reason}),
    )


def no_model(_: SobaConfig) -> Provider:
    raise ProviderError("no summarizer model (the benchmark measures the deterministic capsule)")


def model_input_text(built: ModelInput, start: int = 0) -> str:
    """The messages (from `start`) as the embedded model's chat template receives them."""
    return "\n\n".join(render_message(message)["content"] for message in built.messages[start:])


def open_session(
    path: Path, config: SobaConfig, namespace: dict[str, Any], provider_factory: ProviderFactory = no_model
) -> AgentSession:
    """A session opened as `%soba` opens one (the transcript is created when missing)."""
    return assembly.open_session(
        config, SessionLayout(path), project_root=path.parent, namespace=namespace, provider_factory=provider_factory
    )


def write(session: SyntheticSession, path: Path, config: SobaConfig) -> Path:
    """The session written to `path` as a live session records it, nothing compacted (a
    transcript left there by an earlier run, with `--keep`, is replaced, not appended to)."""
    _fresh(path)
    agent = open_session(path, config, {})
    try:
        write_session(agent.transcript, session, EngineLoop(agent.compactor, compact_along=False))
    finally:
        agent.close()
    return path


def _fresh(path: Path) -> None:
    """No transcript (nor its token index) at `path`: a run starts from nothing."""
    path.unlink(missing_ok=True)
    path.with_name(path.stem + ".tokens").unlink(missing_ok=True)


def copy_of(path: Path, name: str) -> Path:
    copy = path.with_name(f"{path.stem}.{name}{path.suffix}")
    shutil.copyfile(path, copy)
    return copy


def compact_once(
    path: Path,
    name: str,
    config: SobaConfig,
    namespace: dict[str, Any],
    provider_factory: ProviderFactory = no_model,
    prepare: Callable[[AgentSession], None] | None = None,
) -> Run:
    """`%compact` on a copy of the written session named `name`; `prepare` sees the session
    (its summarizer connected) before the compaction."""
    agent = open_session(copy_of(path, name), config, namespace, provider_factory)
    try:
        agent.ensure_summarizer()
        if prepare is not None:
            prepare(agent)
        started = time.monotonic()
        result = agent.compactor.compact()
        return _seen(agent, result.tokens_before, time.monotonic() - started, [result])
    finally:
        agent.close()


def compact_along(session: SyntheticSession, path: Path, config: SobaConfig, namespace: dict[str, Any], tokens_before: int) -> Run:
    """The session replayed with the engine's calls at every model request (no model: the
    deterministic capsule), then the next turn's preflight; `tokens_before` is the whole
    history's size for the table."""
    _fresh(path)
    agent = open_session(path, config, namespace)
    try:
        loop = EngineLoop(agent.compactor, compact_along=True)
        started = time.monotonic()
        write_session(agent.transcript, session, loop)
        final = agent.compactor.preflight(TurnState())
        run = _seen(agent, tokens_before, time.monotonic() - started, [*loop.results, *([final] if final else [])])
    finally:
        agent.close()
    if loop.refused_sends:
        run.notes.insert(0, f"{loop.refused_sends} requests refused by the send check")
    return run


def drop_oldest(path: Path, config: SobaConfig, budget: int) -> Run:
    """The newest visible entries whose model input fits `budget` tokens, starting at a
    message with every earlier call answered (no call is cut from its result)."""
    agent = open_session(copy_of(path, "drop-oldest"), config, {})
    try:
        counter = agent.counter
        started = time.monotonic()
        context = agent.compactor.context()
        entries: tuple[Entry, ...] = context.entries
        costs = [entry_tokens(entry, counter) for entry in entries]
        room = budget - fixed_tokens(SYSTEM_PROMPT, TOOL_SCHEMAS, counter)
        kept_from = len(entries)
        for cut in reversed(valid_cuts(entries)):
            if sum(costs[cut:]) > room:
                break
            kept_from = cut
        built = assemble(VisibleContext(None, entries[kept_from:], ()), system=SYSTEM_PROMPT,
                         tools=TOOL_SCHEMAS, counter=counter)
        seconds = time.monotonic() - started
        before = agent.compactor.measure().effective
    finally:
        agent.close()
    return Run(model_input_text(built), before, built.tokens, seconds)


def history_tokens(path: Path, config: SobaConfig) -> int:
    """The whole written session's size on the profile's counter (effective tokens)."""
    agent = open_session(path, config, {})
    try:
        return agent.compactor.measure().effective
    finally:
        agent.close()
