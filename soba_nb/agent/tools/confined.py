"""Opening files inside the project, so that the object checked is the object used.

Checking a path and then opening it (`resolve()` then `open()`) can be raced: a folder
swapped for a symlink out of the project between the two (`renameat2(RENAME_EXCHANGE)`) let
writes and reads escape. Here every step holds a descriptor and checks *it*:

- the path is normalised lexically (`a/../b` is `b`; anything that climbs above the project
  is refused) and walked one component at a time with `openat` on the parent's descriptor;
- each descriptor's real location is read back from the kernel (`/proc/self/fd`) and must lie
  inside the project: a symlink that stays inside still works, one that leads out is refused,
  and a swap after the check changes nothing, because the descriptor is what gets used;
- a new file is created with `O_CREAT | O_EXCL` in the checked folder (never through a link);
  an existing one is opened without `O_TRUNC` and checked; the new content is then written
  to a temporary file beside it and renamed into place (`write_atomically`), so a full disk
  or a crash leaves the file as it was, never cut;
- only regular files are read or written (a FIFO would block `read_file` forever, a device is
  no file), `O_NONBLOCK` keeps even the open from blocking, sizes come from `fstat` before
  reading, and a file with other hard links is not written (its other names may be outside);
- soba's own files (`soba_nb.own_files`) are never written: the rule is applied to the path
  as given, and again to the real place of the folder and of the file opened, so a link to a
  transcript or to `soba.json` is refused like the file itself.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

from soba_nb.agent.tools.base import ToolError
from soba_nb.own_files import soba_file_rule

MAX_READ_BYTES = 8 * 1024 * 1024
"""`read_file` refuses larger files (the python tool can read part of one)."""
CREATE_ATTEMPTS = 3
"""A file that appears while being created (a race) is looked at again this many times."""
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
WRITE_FLAGS = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
NEW_FILE_MODE = 0o644
NEW_DIR_MODE = 0o755


def _real_path(fd: int) -> Path:
    return Path(os.readlink(f"/proc/self/fd/{fd}"))


class Confinement:
    """One tool call's view of the project folder."""

    def __init__(self, tool: str, shown: str, project_root: Path, session_files: Collection[Path] = ()):
        self.tool = tool
        self.shown = shown
        """The path as the model gave it (for messages)."""
        self.root = project_root.resolve()
        self.parts = self._relative_parts(shown, project_root)
        self.session_files = session_files
        """The open session's files (resolved): never written, wherever they are."""

    def _outside(self) -> ToolError:
        return ToolError(f"{self.tool}: path '{self.shown}' is outside the project folder {self.root}")

    def _relative_parts(self, shown: str, project_root: Path) -> list[str]:
        if not shown.strip():
            raise ToolError(f"{self.tool}: path is empty")
        candidate = Path(os.path.normpath(shown))
        if candidate.is_absolute():
            for base in (self.root, Path(os.path.normpath(project_root.absolute()))):
                if candidate.is_relative_to(base):
                    candidate = candidate.relative_to(base)
                    break
            else:
                raise self._outside()
        parts = [part for part in candidate.parts if part != "."]
        if parts and parts[0] == "..":
            raise self._outside()
        return parts

    def refuse_own_files(self, real: Path | None = None) -> None:
        """Raise when `real` (default: the path as given) is one of soba's own files."""
        path = real if real is not None else self.root.joinpath(*self.parts)
        rule = soba_file_rule(path, self.root, self.session_files)
        if rule is not None:
            raise ToolError(
                f"{self.tool}: '{self.shown}' is one of soba's own files ({rule}); the file tools "
                "never write or edit those (reading them is allowed)"
            )

    def _check(self, fd: int) -> None:
        """The opened object must lie inside the project (symlinks followed by the kernel)."""
        if not _real_path(fd).is_relative_to(self.root):
            os.close(fd)
            raise self._outside()

    @contextmanager
    def folder(self, parts: list[str] | None = None, *, create: bool = False) -> Iterator[int]:
        """The descriptor of the folder `parts` (default: the whole path), checked; `create`
        (for writing): missing folders are made, never inside soba's own folders."""
        fd = os.open(self.root, DIR_FLAGS)
        try:
            for part in self.parts if parts is None else parts:
                if create:
                    self.refuse_own_files(_real_path(fd) / part)
                try:
                    child = os.open(part, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, NEW_DIR_MODE, dir_fd=fd)
                    child = os.open(part, DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = child
                self._check(fd)
            yield fd
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def read_bytes(self, limit: int = MAX_READ_BYTES) -> bytes:
        """The whole content of a regular file inside the project (at most `limit` bytes)."""
        with self.reading() as (fd, size):
            if size > limit:
                raise ToolError(
                    f"{self.tool}: '{self.shown}' is {size:,} bytes, more than read_file takes whole "
                    f"({limit:,}); give start_line and end_line to read part of it"
                )
            return _read_at_most(fd, size)

    @contextmanager
    def reading(self) -> Iterator[tuple[int, int]]:
        """(descriptor, size) of a regular file inside the project, open for reading in the block."""
        if not self.parts:
            raise ToolError(f"{self.tool}: '{self.shown}' is a folder; use list_files")
        with self.folder(self.parts[:-1]) as parent:
            fd = os.open(self.parts[-1], READ_FLAGS, dir_fd=parent)
        self._check(fd)  # (closes it when it refuses)
        try:
            info = os.fstat(fd)
            self._regular(info.st_mode)
            yield fd, info.st_size
        finally:
            os.close(fd)

    def write_bytes(self, data: bytes) -> None:
        """Create or replace a regular file inside the project (parents created): all of
        `data`, or the file as it was (a new one not left behind)."""
        if not self.parts:
            raise ToolError(f"{self.tool}: '{self.shown}' is a folder")
        self.refuse_own_files()
        name = self.parts[-1]
        with self.folder(self.parts[:-1], create=True) as parent:
            self.refuse_own_files(_real_path(parent) / name)
            existed = _exists(parent, name)
            fd = self._open_for_writing(parent, name)
            try:
                self.refuse_own_files(_real_path(fd))
                mode = stat.S_IMODE(os.fstat(fd).st_mode)
            except ToolError:
                os.close(fd)
                raise
            os.close(fd)
            try:
                write_atomically(parent, name, data, mode)
            except BaseException:
                if not existed:  # the empty file made to check the place: not left behind
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=parent)
                raise

    def _open_for_writing(self, parent: int, name: str) -> int:
        for _ in range(CREATE_ATTEMPTS):
            try:  # a new file: O_EXCL never follows a link, so it is made right here
                return os.open(name, WRITE_FLAGS | os.O_CREAT | os.O_EXCL, NEW_FILE_MODE, dir_fd=parent)
            except FileExistsError:
                pass
            try:
                fd = os.open(name, WRITE_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                continue  # removed in between: create it again
            except OSError as error:
                if error.errno == errno.ENXIO:  # a FIFO nobody reads (O_NONBLOCK: no wait)
                    self._regular(stat.S_IFIFO)
                raise
            self._check(fd)
            info = os.fstat(fd)
            try:
                self._regular(info.st_mode)
                if info.st_nlink > 1:
                    raise ToolError(
                        f"{self.tool}: '{self.shown}' has {info.st_nlink} hard links; not written "
                        "(its other names may be outside the project)"
                    )
            except ToolError:
                os.close(fd)
                raise
            return fd
        raise ToolError(f"{self.tool}: '{self.shown}' kept changing while it was opened; not written")

    def _regular(self, mode: int) -> None:
        if stat.S_ISDIR(mode):
            raise ToolError(f"{self.tool}: '{self.shown}' is a folder; use list_files")
        if not stat.S_ISREG(mode):
            raise ToolError(f"{self.tool}: '{self.shown}' is not a regular file (a FIFO, socket or device)")

    @property
    def relative(self) -> str:
        """The path inside the project, normalised, `/`-separated."""
        return "/".join(self.parts)

    def remove(self) -> None:
        """Delete the regular file (never a folder, never one of soba's own files)."""
        if not self.parts:
            raise ToolError(f"{self.tool}: '{self.shown}' is a folder")
        self.refuse_own_files()
        with self.folder(self.parts[:-1]) as parent:
            info = os.stat(self.parts[-1], dir_fd=parent, follow_symlinks=False)
            self._regular(info.st_mode)
            os.unlink(self.parts[-1], dir_fd=parent)

    def names(self) -> list[str]:
        """The folder's entries, sorted; folders end with '/'."""
        with self.folder() as fd, os.scandir(fd) as entries:
            return sorted(entry.name + ("/" if entry.is_dir() else "") for entry in entries)


def _read_at_most(fd: int, size: int) -> bytes:
    """`size` bytes (what fstat said), or fewer if the file shrank; never more."""
    chunks: list[bytes] = []
    left = size
    while left > 0:
        chunk = os.read(fd, left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


TEMPORARY_NAME_CHARS = 180
"""Of the file's own name, in its temporary file's name (a name has at most 255 bytes)."""


def write_atomically(parent: int, name: str, data: bytes, mode: int) -> None:
    """`name` in the folder `parent` holds `data` afterwards, with `mode`, or is exactly as it
    was: written to a temporary file beside it, fsynced, renamed into place. A full disk fails
    the write of the temporary file, which is removed; the file itself is never cut."""
    temporary = f".{name[:TEMPORARY_NAME_CHARS]}.{secrets.token_hex(4)}.soba-write"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, 0o600, dir_fd=parent)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=parent)
        raise
    with contextlib.suppress(OSError):  # the rename itself made durable
        os.fsync(parent)


def _exists(parent: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
