"""What every agent tool shares: the context it runs in, its outcome, and path confinement.

A tool never raises to the turn loop: a problem the model can fix (a bad path, a missing
match, a failing command) is a `ToolOutcome` with `is_error=True` that the model sees.
Tools raise `ToolError` internally; the registry turns it into such an outcome.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from soba_nb.compaction.model_input import TOOL_OUTPUT_LIMIT_CHARS
from soba_nb.transcript.entries import CellRecord, FileChange

CellKind = Literal["code", "markdown"]

CLIPPED = f" Output over {TOOL_OUTPUT_LIMIT_CHARS:,} characters is clipped."
"""Every tool's description ends with this (SPEC §15): the model knows a long result is cut
(model input clips it, head and tail kept; the transcript holds it whole)."""


@dataclass(frozen=True)
class NotebookAccess:
    """What the notebook layer lends the tools for one turn."""

    cells: Callable[[int | None, int | None], Sequence[CellRecord]]
    """The recorded cells with execution counts in [first, last] (both optional)."""
    propose: Callable[[str, CellKind], str]
    """Put a proposed cell below the current one; returns how it was put there (one line)."""
    notebook: Path | None = None
    """This notebook's file, when the kernel knows it."""
    recorded: Callable[[], Sequence[int]] = tuple
    """The execution counts of the recorded cells, oldest first (`edit_cell` names them)."""
    edit: Callable[[int, str], str] | None = None
    """Propose a new source for the recorded cell In [n] (it must be one of `recorded`); returns
    how the proposal reaches the user (one line). None: edits cannot be proposed here."""


@dataclass(frozen=True)
class DisplayedImage:
    """An image a tool call displayed: its mime type and bytes, as the frontend got them."""

    mime: str
    data: bytes


class DisplayCapture(Protocol):
    """What the notebook lends the `python` tool to see what a call displays (SPEC §10): the
    images it shows reach the cell as usual and are kept for the receipt and the model."""

    def capture(self) -> AbstractContextManager[list[DisplayedImage]]:
        """Within the block, every image displayed is also appended to the list it yields
        (a matplotlib figure under the inline backend is shown, and so kept, at its end)."""
        ...

    def show(self, value: Any) -> bool:
        """Display `value` (a call's last expression) as the notebook would when it has an
        image representation; True when it did."""
        ...


@dataclass
class ToolContext:
    """Where and with what a tool call runs."""

    project_root: Path
    """The project folder: file tools are confined to it, `shell` runs in it."""
    namespace: dict[str, Any]
    """The notebook's user namespace (`user_ns`); the `python` tool runs in it."""
    record_checkpoint: Callable[[str, str], str] | None = None
    """`record_checkpoint(kind, note) -> checkpoint_id`; None when the session has none."""
    cancel: threading.Event | None = None
    """Set when the user cancels the turn; long-running tools (shell) stop early."""
    notebook: NotebookAccess | None = None
    """The notebook's cells and the way to propose one (None outside a notebook)."""
    displays: DisplayCapture | None = None
    """How the `python` tool sees what a call displays (None outside a notebook: nothing)."""
    keep_version: Callable[[bytes], str] | None = None
    """Keep a file's bytes for `%rewind --files`, returning their sha256 (raises `OSError`
    when it cannot); None: no session keeps versions (the write goes ahead unrecorded)."""
    session_files: frozenset[Path] = frozenset()
    """The open session's own files (transcript and side-cars, resolved): the file tools never
    write them, even where `%soba --session PATH` put them outside a `.soba` folder."""
    transform: Callable[[str], str] | None = None
    """The shell's input transformation (`InteractiveShell.transform_cell`): the `python` tool
    runs what a cell runs, magics and `!command` included; None outside IPython (plain Python)."""
    turn_deadline: float | None = None
    """When the turn's time is up (`time.monotonic()`): the `python` tool's default limit is what
    is left of it; None: no turn, no default limit."""


@dataclass(frozen=True)
class ToolOutcome:
    """The result the model sees: the whole content (clipping happens in model input)."""

    content: str
    is_error: bool = False
    images: tuple[DisplayedImage, ...] = ()
    """Images the call displayed (kept as artifacts, named in the content, sent to models
    that take images)."""
    files: tuple[FileChange, ...] = ()
    """The file the call wrote or edited, its versions kept (`ToolContext.keep_version`)."""


def optional_parameter(schema: dict[str, Any]) -> None:
    """An optional parameter's schema as its type and description alone: null is accepted and
    absent is the default; its bounds are checked when a call comes, not spelled out (every
    request carries the schemas)."""
    options = schema.pop("anyOf", [])
    schema.update(next((option for option in options if option.get("type") != "null"), {}))
    for key in ("default", "minimum", "maximum", "exclusiveMinimum"):
        schema.pop(key, None)


class ToolError(Exception):
    """A problem the model can act on; its message becomes an error outcome verbatim."""


class ToolArguments(BaseModel):
    """Base of every tool's argument model: unknown parameters and loose types are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


def resolve_in_project(tool: str, path: str, project_root: Path) -> Path:
    """Resolve `path` (relative to the project root, or absolute) and refuse anything outside.

    Resolving follows symlinks, so a link inside the project that points out is refused too.
    """
    root = project_root.resolve()
    if not path.strip():
        raise ToolError(f"{tool}: path is empty")
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = root / candidate
    try:
        resolved = candidate.resolve(strict=False)
    except (OSError, RuntimeError) as error:  # RuntimeError: symlink loop on Python < 3.13
        raise ToolError(f"{tool}: cannot resolve path '{path}': {error}") from error
    if not resolved.is_relative_to(root):
        raise ToolError(f"{tool}: path '{path}' is outside the project folder {root}")
    return resolved
