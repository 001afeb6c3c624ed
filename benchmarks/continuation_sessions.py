"""The sessions of the continuation benchmark (benchmarks/continuation.py): four data-science
sessions, each a script of steps. `build` plays a script into a real transcript in a folder of
its own: every `python` call's code is really run (by soba's `python` tool, in one namespace,
with the folder as working directory), so each figure in a result is what the code printed; a
user cell that fails is really run and its error recorded the way the notebook records it, and
`/fix` is soba's own expansion of it (`FIX_REQUEST`), with `typed="/fix"`.

Each session ends with a last question whose work is under way (three tool steps, no answer
yet): the benchmark compacts once with that question in the kept tail and once in the middle
of that work (the question and its first steps replaced).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

from soba_nb.agent.tools.base import ToolContext  # noqa: E402
from soba_nb.agent.tools.python_tool import PythonArguments
from soba_nb.agent.tools.python_tool import run as run_python
from soba_nb.transcript.entries import (
    CheckpointEntry,
    MessageEntry,
    SessionEntry,
    ToolCallEntry,
    ToolResultEntry,
)
from soba_nb.transcript.store import Transcript

ADD_CELL_RESULT = (
    "proposed a code cell ({lines} lines), not run: it goes below this cell when the turn ends, "
    "for the user to read and run"
)
"""What soba's add_cell tool answers outside the labextension (notebook.add_cell + holder)."""


@dataclass(frozen=True)
class User:
    """The user's message (a request, often with a decision in it)."""

    text: str


@dataclass(frozen=True)
class Fix:
    """The user runs `cell` (In [count]) and it fails; then types `/fix` (+ `extra`)."""

    cell: str
    count: int
    extra: str = ""


@dataclass(frozen=True)
class Py:
    """The agent says `say` (when given) and calls `python` with `code`."""

    code: str
    say: str = ""


@dataclass(frozen=True)
class AddCell:
    """The agent proposes a corrected cell (soba's add_cell tool)."""

    source: str


@dataclass(frozen=True)
class Answer:
    """The agent's answer, its {placeholders} filled from the namespace (real figures); the
    turn completes (soba records a `turn` checkpoint)."""

    text: str


@dataclass(frozen=True)
class UserCell:
    """The user runs a cell (the corrected one): it runs in the namespace, the agent does not see it."""

    code: str


Step = User | Fix | Py | AddCell | Answer | UserCell


@dataclass(frozen=True)
class Session:
    name: str
    kind: str
    steps: tuple[Step, ...]
    """Everything before the last question: replaced by the capsule in both variants."""
    last: tuple[Step, ...]
    """The last question and the first three steps of its work (no answer yet)."""
    figures: tuple[str, ...]
    """Patterns over the python results of `steps`: each group is a key figure, as printed."""
    columns: tuple[str, ...]
    """Column names the next model needs to know."""


@dataclass
class Built:
    """A session played into a transcript."""

    session: Session
    folder: Path
    transcript: Path
    namespace: dict[str, Any]
    codes: list[str]
    """Every piece of code run in the namespace, in order (agent calls and user cells)."""
    requests: list[tuple[str, str]] = field(default_factory=list)
    """(as typed, as sent) of each user message before the last question."""
    last_request: str = ""
    last_request_id: str = ""
    last_group_id: str = ""
    """The assistant message starting the last tool step (the mid-turn cut)."""
    figures: list[str] = field(default_factory=list)
    written: set[str] = field(default_factory=set)
    """Files the session's code really wrote (relative to its folder)."""


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(path.relative_to(folder)): (path.stat().st_mtime_ns, path.stat().st_size)
        for path in folder.rglob("*")
        if path.is_file() and ".soba" not in path.parts and not path.name.endswith((".jsonl", ".json", ".lock"))
    }


def run_code(code: str, namespace: dict[str, Any], folder: Path) -> tuple[str, bool]:
    """`code` run by soba's python tool in `namespace`, from `folder`: (content, is_error)."""
    with contextlib.chdir(folder):
        outcome = run_python(PythonArguments(code=code), ToolContext(project_root=folder, namespace=namespace))
    return outcome.content, outcome.is_error


def _cell_error(code: str, count: int, namespace: dict[str, Any], folder: Path) -> str:
    """The user's cell run for real; the error as the notebook records it (`error_text`)."""
    from soba_nb.notebook.cell_text import error_text

    name = f"<ipython-input-{count}>"
    try:
        with contextlib.chdir(folder):
            exec(compile(code, name, "exec"), namespace)
    except Exception as exc:  # the cell's own failure: what /fix is about
        exc.__traceback__ = exc.__traceback__.tb_next if exc.__traceback__ else None  # (this function's frame)
        return error_text(exc, lambda filename: f"In [{count}]" if filename == name else None)
    raise AssertionError(f"the failing cell In [{count}] did not fail")


def build(session: Session, folder: Path) -> Built:
    """Play `session` into `folder/session.jsonl`, running its code for real."""
    from soba_nb.compaction.cells_context import fence_for
    from soba_nb.notebook.magics import FIX_REQUEST

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "session.jsonl"
    namespace: dict[str, Any] = {"__name__": "__main__"}
    built = Built(session, folder, path, namespace, [])
    results: list[str] = []
    calls = 0
    with Transcript.open(path, create_header=SessionEntry(model="openai/gpt-4o")) as store:
        for index, step in enumerate((*session.steps, *session.last)):
            # By the class's name: this module may be loaded twice (as benchmarks.… and alone).
            kind, in_last = type(step).__name__, index >= len(session.steps)
            if kind == "User":
                entry = store.append(MessageEntry(role="user", content=step.text))
                if in_last:
                    built.last_request, built.last_request_id = step.text, entry.id
                else:
                    built.requests.append((step.text, step.text))
            elif kind == "Fix":
                error = _cell_error(step.cell, step.count, namespace, folder)
                built.codes.append(step.cell)
                extra = f"\n\nAlso: {step.extra}" if step.extra else ""
                content = FIX_REQUEST.format(
                    count=step.count, source=step.cell, fence=fence_for(step.cell), error=error,
                    error_fence=fence_for(error), extra=extra,
                )  # fmt: skip
                typed = f"/fix {step.extra}".rstrip()
                store.append(MessageEntry(role="user", content=content, typed=typed))
                built.requests.append((typed, content))
            elif kind == "Py":
                calls += 1
                call_id = f"call_{session.name}_{calls}"
                if step.say:
                    built.last_group_id = store.append(MessageEntry(role="assistant", content=step.say)).id
                before = _files(folder)
                content, is_error = run_code(step.code, namespace, folder)
                after = _files(folder)
                built.written |= {name for name, stamp in after.items() if before.get(name) != stamp}
                built.codes.append(step.code)
                store.append(ToolCallEntry(call_id=call_id, name="python", arguments=json.dumps({"code": step.code})))
                store.append(ToolResultEntry(call_id=call_id, name="python", content=content, is_error=is_error))
                if not in_last:
                    results.append(content)
            elif kind == "AddCell":
                calls += 1
                call_id = f"call_{session.name}_{calls}"
                store.append(ToolCallEntry(call_id=call_id, name="add_cell", arguments=json.dumps({"source": step.source})))
                lines = len(step.source.splitlines())
                store.append(ToolResultEntry(call_id=call_id, name="add_cell", content=ADD_CELL_RESULT.format(lines=lines)))
            elif kind == "Answer":
                store.append(MessageEntry(role="assistant", content=step.text.format_map(namespace)))
                store.append(CheckpointEntry(kind="turn"))
            elif kind == "UserCell":
                with contextlib.chdir(folder):
                    exec(compile(step.code, "<user cell>", "exec"), namespace)
                built.codes.append(step.code)
            else:
                raise TypeError(f"session {session.name}: unknown step {kind}")
    built.figures = key_figures(session.figures, results)
    return built


def key_figures(patterns: Sequence[str], results: Sequence[str]) -> list[str]:
    """The key figures as the session's code printed them (each group of each pattern)."""
    text = "\n".join(results)
    found: list[str] = []
    for pattern in patterns:
        match = re.search(pattern, text)
        if match is None:
            raise AssertionError(f"key figure {pattern!r} is in no result: the session's code changed")
        found.extend(group for group in match.groups() if group is not None)
    return found


def replay(codes: Sequence[str], folder: Path) -> dict[str, Any]:
    """A namespace rebuilt by running `codes` again from `folder` (a baseline in another
    process: the same seeds give the same data). A cell that failed fails again, harmlessly."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        for code in codes:
            with contextlib.suppress(Exception), contextlib.redirect_stdout(io.StringIO()):
                exec(compile(code, "<replay>", "exec"), namespace)
    finally:
        os.chdir(cwd)
    return namespace
