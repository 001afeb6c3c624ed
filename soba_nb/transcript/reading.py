"""Reading a transcript file: every entry, the torn lines a crash left, and how the file ends.

A clean file is decoded a block of lines at a time (msgspec `decode_lines`); anything else is
read again line by line, which names the line at fault. A run of torn lines (not JSON) is
tolerated at the end of the file, with a warning, or anywhere when the entry after it says it
follows torn lines (`followsTornLine`).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import msgspec

from soba_nb.transcript.entries import (
    Entry,
    decode_lines,
    entry_from_json,
)
from soba_nb.transcript.errors import (
    TornLineWarning,
    TranscriptError,
    describe_error,
    is_json_error,
)

READ_CHUNK_BYTES = 1 << 20


DECODE_BLOCK_BYTES = 4 << 20
"""Raw text decoded at a time on load (peak memory is the entries plus about this)."""


class Parsed:
    """What loading a file found."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.numbers: list[int] | None = []
        """Line number of each entry; None when entry i is on line i + 1 (a clean file)."""
        self.torn_lines: list[int] = []
        """Line numbers of torn lines (crash leftovers) tolerated and skipped."""
        self.unterminated = False
        """The last line has no newline: the next append must start a fresh line."""
        self.trailing_torn = False
        """The file ends in torn lines: the next append carries `followsTornLine`."""


def read_entries(path: Path, fd: int) -> tuple[Parsed, int]:
    """Every entry of the file behind `fd`, and how many lines it has.

    A clean file (one entry per line, every line terminated: the usual case) is decoded a
    block of lines at a time (msgspec `decode_lines`), so only one block of raw text is held
    beside the entries, never the whole file. Anything else (a torn or bad line, a blank
    line, no final newline) is read again line by line, which names the line at fault.
    """
    entries: list[Entry] = []
    offset, size = 0, DECODE_BLOCK_BYTES
    while data := os.pread(fd, size, offset):
        # Whole lines only: the start of a line cut at the block's end is read again with
        # the next block (no copy of the block to join it to).
        cut = data.rfind(b"\n") + 1
        if not cut:
            if len(data) < size:  # the file ends in a line without a newline
                break
            size *= 2  # a line longer than the block
            continue
        try:
            decoded = decode_lines(memoryview(data)[:cut])
        except (msgspec.DecodeError, RecursionError):
            break
        if len(decoded) != data.count(b"\n", 0, cut):
            break
        entries.extend(decoded)
        offset, size = offset + cut, DECODE_BLOCK_BYTES
    else:
        parsed = Parsed()
        parsed.entries, parsed.numbers = entries, None
        return parsed, len(entries)
    del entries
    raw = read_all(fd)
    return parse_lines(path, raw), count_lines(raw)


def parse_lines(path: Path, raw: bytes) -> Parsed:
    """Every line of a file: entries, tolerated torn lines, and how the file ends.

    Each line goes straight from bytes to a validated entry (msgspec): one parse, no
    intermediate dict.
    """
    parsed = Parsed()
    numbers: list[int] = []
    parsed.numbers = numbers
    lines = raw.split(b"\n")
    last_terminated = lines[-1] == b""
    if last_terminated:
        lines.pop()
    last = len(lines)
    torn_run: list[int] = []
    """Consecutive lines that are not JSON: tolerated only if the run reaches the end of the
    file or the entry after it says it follows torn lines."""
    for number, line in enumerate(lines, start=1):
        try:
            entry = entry_from_json(line)
        except msgspec.DecodeError as exc:
            if is_json_error(exc) or (number == last and not last_terminated):
                torn_run.append(number)
                continue
            raise TranscriptError(f"{path}:{number}: bad entry ({describe_error(exc)})", number) from None
        if torn_run:
            if entry.follows_torn_line is not True:
                raise TranscriptError(f"{path}:{torn_run[0]}: not valid JSON", torn_run[0])
            parsed.torn_lines.extend(torn_run)
            torn_run = []
        parsed.entries.append(entry)
        numbers.append(number)
    if torn_run:
        what = "a torn last line" if len(torn_run) == 1 else f"{len(torn_run)} torn lines at the end"
        warnings.warn(
            f"{path}:{torn_run[0]}: ignoring {what} (a crash cut an append short)",
            TornLineWarning,
            stacklevel=3,
        )
        parsed.torn_lines.extend(torn_run)
        parsed.trailing_torn = True
    parsed.unterminated = bool(lines) and not last_terminated
    return parsed


def count_lines(raw: bytes) -> int:
    return raw.count(b"\n") + (0 if raw.endswith(b"\n") or not raw else 1)


def read_all(fd: int) -> bytes:
    """The whole file behind `fd`, from its start (one read of its size, then to the end)."""
    chunks = [os.pread(fd, os.fstat(fd).st_size, 0)]
    offset = len(chunks[0])
    while chunk := os.pread(fd, READ_CHUNK_BYTES, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
