"""What the user runs in the notebook, recorded as it runs (SPEC §10).

From `%load_ext soba_nb` on, IPython's `pre_run_cell` / `post_run_cell` events tell us of
every cell: its execution count and source, and how it ended — the exception with its
traceback (ANSI codes stripped, IPython's own frames left out), the repr of its result
(`Out[n]`), the text it printed and the rich outputs it displayed (their mime types; images
kept as bytes). Printed text is seen through a tee on `sys.stdout` / `sys.stderr` for the
cell's duration, displays through the shell's display publisher. Everything is clipped as it
is recorded and the record is bounded (`KEPT_CELLS`), in memory only; soba's own magics are
not recorded (they are the conversation, not the notebook).

A `%soba` turn takes the cells recorded since the previous turn (`CellRecorder.since_turn`).
"""

from __future__ import annotations

import contextlib
import re
import sys
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from soba_nb.text import clip_middle
from soba_nb.transcript.entries import CellRecord

KEPT_CELLS = 200
"""Cells kept in memory (the oldest go first)."""
PRINTED_CHARS = 8000
"""Printed text kept per cell: its head and tail."""
RESULT_CHARS = 2000
"""The repr of a cell's result, clipped."""
IMAGE_BYTES = 8 * 1024 * 1024
"""An image kept per cell at most this large (bytes of the PNG/JPEG)."""
IMAGES_PER_CELL = 4
SOBA_MAGICS = re.compile(
    r"^\s*%{1,2}(soba|compact|budget|capsule|auto_compact|rewind|checkpoint)\b|^\s*%(re)?load_ext\s+soba_nb\b",
    re.MULTILINE,
)
"""A cell that uses soba's own magics is part of the conversation, not of the notebook."""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
IMAGE_TYPES = ("image/png", "image/jpeg")


@dataclass
class RecordedCell:
    """One cell as it ran (richer than what the model is told: images are kept)."""

    execution_count: int | None
    source: str
    error: str | None = None
    """`Type: message` and the traceback, ANSI stripped, IPython's frames left out."""
    result: str | None = None
    printed: str = ""
    displayed: list[str] = field(default_factory=list)
    """Mime types of the rich outputs, in order."""
    images: list[tuple[str, bytes]] = field(default_factory=list)
    """(mime type, bytes) of the images displayed."""

    def record(self) -> CellRecord:
        """What the model is told of the cell."""
        parts = []
        if self.printed:
            parts.append(self.printed.rstrip("\n"))
        if self.result is not None:
            parts.append(self.result)
        if self.displayed:
            parts.append("[displayed: " + ", ".join(dict.fromkeys(self.displayed)) + "]")
        return CellRecord(
            execution_count=self.execution_count,
            source=self.source,
            outcome="error" if self.error is not None else "ok",
            error=self.error,
            output="\n".join(parts) if parts else None,
        )


class _Tee:
    """A stream that writes through to `stream` and keeps the head and tail of what passed."""

    def __init__(self, stream: TextIO, sink: Callable[[str], None]):
        self._stream = stream
        self._sink = sink

    def write(self, text: str) -> int:
        self._sink(text)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, encoding, fileno, …
        return getattr(self._stream, name)


class _Printed:
    """The head and the tail of a cell's printed text, bounded."""

    def __init__(self, limit: int = PRINTED_CHARS):
        self.head: list[str] = []
        self.head_size = 0
        self.tail = ""
        self.dropped = 0
        self.limit = limit

    def add(self, text: str) -> None:
        if not isinstance(text, str) or not text:
            return
        half = self.limit // 2
        if self.head_size < half:
            take = text[: half - self.head_size]
            self.head.append(take)
            self.head_size += len(take)
            text = text[len(take) :]
        if text:
            joined = self.tail + text
            self.dropped += max(len(joined) - half, 0)
            self.tail = joined[-half:]

    def text(self) -> str:
        head = "".join(self.head)
        if not self.dropped:
            return head + self.tail
        return f"{head}\n[… {self.dropped} characters not kept …]\n{self.tail}"


class CellRecorder:
    """Records the cells of one shell (register once; `unregister` restores everything)."""

    def __init__(self, shell: Any, *, kept: int = KEPT_CELLS):
        self.shell = shell
        self.cells: deque[RecordedCell] = deque(maxlen=kept)
        self._recorded = 0
        """Cells recorded since the start (the deque forgets; this does not)."""
        self._taken = 0
        """`_recorded` at the last `since_turn`; None-like 0 before the first."""
        self._turns = 0
        self._current: RecordedCell | None = None
        self._printed: _Printed | None = None
        self._streams: tuple[Any, Any] | None = None
        self._publish: Any = None
        self._showtraceback: Any = None
        self._quiet = False
        """While the shell shows a traceback, what it prints is not recorded."""

    # -- the events ----------------------------------------------------------------------

    def register(self) -> None:
        events = self.shell.events
        events.register("pre_run_cell", self.pre_run_cell)
        events.register("post_run_cell", self.post_run_cell)
        publisher = getattr(self.shell, "display_pub", None)
        if publisher is not None and self._publish is None:
            self._publish = publisher.publish
            publisher.publish = self._published
        if self._showtraceback is None:
            # A terminal shell prints the traceback to the streams: it is the error, kept as
            # such, not printed text (a kernel sends it as an error message anyway).
            self._showtraceback = self.shell.showtraceback
            self.shell.showtraceback = self._traceback_shown

    def unregister(self) -> None:
        events = self.shell.events
        for name, callback in (("pre_run_cell", self.pre_run_cell), ("post_run_cell", self.post_run_cell)):
            with contextlib.suppress(ValueError):  # not registered
                events.unregister(name, callback)
        self._restore_streams()
        publisher = getattr(self.shell, "display_pub", None)
        if publisher is not None and self._publish is not None:
            publisher.publish = self._publish
            self._publish = None
        if self._showtraceback is not None:
            self.shell.showtraceback = self._showtraceback
            self._showtraceback = None

    def pre_run_cell(self, info: Any) -> None:
        source = getattr(info, "raw_cell", "") or ""
        if SOBA_MAGICS.search(source):
            self._current = None
            return
        self._current = RecordedCell(execution_count=None, source=source)
        self._printed = _Printed()
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = _Tee(sys.stdout, self._printed_text)
        sys.stderr = _Tee(sys.stderr, self._printed_text)

    def post_run_cell(self, result: Any) -> None:
        cell, printed = self._current, self._printed
        self._restore_streams()
        self._current = self._printed = None
        if cell is None:
            return
        count = getattr(result, "execution_count", None)
        cell.execution_count = count if isinstance(count, int) else None
        error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        if error is not None:
            cell.error = error_text(error)
        value = getattr(result, "result", None)
        if value is not None and error is None:
            cell.result = safe_repr(value)
        if printed is not None:
            cell.printed = _without_output_prompt(printed.text(), cell.execution_count)
        self.cells.append(cell)
        self._recorded += 1

    def _traceback_shown(self, *args: Any, **kwargs: Any) -> Any:
        self._quiet = True
        try:
            return self._showtraceback(*args, **kwargs)
        finally:
            self._quiet = False

    def _printed_text(self, text: str) -> None:
        if not self._quiet and self._printed is not None:
            self._printed.add(text)

    def _published(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        cell = self._current
        if cell is not None and isinstance(data, dict):
            cell.displayed.extend(str(key) for key in data if key != "text/plain")
            for mime in IMAGE_TYPES:
                image = data.get(mime)
                if image is not None and len(cell.images) < IMAGES_PER_CELL:
                    raw = image_bytes(image)
                    if raw is not None and len(raw) <= IMAGE_BYTES:
                        cell.images.append((mime, raw))
        return self._publish(data, *args, **kwargs)

    def _restore_streams(self) -> None:
        if self._streams is None:
            return
        out, err = self._streams
        if isinstance(sys.stdout, _Tee):
            sys.stdout = out
        if isinstance(sys.stderr, _Tee):
            sys.stderr = err
        self._streams = None

    # -- reading -------------------------------------------------------------------------

    def since_turn(self, *, first: int) -> list[RecordedCell]:
        """The cells run since the previous call (the last `first` at the first call), newest
        last; the next call starts from here."""
        new = self._recorded - self._taken
        if self._turns == 0:
            new = min(new, first)
        self._turns += 1
        self._taken = self._recorded
        return list(self.cells)[-new:] if new > 0 else []

    def by_count(self, first: int | None, last: int | None) -> list[RecordedCell]:
        """Recorded cells whose execution count lies in [first, last] (both optional)."""
        return [
            cell
            for cell in self.cells
            if cell.execution_count is not None
            and (first is None or cell.execution_count >= first)
            and (last is None or cell.execution_count <= last)
        ]

    def latest_error(self) -> RecordedCell | None:
        return next((cell for cell in reversed(self.cells) if cell.error is not None), None)


def _without_output_prompt(printed: str, count: int | None) -> str:
    """A terminal shell's display hook prints `Out[n]: …` to stdout: that is the result,
    already kept as such, not printed text."""
    prompt = f"Out[{count}]: "
    at = printed.rfind(prompt)
    if count is None or at < 0 or (at > 0 and printed[at - 1] != "\n"):
        return printed
    return printed[:at]


def error_text(error: BaseException) -> str:
    """`Type: message`, then the traceback without IPython's own frames."""
    head = f"{type(error).__name__}: {error}".rstrip()
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if not _ipython_frame(frame.filename)]
    lines = traceback.format_list(frames)
    body = "Traceback (most recent call last):\n" + "".join(lines) if lines else ""
    if isinstance(error, SyntaxError) and error.text:
        body += f"  line {error.lineno}: {error.text.rstrip()}\n"
    return _ANSI.sub("", head + ("\n" + body.rstrip() if body else ""))


def _ipython_frame(filename: str) -> bool:
    normalised = filename.replace("\\", "/")
    return "/IPython/" in normalised or "/ipykernel/" in normalised


def safe_repr(value: Any) -> str | None:
    """The repr of a cell's result, clipped; None when the repr itself raises."""
    try:
        text = repr(value)
    except Exception:  # the user's object: its repr may be broken
        return None
    return clip_middle(_ANSI.sub("", text), RESULT_CHARS)


def image_bytes(image: Any) -> bytes | None:
    """The bytes of a displayed image: `bytes`, or base64 text as Jupyter sends it."""
    if isinstance(image, bytes | bytearray):
        return bytes(image)
    if isinstance(image, str):
        import base64
        import binascii

        try:
            return base64.b64decode(image, validate=False)
        except (binascii.Error, ValueError):
            return None
    return None

