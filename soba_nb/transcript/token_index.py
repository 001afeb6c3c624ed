"""A sidecar of token counts beside a transcript, so a resumed session never re-tokenises.

Counting a long path with a real tokenizer is the most expensive thing a resume would do
(seconds at 100k entries, most of a minute for a 50 MB message); the transcript itself is
never rewritten, so the counts go beside it: `<session-id>.tokens`, one line per entry the
first time it is counted (`<entry-id> <tokens>`), under a header naming the counter and the
counting rules. On resume the counts are read back in milliseconds and only entries missing
from it are counted.

It is a cache, never the truth: a file for another counter or other rules is replaced, a torn
or malformed line is skipped (that entry is simply counted again), and the only thing it
holds is ids and integers (no text, nothing to redact). Deleting it costs one recount.

Opening it reads only the header; the counts are read the first time a count is missing (a
resumed session whose budget state was saved beside the transcript, `.budget`, measures and
assembles its path without them).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from soba_nb.layout import SessionLayout
from soba_nb.transcript.sidecar import open_for_append, read_regular

RULES_VERSION = 1
"""Bump when what an entry costs changes (message framing, clipping): old files are replaced."""
MAX_INDEX_BYTES = 256 * 1024 * 1024
"""A bigger file is not ours to read: it is replaced."""
READ_BLOCK_CHARS = 1 << 20
"""Counts are parsed a block of lines at a time (the words of one block held at once)."""


def index_path(transcript: Path) -> Path:
    return SessionLayout(transcript).tokens


class TokenIndex:
    """Counts by entry id for one counter; `add` appends a new one."""

    def __init__(
        self,
        path: Path,
        counter_key: str,
        fd: int | None,
        keys_of: Callable[[list[str]], list[str]] | None = None,
    ):
        self.path = path
        self.counter_key = counter_key
        self.counts: dict[str, int] = {}
        """Counts added since the file was opened."""
        self._fd = fd
        self._keys_of = keys_of

    @classmethod
    def open(
        cls,
        transcript: Path,
        counter_key: str,
        *,
        writable: bool = True,
        keys_of: Callable[[list[str]], list[str]] | None = None,
    ) -> TokenIndex:
        """The index of `transcript` for `counter_key` (its header checked: a missing file or
        one for another counter holds nothing); `writable`: append new counts (a fresh file
        replaces a stale one). `keys_of`: the strings to key a list of ids by (the
        transcript's own: one string per id in memory, not two)."""
        path = index_path(transcript)
        header = _header(counter_key)
        ours = read_regular(path, MAX_INDEX_BYTES, prefix=len(header)) == header
        fd = None
        if writable:
            with contextlib.suppress(OSError):  # a read-only folder: counting still works
                fd = open_for_append(path, header, fresh=not ours)
        return cls(path, counter_key, fd, keys_of)

    def read_counts(self) -> dict[str, int]:
        """Every count in the file (empty when it is missing, foreign or too big)."""
        return _read(self.path, _header(self.counter_key), self._keys_of) or {}

    def add(self, entry_id: str, tokens: int) -> None:
        """Remember one count (best effort: an index that cannot be written is only slower)."""
        if entry_id in self.counts and self.counts[entry_id] == tokens:
            return
        self.counts[entry_id] = tokens
        if self._fd is None:
            return
        line = f"{entry_id} {tokens}\n".encode()
        try:
            written = os.write(self._fd, line)
        except OSError:
            written = -1
        if written != len(line):  # a full disk: stop here (the torn line is never read)
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _header(counter_key: str) -> bytes:
    return json.dumps({"tokenIndex": RULES_VERSION, "counter": counter_key}, separators=(",", ":")).encode() + b"\n"


def _read(path: Path, header: bytes, keys_of: Callable[[list[str]], list[str]] | None = None) -> dict[str, int] | None:
    """The counts, or None when there is no usable file (missing, foreign, too big)."""
    raw = read_regular(path, MAX_INDEX_BYTES)
    if raw is None:
        return None
    if not raw.startswith(header):
        return None
    # An unterminated last line is torn (a crash or a full disk cut it short): `id 12` may be
    # what is left of `id 123`, so it is not read.
    body = raw[len(header) : raw.rfind(b"\n") + 1].decode("ascii", "replace")
    del raw
    counts: dict[str, int] = {}
    start = 0
    while start < len(body):  # a block of lines at a time: the words of one block at once
        end = body.find("\n", start + READ_BLOCK_CHARS)
        end = len(body) if end < 0 else end + 1
        _read_block(body[start:end], counts, keys_of)
        start = end
    return counts


def _read_block(block: str, counts: dict[str, int], keys_of: Callable[[list[str]], list[str]] | None) -> None:
    words = block.split()
    lines = block.count("\n") + (not block.endswith("\n"))
    ids: list[str]
    values: Iterable[int]
    if 2 * lines == len(words) == 2 * block.count(" ") and all(map(str.isdigit, words[1::2])):
        # Every line is `id count` (the usual case): in one go.
        ids, values = words[0::2], map(int, words[1::2])
    else:
        found: dict[str, int] = {}
        for line in block.split("\n"):  # a torn or foreign line somewhere: line by line
            entry_id, _, tokens = line.partition(" ")
            if tokens.isdigit() and entry_id:
                found[entry_id] = int(tokens)
        ids, values = list(found), found.values()
    counts.update(zip(ids if keys_of is None else keys_of(ids), values, strict=True))
