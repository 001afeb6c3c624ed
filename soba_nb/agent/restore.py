"""Rewind restores files (SPEC §11).

Every `write_file` / `edit_file` keeps the file's bytes before and after, by sha256, in the
session folder's `files/`, and its `tool_result` lists the change (`files`: path, before,
after). Moving the leaf from the current path to a target leaves part of the path behind
(and, for a target on another branch, takes up part of another): `plan_restore` works out,
for every file the agent changed there, what it held at the target and what the agent last
left in it; `apply_restore` puts each file back — a file the agent created is deleted — unless
someone else changed it since (its bytes are not what the agent last wrote), which is left
alone and listed, unless forced. A restore is itself a change (`restore` entry), so a later
rewind over it knows what it did.

A restore is atomic (SPEC §16): each file is written to a temporary file beside it (created
with `O_EXCL`, never through a link, in the folder the confinement checked), fsynced and
renamed into place. When that fails (a full disk) the temporary file is removed, the file is
exactly as it was, and the reason is one line; the same command succeeds once there is space.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from soba_nb.agent.tools.base import ToolError
from soba_nb.agent.tools.confined import Confinement, write_atomically
from soba_nb.agent.vault import MAX_KEPT_BYTES, FileVault, VaultError
from soba_nb.transcript.entries import Entry, LeafEntry, RestoredFile, RestoreEntry, ToolResultEntry
from soba_nb.transcript.store import Transcript

RESTORE = "restore"
"""The name the confinement's messages use."""


@dataclass(frozen=True)
class FilePlan:
    """One file to put back."""

    path: str
    """Relative to the project folder."""
    wanted: str | None
    """sha256 of the bytes it held at the target (None: it did not exist)."""
    expected: str | None
    """sha256 of what the agent (or a restore) last left in it (None: no file)."""


def changes(entries: Sequence[Entry]) -> Iterator[tuple[str, str | None, str | None]]:
    """(path, before, after) of every file change in `entries`, in order: the agent's writes
    and edits, and what restores did."""
    for entry in entries:
        if type(entry) is ToolResultEntry and entry.files:
            for change in entry.files:
                yield change.path, change.before, change.after
        elif type(entry) is RestoreEntry:
            # A restore is where this path's files were set to what they held at its target:
            # from here on (and for a rewind back to here) that is their content.
            for restored in entry.files:
                if restored.action in ("restored", "deleted"):
                    yield restored.path, restored.sha256, restored.sha256


def _common(left: Sequence[Entry], right: Sequence[Entry]) -> int:
    shared = 0
    for a, b in zip(left, right, strict=False):
        if a.id != b.id:
            break
        shared += 1
    return shared


def plan_restore(current: Sequence[Entry], target: Sequence[Entry]) -> list[FilePlan]:
    """What moving from the `current` path to the `target` path does to the agent's files,
    in the order they were first changed."""
    shared = _common(current, target)
    wanted: dict[str, str | None] = {}
    expected: dict[str, str | None] = {}
    for path, before, after in changes(current[shared:]):  # the part left behind
        wanted.setdefault(path, before)
        expected[path] = after
    taken_up: set[str] = set()
    for path, before, after in changes(target[shared:]):  # the part taken up (another branch)
        if path not in taken_up and path not in expected:
            expected[path] = before
        taken_up.add(path)
        wanted[path] = after
    return [FilePlan(path, wanted[path], expected[path]) for path in wanted if wanted[path] != expected[path]]


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _current(place: Confinement) -> bytes | None:
    try:
        return place.read_bytes(limit=MAX_KEPT_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return None


def apply_restore(
    plans: Sequence[FilePlan],
    *,
    target_id: str,
    project_root: Path,
    vault: FileVault,
    session_files: Collection[Path] = (),
    force: bool = False,
) -> tuple[RestoreEntry, dict[str, str]]:
    """Put each planned file back; the entry says what became of each, and the reasons say
    why a file `failed` (one line each)."""
    done: list[RestoredFile] = []
    reasons: dict[str, str] = {}
    for plan in plans:
        place = Confinement(RESTORE, plan.path, project_root, session_files)
        previous: str | None = None
        try:
            previous = _sha(_current(place))
            if previous == plan.wanted:
                continue  # already as it was
            if previous != plan.expected and not force:
                done.append(RestoredFile(path=plan.path, action="left_alone", sha256=previous, previous=previous))
                continue
            if plan.wanted is None:
                place.remove()
                done.append(RestoredFile(path=plan.path, action="deleted", sha256=None, previous=previous))
            else:
                replace_atomically(place, vault.read(plan.wanted))
                done.append(RestoredFile(path=plan.path, action="restored", sha256=plan.wanted, previous=previous))
        except (ToolError, VaultError, OSError) as error:
            done.append(RestoredFile(path=plan.path, action="failed", sha256=previous, previous=previous))
            reasons[plan.path] = _reason(error)
    return RestoreEntry(target_id=target_id, files=done), reasons


def replace_atomically(place: Confinement, data: bytes) -> None:
    """`place` holds `data` afterwards, or is exactly as it was: written to a temporary file
    beside it, fsynced, renamed into place (its mode kept). Raises `ToolError` or `OSError`."""
    if not place.parts:
        raise ToolError(f"{RESTORE}: '{place.shown}' is a folder")
    name = place.parts[-1]
    place.refuse_own_files()
    with place.folder(place.parts[:-1], create=True) as parent:
        place.refuse_own_files(Path(os.readlink(f"/proc/self/fd/{parent}")) / name)
        mode = 0o644
        with contextlib.suppress(FileNotFoundError):
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                raise ToolError(f"{RESTORE}: '{place.shown}' is not a regular file (a link, folder or device)")
            mode = stat.S_IMODE(info.st_mode)
        write_atomically(parent, name, data, mode)


def _reason(error: BaseException) -> str:
    """One line: why a file was not restored, and that it is as it was."""
    if isinstance(error, ToolError | VaultError) or not isinstance(error, OSError):
        return str(error).removeprefix(f"{RESTORE}: ")
    why = error.strerror or str(error)
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        why = "no space left on the disk"
    return f"{why}; the file is as it was (the same command restores it once that is fixed)"


def path_to(entries_by_id: Callable[[str], Entry | None], entry_id: str | None) -> list[Entry]:
    """The entries from the root to `entry_id` (its parents, walked back)."""
    chain: list[Entry] = []
    current = entry_id
    while current is not None:
        entry = entries_by_id(current)
        if entry is None:
            break
        chain.append(entry)
        current = entry.parent_id
    chain.reverse()
    return chain


def left_behind(transcript: Transcript, target_id: str) -> tuple[list[Entry], bool]:
    """The path a rewind to `target_id` leaves, and whether the leaf is already there: when
    the last entries are a `%rewind` to it (and restores since, which hang from it), the path
    that move left, so `%rewind T --files [--force]` after `%rewind T` acts on what the first
    one listed."""
    entries = transcript.entries
    index = len(entries) - 1
    while index >= 0 and _restore_to(entries[index], target_id):
        index -= 1
    move = entries[index] if index >= 0 else None
    if isinstance(move, LeafEntry) and move.target_id == target_id:
        return path_to(transcript.get, move.parent_id), True
    return list(transcript.path_view()), False


def _restore_to(entry: Entry, target_id: str) -> bool:
    return isinstance(entry, RestoreEntry) and entry.target_id == target_id
