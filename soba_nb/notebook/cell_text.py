"""A notebook cell's texts made fit to read and to keep (SPEC §10): printed text bounded to its
head and tail as it streams, text as a terminal shows it (ANSI codes stripped, a progress bar
as it ends, control characters escaped), an exception as `Type: message` and the traceback
without IPython's frames and with short paths (`pandas/core/frame.py`, never the install prefix:
it costs tokens in every request and says nothing the model needs), and clipping that never cuts a word in two — a secret cut in two
would no longer be recognised by the redaction that runs later.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Callable

from soba_nb.printable import printable

PRINTED_CHARS = 8000
"""Printed text kept per cell: its head and tail."""
ERROR_CHARS = 16_000
"""A cell's error text, kept at most this long (head and tail)."""
TAIL_PIECES = 512
"""The tail's pieces are joined and trimmed when there are more than this many (print writes
its text and its newline apart: many small pieces)."""
TOKEN_WINDOW = 512
"""A cut moves back (or on) to the nearest whitespace within this many characters, so no word
is split: a secret cut in two would no longer be recognised by the redaction."""
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
CLIPPED = "[… {count} characters not kept …]"
LIBRARY_FOLDERS = ("site-packages", "dist-packages")
"""A library's file is named by its path after the last of these (`pandas/core/frame.py`)."""
_FRAME_PATHS = (
    re.compile(r'(?P<lead>File ")(?P<path>[^"\n]+)(?P<end>", line \d+)'),  # Python's `File "…", line N`
    re.compile(r"(?P<lead>File )(?P<path>(?:/|[A-Za-z]:[\\/])[^\n]*?)(?P<end>:\d+)"),  # IPython's `File …:N, in f`
)


class PrintedText:
    """The head and the tail of a cell's printed text, bounded; amortised O(1) a write."""

    def __init__(self, limit: int = PRINTED_CHARS):
        self.half = limit // 2
        self.head: list[str] = []
        self.head_size = 0
        self.tail: list[str] = []
        self.tail_size = 0
        self.seen = 0

    def add(self, text: str) -> None:
        if not isinstance(text, str) or not text:
            return
        self.seen += len(text)
        taken = 0
        if self.head_size < self.half:
            take = text[: self.half - self.head_size]
            self.head.append(take)
            taken = len(take)
            self.head_size += taken
            if taken == len(text):
                return
        if len(text) - taken >= self.half:  # (no copy of the rest: it may be 10 MB)
            self.tail, self.tail_size = [text[-self.half :]], self.half
            return
        piece = text[taken:] if taken else text
        self.tail.append(piece)
        self.tail_size += len(piece)
        if self.tail_size > 2 * self.half or len(self.tail) > TAIL_PIECES:
            kept = "".join(self.tail)[-self.half :]
            self.tail, self.tail_size = [kept], len(kept)

    def text(self) -> str:
        head, tail = "".join(self.head), "".join(self.tail)[-self.half :]
        if self.seen == len(head) + len(tail):
            return head + tail
        head, tail = word_head(head), word_tail(tail)
        return f"{head}\n{CLIPPED.format(count=self.seen - len(head) - len(tail))}\n{tail}"


def terminal_text(text: str, *, rewrites: bool = True) -> str:
    """Text as a terminal (or Jupyter) would show it: ANSI codes stripped, a line rewritten
    after `\\r` (a progress bar) shown as it ends (`rewrites`), other control characters
    escaped."""
    text = _ANSI.sub("", text)
    if rewrites and "\r" in text:
        lines = []
        for line in text.replace("\r\n", "\n").split("\n"):
            shown, *overwrites = line.split("\r")
            for overwrite in overwrites:
                shown = overwrite + shown[len(overwrite) :]
            lines.append(shown)
        text = "\n".join(lines)
    return printable(text, lines=True)


def word_head(text: str) -> str:
    """`text` without the word it ends in the middle of (within `TOKEN_WINDOW`)."""
    if not text or text[-1].isspace():
        return text
    at = max(text.rfind(" ", len(text) - TOKEN_WINDOW), text.rfind("\n", len(text) - TOKEN_WINDOW))
    return text[: at + 1] if at >= 0 else text


def word_tail(text: str) -> str:
    """`text` without the word it starts in the middle of (within `TOKEN_WINDOW`)."""
    if not text or text[0].isspace():
        return text
    found = [at for at in (text.find(" ", 0, TOKEN_WINDOW), text.find("\n", 0, TOKEN_WINDOW)) if at >= 0]
    return text[min(found) :] if found else text


def clip_words(text: str, limit: int) -> str:
    """`text`, or its head and tail around a note when longer than `limit`, cut between words."""
    if len(text) <= limit:
        return text
    head, tail = word_head(text[: limit // 2]), word_tail(text[len(text) - limit // 2 :])
    return f"{head}\n{CLIPPED.format(count=len(text) - len(head) - len(tail))}\n{tail}"


def exception_line(error: BaseException) -> str:
    """`Type: message` (the message's own `str` may raise: the user's exception class)."""
    try:
        message = str(error)
    except Exception:
        message = "<the message could not be shown>"
    name = type(error).__name__
    return f"{name}: {message}" if message else name


def error_text(error: BaseException, cell_name: Callable[[str], str | None] = lambda _: None) -> str:
    """`Type: message`, then the traceback without IPython's own frames (repeated frames, as
    in a RecursionError, said once with a count; a cell's own frames named `In [n]` by
    `cell_name`, other files by their short paths: `short_path`), bounded."""
    frames = [_shown(frame, cell_name) for frame in traceback.extract_tb(error.__traceback__) if not _ipython_frame(frame.filename)]
    lines = traceback.StackSummary.from_list(frames).format()
    body = "Traceback (most recent call last):\n" + "".join(lines) if lines else ""
    if isinstance(error, SyntaxError) and error.text:
        body += f"  line {error.lineno}: {error.text.rstrip()}\n"
    head = short_paths(exception_line(error))  # a message may quote a traceback (a worker's)
    if isinstance(error, SyntaxError) and (name := cell_name(error.filename or "")) is not None:
        head = f"{type(error).__name__}: {error.msg} ({name}, line {error.lineno})"
    head = clip_words(head, ERROR_CHARS // 4)
    text = head + ("\n" + body.rstrip() if body else "")
    return terminal_text(clip_words(text, ERROR_CHARS), rewrites=False)


def _shown(frame: traceback.FrameSummary, cell_name: Callable[[str], str | None]) -> traceback.FrameSummary:
    """`frame` as the model reads it: a cell's file named `In [n]`, any other file by its short
    path; the cell's own top-level frame (`<module>`) without its line, since the cell's source
    goes with its error wherever the error goes (the cells block, `read_cells`, `/fix`). A renamed
    frame keeps its line but not its columns (Python's carets would no longer line up)."""
    cell = cell_name(frame.filename)
    if cell is not None and frame.name == "<module>":
        return traceback.FrameSummary(cell, frame.lineno, frame.name, line="")
    name = cell or short_path(frame.filename)
    if name == frame.filename:
        return frame
    return traceback.FrameSummary(name, frame.lineno, frame.name, line=frame.line)


def _ipython_frame(filename: str) -> bool:
    normalised = filename.replace("\\", "/")
    return "/IPython/" in normalised or "/ipykernel/" in normalised or "/soba_nb/notebook/cells.py" in normalised


def short_path(filename: str) -> str:
    """`filename` as the model needs it: a library's file after `site-packages/` or
    `dist-packages/` (`pandas/core/frame.py`), the standard library's relative to it
    (`json/decoder.py`), a file in the working folder (the project's, in a kernel) relative to
    it, anything else under the install prefixes (`sys.prefix`, `sys.base_prefix`) relative to
    that prefix, under the home folder as `~/…`; `<frozen …>`, `<string>` and other files as
    they are."""
    if not filename or filename.startswith("<"):
        return filename
    normalised = filename.replace("\\", "/")
    for folder in LIBRARY_FOLDERS:
        at = normalised.rfind(f"/{folder}/")
        if at >= 0:
            return normalised[at + len(folder) + 2 :]
    for roots in (_stdlib_folders(), _working_folder(), _install_prefixes(), _home_folder()):
        for root, shown_as in roots:
            if normalised.startswith(root + "/"):
                return shown_as + normalised[len(root) + 1 :]
    return filename


def short_paths(text: str) -> str:
    """`text` with the file of every traceback line shortened by `short_path`, in Python's
    shape (`File "/usr/lib/python3/dist-packages/pandas/core/frame.py", line 13788, in groupby`)
    and in IPython's (`File /usr/lib/python3/dist-packages/pandas/core/frame.py:13788, in
    DataFrame.groupby(self, by, ...)`)."""
    for pattern in _FRAME_PATHS:
        text = pattern.sub(lambda m: m["lead"] + short_path(m["path"]) + m["end"], text)
    return text


def _folders(paths: list[str], shown_as: str = "") -> list[tuple[str, str]]:
    """Absolute folders, without a trailing `/` (the root itself is never one: it would hold
    every file), longest first so that the most specific one names a file."""
    folders = {path.replace("\\", "/").rstrip("/") for path in paths if path and os.path.isabs(path)}
    return [(folder, shown_as) for folder in sorted(folders, key=len, reverse=True) if folder.strip("/")]


def _stdlib_folders() -> list[tuple[str, str]]:
    return _folders([os.path.dirname(os.__file__), os.path.dirname(traceback.__file__)])


def _install_prefixes() -> list[tuple[str, str]]:
    return _folders([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix])


def _working_folder() -> list[tuple[str, str]]:
    try:
        return _folders([os.getcwd()])
    except OSError:  # the working folder was deleted
        return []


def _home_folder() -> list[tuple[str, str]]:
    return _folders([os.path.expanduser("~")], "~/")
