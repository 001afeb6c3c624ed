"""Synthetic sessions as data, written as real soba-nb transcripts.

A `SyntheticSession` is what `retention_plan.generate_session` produced: turns (a user
request, model steps with tool calls and their results, a final answer), the facts planted
in them, and the variables a kernel would hold at the end. `write_session` appends it to a
`Transcript` entry by entry, in the order the agent loop (`soba_nb.agent.loop`) records a
turn — user message; per model step an assistant message, its `tool_call` entries, then each
result (a `checkpoint` call records its checkpoint while it runs, before its result); the
answer; the turn's checkpoint. A `Loop` stands in for the loop's calls into the compaction
engine at the same points: nothing (`PlainLoop`), or the engine's own preflight, send check
and turn/checkpoint records (`EngineLoop`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from benchmarks.retention_facts import Fact, Kind
from soba_nb.compaction.compactor import Compactor, HardLimitExceeded
from soba_nb.compaction.outcomes import CompactionResult
from soba_nb.compaction.triggers import TurnState
from soba_nb.transcript.entries import (
    CheckpointEntry,
    Entry,
    MessageEntry,
    ToolCallEntry,
    ToolResultEntry,
    entry_from_dict,
    replace,
)
from soba_nb.transcript.store import Transcript

CHECKPOINT_TOOL = "checkpoint"


@dataclass(frozen=True)
class ToolUse:
    """One tool call and the result the tool reported."""

    name: str
    arguments: dict[str, Any]
    result: str = ""
    """For `checkpoint` calls the result is written when the checkpoint is recorded."""
    is_error: bool = False


@dataclass
class Step:
    """One model response: its text and the tools it called."""

    text: str
    tools: list[ToolUse] = field(default_factory=list)


@dataclass
class Turn:
    request: str
    steps: list[Step]
    answer: str


@dataclass(frozen=True)
class Frame:
    """A dataframe the agent built: its name and shape (the kernel holds a real one)."""

    name: str
    rows: int
    columns: tuple[str, ...]


@dataclass
class SyntheticSession:
    seed: int
    turns: list[Turn]
    facts: list[Fact]
    frames: list[Frame]
    """Agent-built dataframes, in the order the agent built them."""
    user_variables: list[tuple[str, object]]
    """The user's own variables from earlier cells, (name, value), before the agent's; a
    `Frame` value stands for a DataFrame of that shape."""

    @property
    def latest_request(self) -> str:
        return self.turns[-1].request

    def facts_of(self, kind: Kind) -> list[Fact]:
        return [fact for fact in self.facts if fact.kind is kind]

    def namespace(self) -> dict[str, Any]:
        """What the kernel holds at the end: the user's variables, then the agent's real
        pandas DataFrames of the planted shapes (insertion order as a notebook builds it)."""
        import numpy as np
        import pandas as pd

        def real(value: Any) -> Any:
            if not isinstance(value, Frame):
                return value
            data = np.zeros((value.rows, len(value.columns)), dtype="float32")
            return pd.DataFrame(data, columns=list(value.columns))

        namespace: dict[str, Any] = {"pd": pd, "np": np}
        namespace.update((name, real(value)) for name, value in self.user_variables)
        namespace.update((frame.name, real(frame)) for frame in self.frames)
        namespace["model"] = FittedModel()
        return namespace


class FittedModel:
    """Stands for the model object the agent trained (`model = fit_model(...)`)."""


class Loop(Protocol):
    """The agent loop's calls into the compaction engine, at the points the loop makes them."""

    def turn_started(self) -> None: ...

    def before_inference(self) -> None: ...

    def checkpoint(self, kind: str, note: str) -> str: ...

    def turn_complete(self) -> None: ...


class PlainLoop:
    """No engine: checkpoints are written as the engine would record them, nothing compacts."""

    def __init__(self, transcript: Transcript):
        self.transcript = transcript

    def turn_started(self) -> None:
        return None

    def before_inference(self) -> None:
        return None

    def checkpoint(self, kind: str, note: str) -> str:
        entry = entry_from_dict({"type": "checkpoint", "kind": kind, "note": note, "intent": kind != "user"})
        written = self.transcript.append(entry)
        assert isinstance(written, CheckpointEntry)
        return written.checkpoint_id

    def turn_complete(self) -> None:
        self.transcript.append(CheckpointEntry(kind="turn"))


class EngineLoop:
    """The engine's own calls, as `soba_nb.agent.loop.TurnRunner` makes them: with
    `compact_along=True` a preflight and the send check before every model request (so
    auto-compaction fires where it would in a live session); always the turn-complete and
    checkpoint records."""

    def __init__(self, compactor: Compactor, *, compact_along: bool):
        self.compactor = compactor
        self.compact_along = compact_along
        self.turn = TurnState()
        self.results: list[CompactionResult] = []
        self.refused_sends = 0
        """Requests the send check refused (a live turn would have stopped there)."""

    def turn_started(self) -> None:
        self.turn = TurnState()

    def before_inference(self) -> None:
        if not self.compact_along:
            return
        before = self.compactor.last_result
        preflight = self.compactor.preflight(self.turn)
        if preflight is not None:
            self.results.append(preflight)
        try:
            self.compactor.request_for_sending()
        except HardLimitExceeded:
            self.refused_sends += 1
        last = self.compactor.last_result
        if last is not None and last is not before and last is not preflight:
            self.results.append(last)  # the send check forced a hard_limit compaction

    def checkpoint(self, kind: str, note: str) -> str:
        return self.compactor.record_checkpoint(kind, note).checkpoint_id

    def turn_complete(self) -> None:
        self.compactor.record_turn_complete()


def _entry_id(rng: random.Random) -> str:
    return f"{rng.getrandbits(32):08x}"


def write_session(transcript: Transcript, session: SyntheticSession, loop: Loop | None = None) -> None:
    """Append every turn of `session` to `transcript`, calling `loop` where the agent loop
    calls the engine. Entry and call ids are drawn from the session's seed."""
    loop = loop or PlainLoop(transcript)
    rng = random.Random(session.seed)
    calls = 0

    def append(entry: Entry) -> None:
        transcript.append(replace(entry, id=_entry_id(rng)))

    for turn in session.turns:
        append(MessageEntry(role="user", content=turn.request))
        loop.turn_started()
        for step in turn.steps:
            loop.before_inference()
            append(MessageEntry(role="assistant", content=step.text))
            ids = []
            for tool in step.tools:
                calls += 1
                ids.append(f"call_{session.seed:x}_{calls}")
                append(ToolCallEntry(call_id=ids[-1], name=tool.name, arguments=json.dumps(tool.arguments)))
            for call_id, tool in zip(ids, step.tools, strict=True):
                content = tool.result
                if tool.name == CHECKPOINT_TOOL:
                    kind, note = tool.arguments["kind"], tool.arguments["note"]
                    content = f"recorded {kind} checkpoint {loop.checkpoint(kind, note)}"
                append(ToolResultEntry(call_id=call_id, name=tool.name, content=content, is_error=tool.is_error))
        loop.before_inference()
        append(MessageEntry(role="assistant", content=turn.answer))
        loop.turn_complete()


def transcript_text(entries: Sequence[Entry]) -> str:
    """Every message, argument and result of `entries` as one text (for generator tests)."""
    parts: list[str] = []
    for entry in entries:
        if isinstance(entry, MessageEntry | ToolResultEntry):
            parts.append(entry.content)
        elif isinstance(entry, ToolCallEntry):
            parts.append(entry.arguments)
    return "\n".join(parts)
