"""Some lines of a file of any size (`read_file(path, start_line, end_line)`, SPEC §15).

A data file is often far larger than a tool result can be: the first 20 lines of a 2 GB CSV
are read here in chunks, never the whole file into memory. Lines before the range are only
counted (newlines per chunk), the range's bytes are kept (at most `limit` of them), and the
lines after it are counted too, so the result can say `[lines 1–20 of 14,203,115]`. Only
`\\n` ends a line, as in `read_file`'s whole-file path.
"""

from __future__ import annotations

import os

CHUNK_BYTES = 1 << 20


class RangeTooLarge(ValueError):
    """The lines asked for hold more than the limit."""


def read_range(fd: int, first: int, last: int | None, limit: int) -> tuple[list[bytes], int]:
    """Lines `first`..`last` (1-based, inclusive; `last` None: to the end) of the open file,
    each with its `\\n` (the file's last line may have none), and how many lines the file has.
    Raises `RangeTooLarge` when the lines asked for pass `limit` bytes."""
    kept: list[bytes] = []
    current: list[bytes] = []
    kept_bytes = 0
    number = 1
    """The line the next byte belongs to."""
    tail = b""
    while chunk := os.read(fd, CHUNK_BYTES):
        tail = chunk[-1:]
        newlines = chunk.count(b"\n")
        if number + newlines < first or (last is not None and number > last):
            number += newlines  # before the range, or after it: only counted
            continue
        start = 0
        while True:
            at = chunk.find(b"\n", start)
            end = len(chunk) if at < 0 else at + 1
            if end > start and number >= first and (last is None or number <= last):
                kept_bytes += end - start
                if kept_bytes > limit:
                    raise RangeTooLarge(f"lines {first:,}–{number:,} already hold more than {limit:,} bytes")
                current.append(chunk[start:end])
            if at < 0:
                break
            if current:
                kept.append(b"".join(current))
                current = []
            number += 1
            start = end
    if current:
        kept.append(b"".join(current))
    total = number - 1 if tail in (b"", b"\n") else number
    return kept, total
