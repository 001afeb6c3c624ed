"""Reading and writing the files capsules travel in: read without trusting, written to be
shared (SPEC §8, §13).

Reading: only a regular file of a bounded size, UTF-8 (a FIFO or `/dev/zero` is refused
before a byte is read).

Writing is atomic — a temporary file in the target's folder, fsynced, then published under
its name — so a reader never sees half a file. A file is published with a hard link, which
fails when the name is taken: nothing is written over another file unless the caller says
so (`force`, or `publish_new`'s `replaces`). These files are made to be shared (a handoff, a
team's project memory), so they are created the way any program creates a file: mode 0666
less the user's umask, and, in a setgid folder, the folder's group (the kernel gives it to a
file made inside). A folder made on the way inside a setgid folder (a project's `.soba/memory/`
in a team's folder) also takes that folder's group permissions, whatever the umask: every
member writes project memory, and the first member's umask 027 must not lock the others out
(`make_folder`). Transcripts and side-cars are private and are not written here.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from soba_nb.redact import redact_file_name

FILE_SUFFIX = ".capsule.md"
"""A portable capsule file's name ends so (the format is `soba_nb.capsule_files.file`)."""
MAX_FILE_BYTES = 16 * 1024 * 1024
"""A capsule is a few kilobytes; refuse to read something absurdly large into the kernel."""
SHARED_FILE_MODE = 0o666
"""Less the umask: the user's own rule for who reads what they make."""
TEMPORARY_SUFFIX = ".tmp"
MAX_NAME_ATTEMPTS = 1000
"""`publish_new` tries `<stem>-2`, `-3`, … up to this many names."""
_TEMPORARY_ATTEMPTS = 100


class CapsuleFileError(ValueError):
    """A `.capsule.md` file cannot be read or written. One line: the file, then the problem."""

    def __init__(self, source: str | os.PathLike[str], problem: str):
        self.source = str(source)
        self.problem = problem
        super().__init__(f"{self.source}: {problem}")


def read_text_file(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES, kind: str = "a capsule file"
) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes`. Raises `CapsuleFileError`.

    Only a regular file is read, and only after its size (from the opened descriptor) is
    checked: `/dev/zero`, a FIFO or a 10 GB file is refused before a byte is read. `kind`
    names what the file should be, in errors ("a capsule file", "a Markdown handoff").
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except IsADirectoryError:
        raise CapsuleFileError(path, f"is a folder, not {kind}") from None
    except FileNotFoundError:
        raise CapsuleFileError(path, "no such file") from None
    except OSError as exc:
        raise CapsuleFileError(path, f"cannot read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise CapsuleFileError(path, f"is a folder, not {kind}")
        if not stat.S_ISREG(info.st_mode):
            raise CapsuleFileError(path, f"not a regular file (a device, FIFO or socket); expected {kind}")
        if info.st_size > max_bytes:
            raise CapsuleFileError(path, f"file is {info.st_size:,} bytes; {kind} is at most {max_bytes:,}")
        with os.fdopen(os.dup(fd), "rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise CapsuleFileError(path, f"cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        raise CapsuleFileError(path, f"file grew past {max_bytes:,} bytes while being read")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CapsuleFileError(path, f"not UTF-8 text (bad byte at offset {exc.start})") from None


def write_file_atomically(
    path: str | os.PathLike[str], data: bytes, *, force: bool = False, suffix: str = FILE_SUFFIX
) -> Path:
    """Write `data` atomically (temporary file, fsync, publish); returns the path written.

    The file name is redacted (`handoff-sk-….md`); the caller redacts `data`. An existing
    file is replaced only with `force`. `suffix` is the ending a file name is expected to
    have, for the message when `path` is a folder. Raises `CapsuleFileError`.
    """
    path = _target(path, suffix)
    if path.exists() and not force:
        raise CapsuleFileError(path, "already exists; add --force to overwrite it")
    with _Temporary(path) as temp:
        temp.write(data)
        if force:
            temp.replace(path)
        elif not temp.link(path):
            raise CapsuleFileError(path, "already exists; add --force to overwrite it")
    return path


def publish_new(
    path: str | os.PathLike[str], data: bytes, *, suffix: str, replaces: Callable[[Path], bool] = lambda _: False
) -> Path:
    """Write `data` atomically under `path`'s name, or the next free one (`<stem>-2<suffix>`,
    `-3`, …) when that is taken; returns the path written. Never over another file: each
    name is claimed with a hard link, which fails when someone else claimed it first, so
    writers in several processes at once each get a name of their own. `replaces(existing)`:
    whether an existing file may be replaced (the same file written again by its writer).
    Raises `CapsuleFileError`."""
    path = _target(path, suffix)
    stem = path.name.removesuffix(suffix)
    with _Temporary(path) as temp:
        temp.write(data)
        for attempt in range(1, MAX_NAME_ATTEMPTS + 1):
            candidate = path if attempt == 1 else path.with_name(f"{stem}-{attempt}{suffix}")
            if os.path.lexists(candidate) and replaces(candidate):
                temp.replace(candidate)
                return candidate
            if temp.link(candidate):
                return candidate
    raise CapsuleFileError(path, f"{MAX_NAME_ATTEMPTS} files of this name already exist")


def _target(path: str | os.PathLike[str], suffix: str) -> Path:
    path = Path(path)
    path = path.with_name(redact_file_name(path.name))
    if path.is_dir():
        raise CapsuleFileError(path, f"is a folder; give a file name ending in {suffix}")
    return path


class _Temporary:
    """A new file beside `target` (`.<name>.<random>.tmp`), removed on exit unless published.
    `OSError`s inside the block become `CapsuleFileError`s naming `target`."""

    def __init__(self, target: Path):
        self.target = target
        self.path: Path | None = None
        self.fd: int | None = None

    def __enter__(self) -> _Temporary:
        try:
            make_folder(self.target.parent)
            for _ in range(_TEMPORARY_ATTEMPTS):
                path = self.target.with_name(f".{self.target.name}.{secrets.token_hex(4)}{TEMPORARY_SUFFIX}")
                try:
                    # Mode 0666: the kernel takes the umask off, as for any file the user makes.
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, SHARED_FILE_MODE)
                except FileExistsError:
                    continue
                self.fd, self.path = fd, path
                return self
            raise FileExistsError(f"no free temporary name after {_TEMPORARY_ATTEMPTS} tries")
        except OSError as exc:
            raise CapsuleFileError(self.target, f"cannot write ({exc.strerror or exc})") from None

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise CapsuleFileError(self.target, f"cannot write ({error.strerror or error})") from None

    def write(self, data: bytes) -> None:
        """Through the descriptor it was made with, never by name again: in a shared
        folder, the name could be someone else's link by now."""
        assert self.fd is not None
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        os.fsync(self.fd)
        os.close(self.fd)
        self.fd = None

    def replace(self, path: Path) -> None:
        assert self.path is not None
        os.replace(self.path, path)
        self.path = None
        _sync_folder(path.parent)

    def link(self, path: Path) -> bool:
        """Publish under `path` unless the name is taken; False when it is."""
        assert self.path is not None
        try:
            os.link(self.path, path)
        except FileExistsError:
            return False
        except OSError:
            # A file system without hard links: claim the name first, so a writer never
            # replaces a file that appeared meanwhile (a reader may see it empty, briefly).
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, SHARED_FILE_MODE))
            except FileExistsError:
                return False
            os.replace(self.path, path)
            self.path = None
        _sync_folder(path.parent)
        return True


def make_folder(folder: Path) -> None:
    """Make `folder` and its missing parents. One made inside a setgid folder gets that
    folder's group permissions too (as it gets its group and setgid bit from the kernel).

    Such a folder is made under a temporary name, given its mode, then renamed into place, so
    another kernel never finds it with the umask's mode; a rename meets at most an empty
    folder another kernel has just made the same way."""
    if folder.is_dir():
        return
    make_folder(folder.parent)
    parent = os.stat(folder.parent)
    if not parent.st_mode & stat.S_ISGID:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder)
        return
    temporary = folder.with_name(f".{folder.name}.{secrets.token_hex(4)}{TEMPORARY_SUFFIX}")
    os.mkdir(temporary)
    try:
        mode = stat.S_IMODE(os.stat(temporary).st_mode) | (parent.st_mode & stat.S_IRWXG) | stat.S_ISGID
        os.chmod(temporary, mode)
        os.rename(temporary, folder)
    except OSError:
        if not folder.is_dir():
            raise
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(temporary)


def _sync_folder(folder: Path) -> None:
    """Make the new name durable (best effort: not every platform opens folders)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
