"""File tools: `read_file`, `write_file`, `edit_file`, `list_files`.

All paths are relative to the project folder (absolute paths are accepted when they lie
inside it) and are refused when they lead outside it, through `..` or a symlink; the checks
are made on the opened descriptors, so a path swapped during the call cannot escape either
(`soba_nb.agent.tools.confined`). Soba's own files (`soba_nb.own_files`: session folders,
`.soba/`, `soba.json`, `~/.soba/`, the open session's transcript) can be read and listed but
never written or edited. Text is UTF-8 and written byte for byte.

`read_file(path, start_line, end_line)` reads the whole file, or lines `start_line` to
`end_line` (1-based, both included; either may be left out: from the first line, to the last;
an end past the file is its end). A line ends at `\n` (a `\r\n` file's lines keep their `\r`).
The result starts with one line saying which lines it holds, `[lines 40–80 of 1,203]`, when a
range was asked or when the file is longer than model input's clip (`TOOL_OUTPUT_LIMIT_CHARS`:
the model then sees its head and tail and learns how many lines there are to ask for a range);
a short file read whole is returned as it is. A start past the last line, or a start after the
end, is a one-line error naming the parameter; an empty file is `(empty file)`. A file is read
whole up to 8 MB; a range is read in chunks from a file of any size (the header of a 2 GB CSV,
`soba_nb.agent.tools.line_range`), its lines at most 8 MB.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import Field

from soba_nb.agent.tools.base import (
    CLIPPED,
    ToolArguments,
    ToolContext,
    ToolError,
    ToolOutcome,
    optional_parameter,
)
from soba_nb.agent.tools.confined import MAX_READ_BYTES, Confinement
from soba_nb.agent.tools.line_range import RangeTooLarge, read_range
from soba_nb.agent.vault import MAX_KEPT_BYTES
from soba_nb.compaction.model_input import TOOL_OUTPUT_LIMIT_CHARS
from soba_nb.transcript.entries import FileChange

MAX_LISTED_ENTRIES = 200
"""`list_files` shows at most this many entries, then "… and N more"."""

_PATH_DESCRIPTION = "Relative to the project folder."


class ReadFileArguments(ToolArguments):
    path: str = Field(description=_PATH_DESCRIPTION)
    start_line: int | None = Field(None, ge=1, description="First line (1-based).", json_schema_extra=optional_parameter)
    end_line: int | None = Field(None, ge=1, description="Last line (inclusive).", json_schema_extra=optional_parameter)


class WriteFileArguments(ToolArguments):
    path: str = Field(description=_PATH_DESCRIPTION + " Missing folders are created.")
    content: str = Field(description="The whole new content.")


class EditFileArguments(ToolArguments):
    path: str = Field(description=_PATH_DESCRIPTION)
    old: str = Field(description="Exact text, unique in the file.")
    new: str = Field(description="Replacement text.")


class ListFilesArguments(ToolArguments):
    path: str = Field(".", description=_PATH_DESCRIPTION)


READ_FILE_DESCRIPTION = "Read a project text file, whole or lines start_line to end_line." + CLIPPED
WRITE_FILE_DESCRIPTION = "Create or overwrite a project text file." + CLIPPED
EDIT_FILE_DESCRIPTION = "Replace the one exact occurrence of `old` with `new` in a file." + CLIPPED
LIST_FILES_DESCRIPTION = "List a project folder, sorted; folders end with '/'." + CLIPPED


def read_file(arguments: ReadFileArguments, ctx: ToolContext) -> ToolOutcome:
    start, end = arguments.start_line, arguments.end_line
    if start is not None and end is not None and start > end:
        raise ToolError(f"read_file: start_line {start} is after end_line {end}")
    place = Confinement("read_file", arguments.path, ctx.project_root)
    if start is None and end is None:
        text = _read_text(place)
        if len(text) <= TOOL_OUTPUT_LIMIT_CHARS:
            return ToolOutcome(text or "(empty file)")
        lines = _lines(text)
        return _held(lines, 1, len(lines))
    first = start or 1
    chosen, total = _read_lines(place, first, end)
    if total == 0:
        return ToolOutcome("(empty file)")
    if first > total:
        raise ToolError(f"read_file: start_line {first} is past the end of '{arguments.path}' ({_count(total)})")
    try:
        text = b"".join(chosen).decode("utf-8")
    except UnicodeDecodeError as error:
        raise ToolError(f"read_file: lines {first:,}–{first + len(chosen) - 1:,} of '{arguments.path}' are not UTF-8 text "
                        f"(invalid byte at offset {error.start} of the range)") from error
    return _held(_lines(text), first, total)


def _held(lines: list[str], first: int, total: int) -> ToolOutcome:
    """`lines`, the file's from line `first` on (of `total`), after the line saying which they are."""
    last = first + len(lines) - 1
    held = f"line {first:,}" if first == last else f"lines {first:,}–{last:,}"
    return ToolOutcome(f"[{held} of {total:,}]\n" + "".join(lines))


def _read_lines(place: Confinement, first: int, last: int | None) -> tuple[list[bytes], int]:
    """Lines `first`..`last` of the file and its line count, read in chunks (a file of any size)."""
    try:
        with _reading(place), place.reading() as (fd, _):
            return read_range(fd, first, last, MAX_READ_BYTES)
    except RangeTooLarge as error:
        raise ToolError(f"read_file: {error} (read_file's limit); ask for fewer lines") from None


def write_file(arguments: WriteFileArguments, ctx: ToolContext) -> ToolOutcome:
    place = Confinement("write_file", arguments.path, ctx.project_root, ctx.session_files)
    place.refuse_own_files()
    data = arguments.content.encode("utf-8")
    change = _kept(place, ctx, _current(place, ctx), data)
    _write(place, data)
    return ToolOutcome(f"wrote {len(data)} bytes to {arguments.path}", files=change)


def edit_file(arguments: EditFileArguments, ctx: ToolContext) -> ToolOutcome:
    place = Confinement("edit_file", arguments.path, ctx.project_root, ctx.session_files)
    place.refuse_own_files()
    if not arguments.old:
        raise ToolError("edit_file: 'old' is empty; give the exact text to replace")
    text = _read_text(place)
    matches = text.count(arguments.old)
    if matches == 0:
        raise ToolError(
            f"edit_file: 'old' text not found in {arguments.path} (0 matches); "
            "read the file and copy the text exactly"
        )
    if matches > 1:
        raise ToolError(
            f"edit_file: 'old' text occurs {matches} times in {arguments.path}; "
            "include more surrounding text so it matches exactly once"
        )
    data = text.replace(arguments.old, arguments.new, 1).encode("utf-8")
    change = _kept(place, ctx, text.encode("utf-8"), data)
    _write(place, data)
    removed, added = _line_count(arguments.old), _line_count(arguments.new)
    return ToolOutcome(f"edited {arguments.path}: replaced {removed} line(s) with {added} line(s)", files=change)


def list_files(arguments: ListFilesArguments, ctx: ToolContext) -> ToolOutcome:
    place = Confinement("list_files", arguments.path, ctx.project_root)
    try:
        names = place.names()
    except FileNotFoundError:
        raise ToolError(f"list_files: no such folder '{arguments.path}'") from None
    except NotADirectoryError:
        raise ToolError(f"list_files: '{arguments.path}' is a file, not a folder") from None
    except OSError as error:
        raise ToolError(f"list_files: cannot list '{arguments.path}': {_reason(error)}") from error
    if not names:
        return ToolOutcome("(empty folder)")
    shown = names[:MAX_LISTED_ENTRIES]
    if len(names) > MAX_LISTED_ENTRIES:
        shown.append(f"… and {len(names) - MAX_LISTED_ENTRIES} more")
    return ToolOutcome("\n".join(shown))


@contextmanager
def _reading(place: Confinement) -> Iterator[None]:
    """A file that cannot be read, as one line naming it and why."""
    try:
        yield
    except (FileNotFoundError, NotADirectoryError):
        raise ToolError(f"{place.tool}: no such file '{place.shown}'") from None
    except IsADirectoryError:
        raise ToolError(f"{place.tool}: '{place.shown}' is a folder; use list_files") from None
    except OSError as error:
        raise ToolError(f"{place.tool}: cannot read '{place.shown}': {_reason(error)}") from error


def _read_text(place: Confinement) -> str:
    tool, shown = place.tool, place.shown
    with _reading(place):
        data = place.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ToolError(
            f"{tool}: '{shown}' is not UTF-8 text ({len(data)} bytes; "
            f"invalid byte at offset {error.start})"
        ) from error


def _current(place: Confinement, ctx: ToolContext) -> bytes | None:
    """The file's bytes before a write (None: there is no file), when versions are kept."""
    if ctx.keep_version is None:
        return None
    try:
        return place.read_bytes(limit=MAX_KEPT_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IsADirectoryError:
        raise ToolError(f"{place.tool}: '{place.shown}' is a folder") from None
    except OSError as error:
        raise ToolError(f"{place.tool}: cannot read '{place.shown}' to keep its version: {_reason(error)}") from error


def _kept(place: Confinement, ctx: ToolContext, before: bytes | None, after: bytes) -> tuple[FileChange, ...]:
    """Keep both versions before anything is written (SPEC §11: no change without a way
    back): a version that cannot be kept stops the write."""
    keep = ctx.keep_version
    if keep is None:
        return ()
    try:
        previous = None if before is None else keep(before)
        new = keep(after)
    except OSError as error:
        raise ToolError(
            f"{place.tool}: '{place.shown}' not written: its previous version could not be kept for "
            f"%rewind --files ({error})"
        ) from None
    return (FileChange(path=place.relative, before=previous, after=new),)


def _write(place: Confinement, data: bytes) -> None:
    try:
        place.write_bytes(data)
    except IsADirectoryError:
        raise ToolError(f"{place.tool}: '{place.shown}' is a folder") from None
    except OSError as error:
        raise ToolError(f"{place.tool}: cannot write '{place.shown}': {_reason(error)}") from error


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


def _lines(text: str) -> list[str]:
    """The lines of `text`, each with its `\n` (the last may have none): only `\n` ends a line,
    as editors and tracebacks count them (`str.splitlines` also splits at form feeds)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _count(lines: int) -> str:
    return f"{lines:,} line" + ("" if lines == 1 else "s")


def _line_count(text: str) -> int:
    return len(text.splitlines()) or (1 if text else 0)


def summarize_read_file(arguments: ReadFileArguments) -> str:
    start, end = arguments.start_line, arguments.end_line
    if start is None and end is None:
        return f"read_file {arguments.path}"
    lines = f"from line {start}" if end is None else f"lines {start or 1}–{end}"
    return f"read_file {arguments.path} ({lines})"


def summarize_write_file(arguments: WriteFileArguments) -> str:
    return f"write_file {arguments.path} ({len(arguments.content.encode('utf-8'))} bytes)"


def summarize_edit_file(arguments: EditFileArguments) -> str:
    return f"edit_file {arguments.path}"


def summarize_list_files(arguments: ListFilesArguments) -> str:
    return f"list_files {arguments.path}"
