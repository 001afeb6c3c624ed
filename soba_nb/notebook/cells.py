"""What the user runs in the notebook, recorded as it runs (SPEC §10).

From `%load_ext soba_nb` on, IPython's `pre_run_cell` / `post_run_cell` events tell us of
every cell: its execution count and source, and how it ended — the exception with its
traceback (ANSI codes stripped, IPython's own frames left out), its result as the shell
showed it (`Out[n]`), the text it printed and the rich outputs it displayed (their mime
types; images kept as bytes). Printed text is seen through a tee on `sys.stdout` /
`sys.stderr` for the cell's duration, the result through the display hook, displays through
the shell's display publisher. Everything is clipped as it is recorded and the record is
bounded (`KEPT_CELLS` cells, `IMAGE_BYTES_KEPT` of images), in memory only.

Not recorded: soba's own magics (they are the conversation, not the notebook), cells run with
`store_history=False` (a frontend's or a library's own code: no `In [n]`), and a cell run from
within a cell (`get_ipython().run_cell(…)`: part of the cell that ran it).

A `%soba` turn takes the cells recorded since the previous turn (`CellRecorder.since_turn`),
redacted (`RecordedCell.record`) before anything measures or clips them; the printed text and
the result (`Out[n]`) stay apart, and the holder keeps each image as an artifact
(`SessionHolder.cells_since_turn`) that the record lists, for the cells block to name and for
a model that takes images to see. An image the record did not keep (too large, too many, or
dropped to bound the record) is named with the reason.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from msgspec import UNSET

from soba_nb.agent.soba_magics import SOBA_MAGICS
from soba_nb.notebook.cell_text import (
    PrintedText,
    clip_words,
    error_text,
    exception_line,
    terminal_text,
)
from soba_nb.redact import redact
from soba_nb.transcript.entries import CellRecord

KEPT_CELLS = 200
"""Cells kept in memory (the oldest go first)."""
RESULT_CHARS = 2000
"""A cell's result (`Out[n]`) as the shell showed it, clipped."""
SOURCE_CHARS = 64_000
"""A cell's source, kept at most this long (head and tail)."""
IMAGE_BYTES = 8 * 1024 * 1024
"""An image kept per cell at most this large (bytes of the PNG/JPEG)."""
IMAGES_PER_CELL = 4
IMAGE_BYTES_KEPT = 32 * 1024 * 1024
"""Images kept over all recorded cells; the oldest cells' images go first."""
IMAGE_TYPES = ("image/png", "image/jpeg")
DROPPED = f"dropped to keep the record's images under {IMAGE_BYTES_KEPT // (1024 * 1024)} MB"


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
    """Mime types of the rich outputs, each once, in the order first displayed."""
    images: list[tuple[str, bytes]] = field(default_factory=list)
    """(mime type, bytes) of the images displayed."""
    not_kept: dict[str, int] = field(default_factory=dict)
    """`mime not kept: why` → how many of the images it displayed the record did not keep
    (too large, too many, bytes that are not base64, dropped to bound the record)."""
    cell_id: str | None = None
    """The notebook cell's id, as JupyterLab and Notebook 7 send it in the execute_request's
    metadata (IPython's `ExecutionInfo.cell_id`); None from other frontends. `edit_cell` names
    the cell by it."""

    def record(self) -> CellRecord:
        """What the model is told of the cell, redacted (then measured and clipped: a secret
        is never cut into pieces the redaction would no longer recognise). Its images are
        not in it: the holder keeps them as artifacts when a turn takes the cell."""
        parts = []
        if self.result is not None:
            parts.append(self.result)
        kinds = [kind for kind in self.displayed if kind not in IMAGE_TYPES]
        if kinds:
            parts.append("[displayed: " + ", ".join(kinds) + "]")
        printed = self.printed.rstrip("\n")
        return CellRecord(
            execution_count=self.execution_count,
            source=redact(self.source),
            outcome="error" if self.error is not None else "ok",
            error=None if self.error is None else redact(self.error),
            output=redact("\n".join(parts)) if parts else None,
            printed=redact(printed) if printed else UNSET,
            images_not_kept=[why if n == 1 else f"{why} (×{n})" for why, n in self.not_kept.items()] or UNSET,
        )

    def left_out(self, mime: str, why: str) -> None:
        key = f"{mime} not kept: {why}"
        self.not_kept[key] = self.not_kept.get(key, 0) + 1


class _Tee:
    """A stream that writes through to `stream` and tells the recorder what passed.

    It passes for the stream it wraps (`isinstance(sys.stdout, OutStream)`, or click asking
    whether its class comes from ipykernel, answer as without soba); `type()` still tells."""

    def __init__(self, stream: TextIO, recorder: CellRecorder):
        self._stream = stream
        self._recorder = recorder

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        stream = self.__dict__.get("_stream")
        return _Tee if stream is None else type(stream)

    def write(self, text: str) -> Any:
        return self._recorder.printed_through(self._stream, text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, encoding, fileno, …
        if name in ("_stream", "_recorder"):  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self._stream, name)


def _untee(stream: Any) -> Any:
    """The stream under any of our tees (one a cell saved and put back, say)."""
    while type(stream) is _Tee:
        stream = stream._stream
    return stream


@dataclass
class _Capture:
    """What is being recorded of the running cell."""

    cell: RecordedCell
    printed: PrintedText = field(default_factory=PrintedText)
    result: str | None = None


class CellRecorder:
    """Records the cells of one shell (register once; `unregister` restores everything)."""

    def __init__(self, shell: Any, *, kept: int = KEPT_CELLS):
        self.shell = shell
        self.cells: deque[RecordedCell] = deque(maxlen=kept)
        self._recorded = 0
        """Cells recorded since the start (the deque forgets; this does not)."""
        self._taken = 0
        """`_recorded` at the last `since_turn`."""
        self._turns = 0
        self.outcomes: dict[int, bool] = {}
        """Execution count → whether the cell ran without error, for every cell recorded (the
        deque forgets cells; this small map does not: `/code` and `/rebuild` read it)."""
        self.sources: dict[int, str] = {}
        """Execution count → the cell's source as typed, whole, for every cell run with an
        execution count since `register` (soba's magics included: `cell_sources` sorts them).
        Kept by count, not read back from IPython's history list, whose index drifts from the
        count after a cell IPython does not store (`exit`) or one its transformers refused."""
        self.first_count: int | None = None
        """The shell's execution count when recording started: cells up to it ran before (their
        sources are read from IPython's history), later ones are in `sources`."""
        self._running: list[Any] = []
        """The `ExecutionInfo` of each cell running, outermost first (a cell may run one)."""
        self._capture: _Capture | None = None
        """The outermost running cell's record, when it is one to keep."""
        self._image_bytes = 0
        self._wrapped: list[tuple[Any, str, bool, Any]] = []
        """(object, attribute, whether it had its own, what it was) for each hook we wrap."""
        self._local = threading.local()
        """`writing`: a tee of ours is writing on this thread (a tee under it does not count
        the same text again)."""
        self._quiet = False
        """While the shell shows a traceback, what it prints is not recorded."""
        self._formatting = False
        """The display hook is computing the cell's result (a traceback then is its repr's)."""

    # -- the events ----------------------------------------------------------------------

    def register(self) -> None:
        if self._wrapped:
            return
        count = getattr(self.shell, "execution_count", None)
        self.first_count = count if isinstance(count, int) else None
        events = self.shell.events
        events.register("pre_run_cell", self.pre_run_cell)
        events.register("post_run_cell", self.post_run_cell)
        self._wrap(getattr(self.shell, "display_pub", None), "publish", self._published)
        self._wrap(getattr(self.shell, "displayhook", None), "compute_format_data", self._formatted)
        # A terminal shell prints the traceback (syntax errors too) to the streams: it is the
        # error, kept as such, not printed text (a kernel sends it as an error message).
        self._wrap(self.shell, "_showtraceback", self._traceback_shown)

    def unregister(self) -> None:
        events = self.shell.events
        for name, callback in (("pre_run_cell", self.pre_run_cell), ("post_run_cell", self.post_run_cell)):
            if callback in events.callbacks.get(name, ()):
                events.unregister(name, callback)
        self._remove_tees()
        self._running.clear()
        self._capture = None
        for owner, name, own, previous in reversed(self._wrapped):
            if own:
                setattr(owner, name, previous)
            else:
                vars(owner).pop(name, None)
        self._wrapped.clear()

    def _wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        """Put `make(original)` on `owner` as an instance attribute (restored by `unregister`)."""
        original = getattr(owner, name, None) if owner is not None else None
        if original is None:
            return
        self._wrapped.append((owner, name, name in vars(owner), original))
        setattr(owner, name, make(original))

    def pre_run_cell(self, info: Any) -> None:
        self._running.append(info)
        if len(self._running) > 1:
            return  # run from within a cell: part of that cell
        source = getattr(info, "raw_cell", "") or ""
        if not getattr(info, "store_history", True) or SOBA_MAGICS.search(source):
            return
        cell_id = getattr(info, "cell_id", None)
        cell = RecordedCell(execution_count=None, source=clip_words(source, SOURCE_CHARS))
        cell.cell_id = cell_id if isinstance(cell_id, str) and cell_id else None
        self._capture = _Capture(cell)
        self._install_tees()

    def post_run_cell(self, result: Any) -> None:
        if not self._running:
            return  # the cell that loaded us
        info = getattr(result, "info", None)
        if any(running is info for running in self._running):
            while self._running.pop() is not info:
                pass
        else:  # an interrupted kernel reports no result
            self._running.pop()
        if self._running:
            return
        count = getattr(result, "execution_count", None)
        if isinstance(count, int) and getattr(info, "store_history", False):
            self.sources[count] = getattr(info, "raw_cell", "") or ""
        capture, self._capture = self._capture, None
        self._remove_tees()
        if capture is not None:
            self._keep(capture, result)
        elif isinstance(count, int) and getattr(info, "store_history", False):
            # A cell with soba's magics beside its code: not the model's to read, but its
            # other lines are the user's code (`/code`, `/rebuild`), so how it ended is kept.
            failed = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
            self.outcomes[count] = failed is None

    def _keep(self, capture: _Capture, result: Any) -> None:
        cell = capture.cell
        count = getattr(result, "execution_count", None)
        cell.execution_count = count if isinstance(count, int) else None
        error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        if error is not None:
            cell.error = error_text(error, self._cell_name)
        elif capture.result is not None:
            cell.result = capture.result
        cell.printed = terminal_text(_without_output_prompt(capture.printed.text(), cell.execution_count))
        if len(self.cells) == self.cells.maxlen:
            self._image_bytes -= sum(len(raw) for _, raw in self.cells[0].images)
        self.cells.append(cell)
        if cell.execution_count is not None:
            self.outcomes[cell.execution_count] = cell.error is None
        self._recorded += 1
        self._bound_images()

    def _cell_name(self, filename: str) -> str | None:
        """`In [3]` for a file name the shell compiled a cell under (`<ipython-input-3-…>`, a
        kernel's `/tmp/ipykernel_…/….py`), as a notebook shows it; None for any other file."""
        compiled = getattr(getattr(self.shell, "compile", None), "_filename_map", None)
        number = compiled.get(filename) if isinstance(compiled, dict) else None
        return f"In [{number}]" if number is not None else None

    def _bound_images(self) -> None:
        self._image_bytes += sum(len(raw) for _, raw in self.cells[-1].images)
        for old in self.cells:
            if self._image_bytes <= IMAGE_BYTES_KEPT:
                return
            self._image_bytes -= sum(len(raw) for _, raw in old.images)
            for mime, _ in old.images:
                old.left_out(mime, DROPPED)
            old.images = []

    # -- the hooks -----------------------------------------------------------------------

    def printed_through(self, stream: Any, text: str) -> Any:
        """A tee's write: `text` recorded for the running cell, then written to `stream` (what
        that returns is returned: a user's stream may return None)."""
        local = self._local
        if getattr(local, "writing", False):
            return stream.write(text)
        local.writing = True
        try:
            capture = self._capture
            if capture is not None and not self._quiet:
                capture.printed.add(text)
            return stream.write(text)
        finally:
            local.writing = False

    def _traceback_shown(self, original: Any) -> Any:
        def shown(*args: Any, **kwargs: Any) -> Any:
            capture = self._capture
            if self._formatting and capture is not None and len(args) > 1:
                capture.result = f"[its repr raised {exception_line(args[1])}]"
            self._quiet = True
            try:
                return original(*args, **kwargs)
            finally:
                self._quiet = False

        return shown

    def _formatted(self, original: Any) -> Any:
        def formatted(result: Any) -> Any:
            self._formatting = True
            try:
                data = original(result)
            finally:
                self._formatting = False
            capture = self._capture
            format_dict = data[0] if isinstance(data, tuple) and data else None
            if capture is not None and isinstance(format_dict, dict):
                text = format_dict.get("text/plain")
                if isinstance(text, str):
                    capture.result = terminal_text(clip_words(text, RESULT_CHARS))
            return data

        return formatted

    def _published(self, original: Any) -> Any:
        def published(data: Any, *args: Any, **kwargs: Any) -> Any:
            capture = self._capture
            if capture is not None and isinstance(data, dict):
                cell = capture.cell
                # Each kind once, in order: a loop displaying a million times keeps a few names.
                cell.displayed.extend(str(key) for key in data if key != "text/plain" and key not in cell.displayed)
                for mime in IMAGE_TYPES:
                    image = data.get(mime)
                    if image is None:
                        continue
                    raw = image_bytes(image) if len(cell.images) < IMAGES_PER_CELL else b""
                    if len(cell.images) >= IMAGES_PER_CELL:
                        cell.left_out(mime, f"more than {IMAGES_PER_CELL} images in one cell")
                    elif raw is None:
                        cell.left_out(mime, "its data is neither bytes nor base64 text")
                    elif len(raw) > IMAGE_BYTES:
                        cell.left_out(mime, f"larger than {IMAGE_BYTES // (1024 * 1024)} MB")
                    else:
                        cell.images.append((mime, raw))
            # A terminal shell's publisher prints the display's text (`<Figure size …>`): it is
            # the display, named above, not printed text (a kernel sends it as display data).
            quiet, self._quiet = self._quiet, True
            try:
                return original(data, *args, **kwargs)
            finally:
                self._quiet = quiet

        return published

    def _install_tees(self) -> None:
        sys.stdout = _Tee(_untee(sys.stdout), self)
        sys.stderr = _Tee(_untee(sys.stderr), self)

    @staticmethod
    def _remove_tees() -> None:
        """No tee stays installed; a stream the cell put there itself stays (it is the user's)."""
        if type(sys.stdout) is _Tee:
            sys.stdout = _untee(sys.stdout)
        if type(sys.stderr) is _Tee:
            sys.stderr = _untee(sys.stderr)

    # -- reading -------------------------------------------------------------------------

    def since_turn(self, *, first: int, session_start: bool = False) -> list[RecordedCell]:
        """The cells run since the previous call (the last `first` at the first call, and at
        a session's first turn), newest last; the next call starts from here."""
        new = self._recorded - self._taken
        if self._turns == 0 or session_start:
            new = min(self._recorded, first)
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
