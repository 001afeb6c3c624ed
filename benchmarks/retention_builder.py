"""The session under construction: tool uses in soba-nb's result formats, planted facts,
and the dataframes the agent built (shared by the planted scenes and the filler)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from benchmarks import retention_content as content
from benchmarks.retention_facts import Fact, Kind, shape_forms
from benchmarks.retention_sessions import Frame, ToolUse
from benchmarks.retention_themes import Theme

SHELL_TIMEOUT_S = 120
SHAPE_WINDOW = 160
"""A dataframe's shape must be written this close to its name (a kernel-state line, the
call that printed `.shape`)."""


@dataclass
class SessionBuilder:
    """The session being built: its turns, facts and frames."""

    rng: random.Random
    theme: Theme
    facts: list[Fact] = field(default_factory=list)
    frames: dict[str, Frame] = field(default_factory=dict)
    python_runs: int = 0

    # -- tools ------------------------------------------------------------------------

    def read(self, path: str, text: str) -> ToolUse:
        return ToolUse("read_file", {"path": path}, text)

    def write(self, path: str, text: str) -> ToolUse:
        return ToolUse("write_file", {"path": path, "content": text}, f"wrote {len(text.encode())} bytes to {path}")

    def edit(self, path: str, old: str, new: str) -> ToolUse:
        changed = f"edited {path}: replaced {old.count(chr(10)) + 1} line(s) with {new.count(chr(10)) + 1} line(s)"
        return ToolUse("edit_file", {"path": path, "old": old, "new": new}, changed)

    def shell(self, command: str, output: str, status: int) -> ToolUse:
        text = output if output.startswith("exit status:") else f"exit status: {status}\n{output}"
        return ToolUse("shell", {"command": command, "timeout_s": SHELL_TIMEOUT_S}, text, is_error=status != 0)

    def python(self, code: str, result: str = "", error: str | None = None) -> ToolUse:
        self.python_runs += 1
        if error is not None:
            return ToolUse("python", {"code": code}, content.python_error(error, code, self.python_runs), True)
        return ToolUse("python", {"code": code}, result or "(no output)")

    # -- facts ------------------------------------------------------------------------

    def plant(self, kind: Kind, label: str, *groups: tuple[str, ...], window: int | None = None) -> None:
        self.facts.append(Fact(kind, label, tuple(groups), window=window))

    def plant_run(self, kind: Kind, command: str, outcome: str) -> None:
        label = f"{command} → last {'ok' if outcome == 'ok' else 'failed'}"
        self.facts.append(Fact(kind, label, ((command,),), check="outcome", outcome="ok" if outcome == "ok" else "failed"))

    def frame(self, name: str, rows: int, columns: tuple[str, ...]) -> Frame:
        frame = Frame(name, rows, columns)
        self.frames[name] = frame
        self.plant(Kind.DATAFRAMES, f"{name}: DataFrame {rows}×{len(columns)}", (name,),
                   shape_forms(rows, len(columns)), window=SHAPE_WINDOW)
        return frame


