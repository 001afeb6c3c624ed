"""Content-addressed files soba keeps in a session folder: the images the agent's calls
displayed (`artifacts/`) and the versions of files the agent wrote (`files/`).

A file is written once, named by what it holds, private to the user (0600, in a 0700
folder), through a temporary file renamed into place; the folder and the file are opened
without following links, so a link planted in their place is refused, never written through.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path

FOLDER_MODE = 0o700
FILE_MODE = 0o600
MAX_KEPT_BYTES = 256 * 1024 * 1024
"""A version larger than this is not kept (nor the write that needs it: see `files.py`)."""


class VaultError(OSError):
    """A kept file could not be written or read back (the message says which and why)."""


def write_once(folder: Path, name: str, data: bytes) -> None:
    """`folder/name` holds `data` afterwards: written and renamed into place, or already there
    (the name says what it holds). Raises `OSError`."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, FOLDER_MODE)
    directory = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        if info is not None:
            if stat.S_ISREG(info.st_mode) and info.st_size == len(data):
                return
            raise OSError(f"{name} is already there and holds something else")
        temporary = f".{name}.{os.getpid()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temporary, flags, FILE_MODE, dir_fd=directory)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=directory)
            raise
        os.close(fd)
        os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
    finally:
        os.close(directory)


class FileVault:
    """The versions of files the agent wrote: `<notebook-stem>.soba/files/<sha256>`."""

    def __init__(self, folder: Path):
        self.folder = folder

    def keep(self, data: bytes) -> str:
        """Keep `data`; returns its sha256. Raises `VaultError`."""
        digest = hashlib.sha256(data).hexdigest()
        if len(data) > MAX_KEPT_BYTES:
            raise VaultError(f"{len(data):,} bytes is more than soba keeps a copy of ({MAX_KEPT_BYTES:,})")
        try:
            write_once(self.folder, digest, data)
        except OSError as error:
            raise VaultError(f"cannot keep a copy in {self.folder} ({error.strerror or error})") from None
        return digest

    def read(self, digest: str) -> bytes:
        """The bytes kept as `digest`, checked. Raises `VaultError`."""
        path = self.folder / digest
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as error:
            raise VaultError(f"the copy {path} is missing ({error.strerror or error})") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_KEPT_BYTES:
                raise VaultError(f"the copy {path} is not a kept file")
            with os.fdopen(os.dup(fd), "rb") as handle:
                data = handle.read()
        finally:
            os.close(fd)
        if hashlib.sha256(data).hexdigest() != digest:
            raise VaultError(f"the copy {path} was changed (its sha256 no longer matches)")
        return data
