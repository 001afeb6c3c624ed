"""Opening a transcript for writing in a hostile place (SPEC §12): never through a link (the
transcript's own name, or the session folder it lies in), only a soba transcript (its first
line a `session` entry) or a new one made here at a `.jsonl` path, and the identity of the
file opened, so a transcript deleted or replaced under the writer is noticed.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import msgspec

from soba_nb.layout import TRANSCRIPT_SUFFIX
from soba_nb.transcript.entries import (
    SessionEntry,
    entry_from_json,
)
from soba_nb.transcript.errors import TranscriptError

HEADER_PROBE_BYTES = 64 * 1024
"""How much of a file is read to see whether its first line is a `session` entry."""


HEADER_START = b'{"type":"session"'
"""How every header line starts (the store writes `type` first): a file holding only a torn
header (a crash during its first append) starts with part of it."""


_OPEN_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


PRIVATE_FILE_MODE = 0o600
"""A transcript is its user's own, whatever the umask or the folder (SPEC §13): in a team's
shared folder, the conversation is not everyone's to read. Files meant to be shared (capsule
files, project memory) are written elsewhere, with the umask."""


def identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


_made_here: set[tuple[int, int]] = set()
"""Files `open_for_writing` made (`O_EXCL`) and `check_header` has not yet seen: only these may
be empty (their header comes next)."""


def open_for_writing(path: Path) -> int:
    """The transcript's descriptor: an existing file (never through a link), or a new one made
    here (`O_EXCL`: never through a link either) at a path ending in `.jsonl`; never in a
    session folder that is itself a link (the transcript and the side-cars beside it would go
    wherever the link points)."""
    if path.parent.is_symlink():
        raise TranscriptError(
            f"{path.parent}: the session folder is a link; soba writes its sessions only into a real folder, never through a link"
        )
    for _ in range(2):
        try:
            return os.open(path, _OPEN_FLAGS)
        except FileNotFoundError:
            pass
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise TranscriptError(f"{path}: is a link; soba writes its transcripts only directly, never through a link") from None
            raise
        if path.suffix != TRANSCRIPT_SUFFIX:
            raise TranscriptError(f"{path}: a new session transcript must end in {TRANSCRIPT_SUFFIX}")
        try:
            fd = os.open(path, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
        except FileExistsError:
            continue  # made in between: open it as an existing file
        _made_here.add(identity(os.fstat(fd)))
        return fd
    raise TranscriptError(f"{path}: kept changing while it was opened")


def check_header(path: Path, fd: int) -> None:
    """Refuse, untouched, a file that is not a soba transcript: its first line must be a
    `session` entry, after at most the torn starts of headers that crashes cut short (a file
    may hold only those). An empty file is a new session only when `open_for_writing` just
    made it: an empty file found there is someone else's, never adopted."""
    made_here = identity(os.fstat(fd))
    head = os.pread(fd, HEADER_PROBE_BYTES, 0)
    if not head:
        if made_here in _made_here:
            _made_here.discard(made_here)
            return
        raise TranscriptError(
            f"{path}: not a soba transcript (an empty file); left untouched. "
            f"A new session needs a path that does not exist yet, ending in {TRANSCRIPT_SUFFIX}"
        )
    _made_here.discard(made_here)
    lines = head.split(b"\n")
    cut = lines.pop() if len(head) == HEADER_PROBE_BYTES else None  # the probe may end mid-line
    for line in lines:
        if _is_header(line):
            return
        if not HEADER_START.startswith(line[: len(HEADER_START)]):
            break  # neither a header nor what a crash leaves of one
    else:
        if cut is None or cut.startswith(HEADER_START):
            return  # only torn headers so far (loading recovers them), or a long header
    raise TranscriptError(
        f"{path}: not a soba transcript (its first line is not a session entry); left untouched. "
        f"A new session needs a path that does not exist yet, ending in {TRANSCRIPT_SUFFIX}"
    )


def _is_header(line: bytes) -> bool:
    try:
        return isinstance(entry_from_json(line), SessionEntry)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
