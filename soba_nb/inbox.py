"""The mailbox of a session folder: what the sidebar sends a running turn (issue 42).

A busy kernel does not read its shell channel while a cell runs, so a steer message or an
edit decision goes through the Jupyter server (`soba_nb.server`), which writes one file per
message into `<notebook-stem>.soba/inbox/` (`layout.INBOX_FOLDER`):

    <time_ns:020d>-<8 hex>.json     {"kind": "steer", "text": "...", "sent": "<ISO-8601 UTC>"}
                                    {"kind": "edit", "call": "...", "executionCount": 4,
                                     "decision": "accepted" | "rejected", "sent": "..."}

`post` writes a message whole or not at all (a `.tmp-*` file renamed into place); `take`
takes them in name order (sending order), reading then unlinking each; a file it cannot
parse is renamed `<name>.bad` and said once, in one line. Both sides use this module, so the
format is spelled once.

This module imports only `layout`: the server, the agent and the notebook layers all use it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from soba_nb.layout import INBOX_FOLDER, sessions_folder_for

MESSAGE_SUFFIX = ".json"
TEMPORARY_PREFIX = ".tmp-"
BAD_SUFFIX = ".bad"
MAX_TEXT_CHARS = 100_000
"""A steer message longer than this is refused (it is a message, not a document)."""
MAX_MESSAGE_BYTES = 4 * MAX_TEXT_CHARS + 1024
"""A file larger than this is not a message of ours (it is set aside unread)."""
NAME_RANDOM_BYTES = 4

Text = Annotated[str, Meta(min_length=1, max_length=MAX_TEXT_CHARS)]


class Steer(Struct, tag_field="kind", tag="steer", kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A user message for the running turn: it reaches the model at the next tool boundary."""

    text: Text
    sent: str = ""


class Edit(Struct, tag_field="kind", tag="edit", kw_only=True, frozen=True, rename="camel", forbid_unknown_fields=True):
    """The user's decision on a proposed cell edit (`edit_cell`)."""

    call: Annotated[str, Meta(min_length=1, max_length=200)]
    execution_count: Annotated[int, Meta(ge=0)]
    decision: Literal["accepted", "rejected"]
    sent: str = ""


Message = Steer | Edit


class MessageError(ValueError):
    """A message that is not one of ours; its text is one line naming what was wrong."""


@dataclass
class Taken:
    """What `take` found: the messages in sending order, and one line per file set aside."""

    messages: list[Message] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def inbox_for(notebook: Path) -> Path:
    """`<notebook-stem>.soba/inbox/` of a notebook."""
    return sessions_folder_for(notebook) / INBOX_FOLDER


def sent_now() -> str:
    """ISO-8601 UTC, as the `sent` field says it."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse(data: bytes | str) -> Message:
    """A message from its JSON (raises `MessageError` with one line saying what was wrong)."""
    try:
        message: Message = msgspec.json.decode(data, type=Message)
    except msgspec.DecodeError as exc:
        where = str(exc).partition(" - at `$")
        line = where[0] if not where[2] else f"{where[2].rstrip('`').lstrip('.')}: {where[0]}"
        raise MessageError(f"not a soba message ({line.splitlines()[0] if line else 'unreadable'})") from None
    return message


def post(inbox: Path, message: Message) -> str:
    """Write `message` into `inbox` (created if missing, never through a link) whole or not at
    all; its file name (sorted after every earlier message). Raises `OSError` (a full disk: no
    file is left behind)."""
    _make_folder(inbox)
    name = f"{time.time_ns():020d}-{os.urandom(NAME_RANDOM_BYTES).hex()}{MESSAGE_SUFFIX}"
    temporary = inbox / f"{TEMPORARY_PREFIX}{name}"
    data = msgspec.json.encode(message)
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            view = memoryview(data)
            while view:  # a short write goes on; a full disk raises ENOSPC
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temporary, inbox / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return name


def _make_folder(inbox: Path) -> None:
    for folder in (inbox.parent, inbox):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
        if folder.is_symlink() or not folder.is_dir():
            raise OSError(f"{folder} is a link or not a folder: not written through")


def pending(inbox: Path) -> list[str]:
    """The names of the messages waiting, in sending order (temporary files left out)."""
    try:
        names = os.listdir(inbox)
    except OSError:
        return []
    return sorted(n for n in names if n.endswith(MESSAGE_SUFFIX) and not n.startswith(TEMPORARY_PREFIX))


def take(inbox: Path, accept: Callable[[Message], object] | None = None) -> Taken:
    """Every waiting message, oldest first, each read then removed; a file that is no message
    (or a link, or too large) is renamed `<name>.bad` and named in `problems`. An inbox that
    is a link is not read at all. `accept` is called with each message before its file is
    removed: if it raises (the transcript could not be written), the file stays for next time
    and the exception goes on."""
    taken = Taken()
    if inbox.is_symlink():
        taken.problems.append(f"inbox: {inbox} is a link; not read")
        return taken
    for name in pending(inbox):
        path = inbox / name
        try:
            data = _read(path)
        except FileNotFoundError:
            continue  # taken by someone else meanwhile
        except (OSError, MessageError) as exc:
            taken.problems.append(_set_aside(path, str(exc)))
            continue
        try:
            message = parse(data)
        except MessageError as exc:
            taken.problems.append(_set_aside(path, str(exc)))
            continue
        if accept is not None:
            accept(message)
        taken.messages.append(message)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            taken.problems.append(f"inbox: {name} was taken but could not be removed ({exc.strerror})")
    return taken


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        if info.st_size > MAX_MESSAGE_BYTES:
            raise MessageError(f"{info.st_size:,} bytes, more than a message ({MAX_MESSAGE_BYTES:,})")
        if not stat.S_ISREG(info.st_mode):
            raise MessageError("not a regular file")
        return os.read(fd, MAX_MESSAGE_BYTES + 1)
    finally:
        os.close(fd)


def _set_aside(path: Path, why: str) -> str:
    """Rename `path` to `<name>.bad` (or remove it if that fails); the one line saying so."""
    try:
        os.rename(path, path.with_name(path.name + BAD_SUFFIX))
        where = f"set aside as {path.name}{BAD_SUFFIX}"
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        where = "removed"
    return f"inbox: {path.name} is not a message ({why}); {where}"
