"""Files a session keeps beside its transcript as caches (`.tokens`, `.extract`).

A sidecar is never the truth: it is read only when it is a regular file of a sane size (a
symlink, a FIFO or a device is not followed, not waited on), replaced atomically when it is
stale, appended to with no symlink followed, and a crash mid-write leaves at worst a torn last
line, which the next writer terminates before it appends.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def read_regular(path: Path, max_bytes: int, *, prefix: int | None = None) -> bytes | None:
    """The whole file (`prefix`: its first bytes only), or None when it is missing, not a
    regular file or over `max_bytes`."""

    def read(fd: int, size: int) -> bytes | None:
        if size > max_bytes:
            return None
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(max_bytes + 1 if prefix is None else prefix)
        return data if len(data) <= max_bytes else None

    return _with_regular(path, read)


def read_tail(path: Path, count: int) -> tuple[bytes, int] | None:
    """The last `count` bytes of a file and its size, or None when it is missing or not a
    regular file (a link is not followed, a FIFO not waited on)."""
    return _with_regular(path, lambda fd, size: (os.pread(fd, count, max(0, size - count)), size))


def _with_regular(path: Path, read: Callable[[int, int], T | None]) -> T | None:
    """`read(fd, size)` of `path` opened read-only when it is a regular file, or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        return read(fd, info.st_size) if stat.S_ISREG(info.st_mode) else None
    except OSError:
        return None
    finally:
        os.close(fd)


def replace_with(path: Path, data: bytes) -> None:
    """Make `path` hold exactly `data`, atomically (a reader sees the old file or the new)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"{temporary}: short write ({written} of {len(data)} bytes)")
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    os.close(fd)
    os.replace(temporary, path)


def open_for_append(path: Path, header: bytes, *, fresh: bool) -> int:
    """A descriptor appending to `path`; `fresh`: first replace it with just `header`."""
    if fresh:
        replace_with(path, header)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        # A torn last line (a crash mid-write) must not glue onto the next one.
        if not _ends_with_newline(path):
            os.write(fd, b"\n")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _ends_with_newline(path: Path) -> bool:
    """True for an empty file too (nothing to terminate)."""
    reader = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        size = os.fstat(reader).st_size
        return size == 0 or os.pread(reader, 1, size - 1) == b"\n"
    finally:
        os.close(reader)
