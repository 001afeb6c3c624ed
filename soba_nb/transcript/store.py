"""The append-only JSONL transcript store (SPEC §7).

One file per session. The file is never rewritten or truncated: every entry is one line
written with a single `os.write` on an `O_APPEND` descriptor (capsule, checkpoint, setting
and window entries are also fsync'ed). A writer holds an exclusive `flock` on the transcript
file itself, through the descriptor it writes with: the lock belongs to the file (its inode),
not to a path, so a second kernel gets a clear error however it names the file (a symlink,
a relative path) and there is no lock file anyone could delete.

Crashes: a kill in the middle of an append leaves a torn line (not JSON). Loading tolerates
a run of torn lines at the end of the file (with a warning), and the next append starts on a
fresh line and carries `followsTornLine`; so a torn run followed by such an entry is
tolerated anywhere in the file, however many crashes came in a row. Any other bad line is an
error naming its line number; `soba_nb.transcript.repair` writes a repaired copy.

A hostile place (SPEC §12): only a soba transcript is opened (its first line a `session`
entry), or a new one created at a path ending in `.jsonl`: any other file is refused
untouched. The file is opened without following a link (a link planted where a transcript
would be is refused, never written through). A full disk cuts an append short like a crash
does: the torn bytes are treated exactly as a crash's (the next append starts a fresh line,
marked), so every entry acknowledged before or after the space comes back is kept. A
transcript deleted or replaced while a kernel writes to it is noticed at the next append
(its link count, or another file at its path), which is refused instead of writing into a
file nobody will read.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import warnings
from array import array
from collections.abc import Iterator
from itertools import islice
from operator import ne
from pathlib import Path
from typing import cast

import msgspec

from soba_nb.collector import collector_paused
from soba_nb.redact import redact_entry_data
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    ConfigEntry,
    Entry,
    LeafEntry,
    SessionEntry,
    SettingEntry,
    WindowEntry,
    entry_from_json,
    entry_to_dict,
    new_entry_id,
    replace,
)
from soba_nb.transcript.errors import TornLineWarning as TornLineWarning  # re-exported
from soba_nb.transcript.errors import TranscriptError as TranscriptError  # re-exported
from soba_nb.transcript.errors import TranscriptLockedError as TranscriptLockedError  # re-exported
from soba_nb.transcript.errors import TranscriptWriteError as TranscriptWriteError  # re-exported
from soba_nb.transcript.errors import describe_error
from soba_nb.transcript.opening import check_header, identity, open_for_writing
from soba_nb.transcript.reading import Parsed, read_entries

# The first entry appended after torn lines carries this flag, so a later load can tell the
# (tolerated, already-warned) torn lines apart from corruption.
TORN_MARKER = "followsTornLine"


DURABLE_TYPES = (CapsuleEntry, CheckpointEntry, SessionEntry, SettingEntry, WindowEntry, ConfigEntry)


_SESSION_FACTS = frozenset({SettingEntry, WindowEntry, ConfigEntry})
"""Entries read from any branch (`setting`, `window`, `config`), not only the path."""


_SPECIAL = _SESSION_FACTS | {LeafEntry}


class Transcript:
    """An in-memory view of one transcript file: entries, tree, leaf and path.

    `Transcript.open(path)` loads (and locks for writing); `append` adds one entry as a
    child of the leaf. `path()` is the conversation: root → leaf.
    """

    def __init__(self, path: Path, parsed: Parsed, *, fd: int | None, lines: int = 0):
        self.file = path
        self._entries: list[Entry] = []
        self._by_id: dict[str, Entry] = {}
        self._line_numbers = array("L")
        """The line of each entry of `_entries` (a compact array: a dict by id cost ~50 bytes
        an entry, and lines are only asked for in error reports)."""
        self._leaf: str | None = None
        self._path: list[Entry] | None = []
        """Root → leaf, extended as entries are indexed; None until recomputed after a branch."""
        self._needs_newline = parsed.unterminated
        self._needs_marker = parsed.trailing_torn
        self._fd = fd
        """The locked, append-only descriptor of a writer; None for a read-only view."""
        self._identity = identity(os.fstat(fd)) if fd is not None else None
        """(device, inode) of the file opened: another file at the path means it was replaced."""
        self._burned: set[str] = set()
        """Ids of entries whose append failed after some of their bytes reached the file: a
        retry gets a new id (a torn line that happens to be whole JSON is an entry on load)."""
        self._lines = lines
        """Lines in the file (torn ones included), so appended entries get true line numbers."""
        self.torn_lines: list[int] = list(parsed.torn_lines)
        """Line numbers of torn lines (crash leftovers) that loading tolerated and skipped."""
        self._settings: dict[str, SettingEntry] = {}
        self._windows: list[WindowEntry] = []
        self._config: ConfigEntry | None = None
        if parsed.numbers is not None or not self._index_clean(parsed.entries):
            numbers = parsed.numbers if parsed.numbers is not None else range(1, len(parsed.entries) + 1)
            for entry, number in zip(parsed.entries, numbers, strict=True):
                self._index(entry, number)

    # -- loading -------------------------------------------------------------------------

    @classmethod
    def load(cls, path: Path) -> Transcript:
        """Read-only view of an existing file (no lock). Raises `TranscriptError`."""
        path = Path(path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise TranscriptError(f"{path}: not a regular file")
            with collector_paused():
                parsed, lines = read_entries(path, fd)
                return cls(path, parsed, fd=None, lines=lines)
        finally:
            os.close(fd)

    @classmethod
    def open(cls, path: Path, *, create_header: SessionEntry | None = None) -> Transcript:
        """Open for appending, taking the writer lock; create the file if needed.

        Raises `TranscriptLockedError` when another writer holds it, `TranscriptError` for a
        file that is not a soba transcript (or a link, or a new path not ending in `.jsonl`).
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_for_writing(path)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise TranscriptError(f"{path}: not a regular file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise TranscriptLockedError(
                    f"{path}: another writer (probably a second kernel on this notebook) has this "
                    "session open; start a new session with `%soba --new` or close the other kernel"
                ) from None
            check_header(path, fd)
            with collector_paused():
                parsed, lines = read_entries(path, fd)
                store = cls(path, parsed, fd=fd, lines=lines)
            if not store._entries and create_header is not None:
                store.append(create_header)
        except BaseException:
            os.close(fd)  # releases the lock
            raise
        return store

    def close(self) -> None:
        """Release the writer lock. The view stays readable."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Transcript:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tree ----------------------------------------------------------------------------

    def _index_clean(self, entries: list[Entry]) -> bool:
        """Index a whole clean file (entry i on line i + 1) in a few passes over it; False,
        with nothing indexed, when something is wrong with it (`_index`, one entry at a
        time, then names the line at fault).

        The result is what `_index` gives entry by entry. Most entries hang from the entry
        before them; only the others (after a rewind or a branch, and `leaf` entries) are
        checked one by one: their parent must be an earlier entry.
        """
        count = len(entries)
        if not count:
            return True
        ids = [entry.id for entry in entries]
        by_id = dict(zip(ids, entries, strict=True))
        if len(by_id) != count:  # a duplicate id
            return False
        parents = [entry.parent_id for entry in entries]
        irregular = [0] if parents[0] is not None else []
        if any(map(ne, islice(parents, 1, None), ids)):
            irregular += [
                index for index, (parent, before) in enumerate(zip(parents[1:], ids[:-1], strict=True), 1) if parent != before
            ]
        special = [entry for entry in entries if type(entry) in _SPECIAL]
        leaves = [index for index, entry in enumerate(entries) if type(entry) is LeafEntry] if any(
            type(entry) is LeafEntry for entry in special
        ) else []
        if irregular or leaves:
            position = dict(zip(ids, range(count), strict=True))
            for index in irregular:
                parent = parents[index]
                if parent is not None and position.get(parent, count) >= index:
                    return False
            for index in leaves:
                target = by_id.get(cast(LeafEntry, entries[index]).target_id)
                if target is None or position[target.id] >= index or type(target) is LeafEntry:
                    return False
        # One string per id in memory, not one per mention (as `_index` does).
        force_setattr = msgspec.structs.force_setattr
        for entry, parent in zip(islice(entries, 1, None), islice(ids, count - 1), strict=True):
            force_setattr(entry, "parent_id", parent)
        for index in irregular:
            parent = parents[index]
            force_setattr(entries[index], "parent_id", None if parent is None else by_id[parent].id)
        last = entries[-1]
        self._leaf = last.target_id if type(last) is LeafEntry else last.id
        self._path = None if irregular or leaves else list(entries)
        for entry in special:
            if type(entry) in _SESSION_FACTS:
                self._note_fact(entry)
        self._entries = entries
        self._by_id = by_id
        self._line_numbers = array("L", range(1, count + 1))
        return True

    def _index(self, entry: Entry, line: int) -> None:
        entry_id, parent_id = entry.id, entry.parent_id
        by_id = self._by_id
        if entry_id in by_id:
            raise TranscriptError(
                f"{self.file}:{line}: duplicate id {entry_id!r} (first on line {self.line_of(entry_id)})", line
            )
        if parent_id is not None:
            parent = by_id.get(parent_id)
            if parent is None:
                raise TranscriptError(f"{self.file}:{line}: parentId {parent_id!r} names no earlier entry", line)
            if parent.id is not parent_id:  # one string per id in memory, not one per mention
                msgspec.structs.force_setattr(entry, "parent_id", parent.id)
        kind = type(entry)
        if kind is LeafEntry:
            assert isinstance(entry, LeafEntry)
            target = by_id.get(entry.target_id)
            if target is None:
                raise TranscriptError(
                    f"{self.file}:{line}: leaf targetId {entry.target_id!r} names no earlier entry", line
                )
            if type(target) is LeafEntry:
                raise TranscriptError(f"{self.file}:{line}: leaf targetId names another leaf entry", line)
            self._leaf = entry.target_id
            self._path = None
        else:
            if self._path is not None and parent_id == self._leaf:
                self._path.append(entry)
            else:
                self._path = None
            self._leaf = entry_id
            if kind in _SESSION_FACTS:
                self._note_fact(entry)
        self._entries.append(entry)
        by_id[entry_id] = entry
        self._line_numbers.append(line)

    def _note_fact(self, entry: Entry) -> None:
        if isinstance(entry, SettingEntry):
            self._settings[entry.key] = entry
        elif isinstance(entry, WindowEntry):
            self._windows.append(entry)
        elif isinstance(entry, ConfigEntry):
            self._config = entry

    @property
    def entries(self) -> list[Entry]:
        """All entries in file order (every branch)."""
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._by_id

    def get(self, entry_id: str) -> Entry | None:
        return self._by_id.get(entry_id)

    def own_id(self, entry_id: str) -> str:
        """The id string of the entry `entry_id` names (the same object), or `entry_id`."""
        entry = self._by_id.get(entry_id)
        return entry_id if entry is None else entry.id

    def own_ids(self, ids: list[str]) -> list[str]:
        """`own_id` of each of `ids`, in order (lookups in C: one call for a long list)."""
        found = list(map(self._by_id.get, ids))
        return [entry_id if entry is None else entry.id for entry_id, entry in zip(ids, found, strict=True)]

    def line_of(self, entry_id: str) -> int:
        """1-based line number of an entry in the file."""
        entry = self._by_id[entry_id]
        for index in range(len(self._entries) - 1, -1, -1):  # rare: error reports, verify
            if self._entries[index] is entry:
                return self._line_numbers[index]
        raise KeyError(entry_id)

    def setting(self, key: str) -> SettingEntry | None:
        """The latest `setting` entry for `key`, on any branch (settings are not steps)."""
        return self._settings.get(key)

    @property
    def config(self) -> ConfigEntry | None:
        """The latest `config` entry, on any branch."""
        return self._config

    @property
    def windows(self) -> tuple[WindowEntry, ...]:
        """Every `window` entry, in file order, on any branch."""
        return tuple(self._windows)

    @property
    def leaf(self) -> str | None:
        """Id of the entry the next append hangs from."""
        return self._leaf

    @property
    def header(self) -> SessionEntry | None:
        first = self._entries[0] if self._entries else None
        return first if isinstance(first, SessionEntry) else None

    def path(self) -> list[Entry]:
        """Entries from the root to the leaf. Cached and extended incrementally on append."""
        if self._path is None:
            chain: list[Entry] = []
            current = self._leaf
            while current is not None:
                entry = self._by_id[current]
                chain.append(entry)
                current = entry.parent_id
            chain.reverse()
            self._path = chain
        return list(self._path)

    def path_view(self) -> list[Entry]:
        """Like `path()` but without a copy: callers must not mutate it."""
        if self._path is None:
            self.path()
        assert self._path is not None
        return self._path

    def path_and_every(self, kind: type[Entry]) -> list[Entry]:
        """The current path and the `kind` entries of every branch, in file order (a child is
        always written after its parent, so the path keeps its order). For facts that hold
        whatever the conversation was rewound to: the cells the user ran (`cell_sources`) ran
        in the kernel all the same."""
        on_path = {id(entry) for entry in self.path_view()}
        return [entry for entry in self._entries if id(entry) in on_path or isinstance(entry, kind)]

    def find_checkpoint(self, checkpoint_id: str) -> CheckpointEntry | CapsuleEntry | None:
        """The checkpoint or capsule entry carrying this checkpoint id (latest wins)."""
        for entry in reversed(self._entries):
            if isinstance(entry, CheckpointEntry | CapsuleEntry) and entry.checkpoint_id == checkpoint_id:
                return entry
        return None

    # -- writing -------------------------------------------------------------------------

    def append(self, entry: Entry) -> Entry:
        """Append one entry as a child of the leaf (its `parentId` is set here).

        Returns the entry as written. Capsule, checkpoint and session entries are fsync'ed.
        """
        if self._fd is None:
            raise TranscriptLockedError(f"{self.file}: opened read-only; use Transcript.open to append")
        entry = replace(
            entry,
            parent_id=self._leaf,
            follows_torn_line=True if self._needs_marker else msgspec.UNSET,
        )
        while entry.id in self._by_id or entry.id in self._burned:
            entry = replace(entry, id=new_entry_id())
        # The one place every entry passes on its way to disk: no secret gets written.
        data = redact_entry_data(entry_to_dict(entry))
        line = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        # Lone surrogates (e.g. undecodable file names in a tool output) have no UTF-8 form:
        # they are written as "?".
        encoded = line.encode("utf-8", "replace")
        # What is kept in memory is the line as written, decoded and validated: an entry
        # built wrong in Python is refused here, before anything reaches the file.
        try:
            entry = entry_from_json(encoded)
        except msgspec.DecodeError as exc:
            raise TranscriptError(
                f"{self.file}: not appended, bad {entry.type} entry ({describe_error(exc)})"
            ) from None
        encoded = (b"\n" if self._needs_newline else b"") + encoded + b"\n"
        self._write(encoded, durable=isinstance(entry, DURABLE_TYPES), entry_id=entry.id)
        # One new line; a leading "\n" only terminates the torn line, already counted.
        self._lines += 1
        self._needs_newline = self._needs_marker = False
        self._index(entry, self._lines)
        return entry

    def rewind(self, target_id: str) -> LeafEntry:
        """Move the leaf to `target_id` by appending a `leaf` entry."""
        if target_id not in self._by_id or isinstance(self._by_id[target_id], LeafEntry):
            raise KeyError(f"no entry {target_id!r} to rewind to")
        result = self.append(LeafEntry(target_id=target_id))
        assert isinstance(result, LeafEntry)
        return result

    def _write(self, data: bytes, *, durable: bool, entry_id: str) -> None:
        """One `write` of a whole line. On failure nothing is acknowledged and the file is left
        as a crash would leave it: torn bytes are terminated and marked by the next append."""
        assert self._fd is not None
        self._check_still_there()
        try:
            written = os.write(self._fd, data)
        except OSError as error:  # nothing written (ENOSPC, EDQUOT, EIO, EFBIG)
            raise TranscriptWriteError(
                error.errno or errno.EIO,
                f"{self.file}: entry not written ({error.strerror or error}); nothing was lost, run the cell again once that is fixed",
            ) from None
        if written != len(data):
            self._torn(data[:written], entry_id)
            raise TranscriptWriteError(
                errno.ENOSPC,
                f"{self.file}: entry not written (the disk took {written} of {len(data)} bytes: full?); "
                "nothing acknowledged was lost, run the cell again once there is space",
            )
        if durable:
            try:
                os.fsync(self._fd)
            except OSError as error:  # written, but the disk could not confirm it
                warnings.warn(f"{self.file}: entry written but not flushed to disk ({error.strerror})", stacklevel=3)

    def _torn(self, written: bytes, entry_id: str) -> None:
        """What a short write left: a torn line the next append must start after."""
        prefix = 1 if self._needs_newline else 0
        if len(written) > prefix:  # part of the entry itself is in the file: a new (torn) line
            self._lines += 1
            self._needs_marker = True
            self._burned.add(entry_id)
        if written:
            self._needs_newline = not written.endswith(b"\n")

    def _check_still_there(self) -> None:
        """Refuse to append to a file deleted or replaced since it was opened (an `rm` of the
        transcript would otherwise swallow every later entry into an unlinked inode)."""
        assert self._fd is not None
        opened = os.fstat(self._fd)
        try:
            current: os.stat_result | None = os.stat(self.file, follow_symlinks=False)
        except OSError:
            current = None
        if opened.st_nlink == 0 or current is None or identity(current) != self._identity:
            replaced = current is not None and identity(current) != self._identity
            what = "replaced by another file" if replaced else "deleted"
            raise TranscriptWriteError(
                errno.ESTALE,
                f"{self.file}: the transcript was {what} while this kernel wrote to it; nothing more "
                "is written to it: `%soba --new` starts a new session",
            )
