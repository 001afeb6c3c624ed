"""Opening a transcript for writing in a hostile place (SPEC §12): never through a link, only a
soba transcript (its first line a `session` entry) or a new one at a `.jsonl` path, and the
identity of the file opened, so a transcript deleted or replaced under the writer is noticed.
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


def open_for_writing(path: Path) -> int:
    """The transcript's descriptor: an existing file (never through a link), or a new one made
    here (`O_EXCL`: never through a link either) at a path ending in `.jsonl`."""
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
            return os.open(path, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
        except FileExistsError:
            continue  # made in between: open it as an existing file
    raise TranscriptError(f"{path}: kept changing while it was opened")


def check_header(path: Path, fd: int) -> None:
    """Refuse, untouched, a file that is not a soba transcript: its first line must be a
    `session` entry, after at most the torn starts of headers that crashes cut short (a file
    may hold only those). An empty file is a new session, if its name says transcript."""
    head = os.pread(fd, HEADER_PROBE_BYTES, 0)
    if not head:
        if path.suffix != TRANSCRIPT_SUFFIX:
            raise TranscriptError(f"{path}: not a soba transcript (an empty file whose name does not end in {TRANSCRIPT_SUFFIX}); left untouched")
        return
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
