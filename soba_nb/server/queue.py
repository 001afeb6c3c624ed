"""The sidebar's queue: requests typed while a turn runs, run in order afterwards (SPEC §18).

Kept in the notebook's session folder as `queue.json` (`{"items": [{"id", "text"}, ...]}`),
so it survives a page reload and every tab of the notebook sees the same queue. Each change
reads the file, changes it and puts a new file in place (written beside it, then renamed:
never half-written), under one lock of the server process; `take_next` removes the first item
in the same step, so two tabs never run one item twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from soba_nb.inbox import MAX_TEXT_CHARS
from soba_nb.layout import QUEUE_FILE, sessions_folder_for
from soba_nb.server.paths import Refused

MAX_ITEMS = 200
MAX_FILE_BYTES = MAX_ITEMS * (4 * MAX_TEXT_CHARS + 64)
ID_BYTES = 6
_LOCK = threading.Lock()

Item = dict[str, str]


class Missing(LookupError):
    """No queued item has that id (one line)."""


def queue_file(notebook: Path) -> Path:
    return sessions_folder_for(notebook) / QUEUE_FILE


def checked_text(text: object) -> str:
    if not isinstance(text, str) or not text.strip():
        raise Refused("text: give the request's text (a non-empty string)")
    if len(text) > MAX_TEXT_CHARS:
        raise Refused(f"text: {len(text):,} characters, more than {MAX_TEXT_CHARS:,}")
    return text


def checked_id(item_id: object) -> str:
    if not isinstance(item_id, str) or not item_id:
        raise Refused("id: give the id of a queued item")
    return item_id


def items(notebook: Path) -> list[Item]:
    """The queue, first item first (empty when there is no file)."""
    with _LOCK:
        return _read(queue_file(notebook))


def add(notebook: Path, text: str) -> Item:
    item = {"id": os.urandom(ID_BYTES).hex(), "text": checked_text(text)}
    with _LOCK:
        found = _read(queue_file(notebook))
        if len(found) >= MAX_ITEMS:
            raise Refused(f"queue: {MAX_ITEMS} requests wait already; run or remove some first")
        _write(queue_file(notebook), [*found, item])
    return item


def change(notebook: Path, item_id: str, text: str) -> Item:
    text = checked_text(text)
    with _LOCK:
        found = _read(queue_file(notebook))
        index = _index(found, item_id)
        found[index] = {"id": item_id, "text": text}
        _write(queue_file(notebook), found)
        return found[index]


def remove(notebook: Path, item_id: str) -> Item:
    with _LOCK:
        found = _read(queue_file(notebook))
        item = found.pop(_index(found, item_id))
        _write(queue_file(notebook), found)
        return item


def take_next(notebook: Path) -> Item | None:
    """The first item, removed in the same step (None: the queue is empty)."""
    with _LOCK:
        found = _read(queue_file(notebook))
        if not found:
            return None
        _write(queue_file(notebook), found[1:])
        return found[0]


def _index(found: list[Item], item_id: str) -> int:
    for index, item in enumerate(found):
        if item["id"] == item_id:
            return index
    raise Missing(f"id {item_id!r}: no such queued item (run or removed already?)")


def _read(path: Path) -> list[Item]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise OSError(exc.errno, f"{path.name}: not read ({exc.strerror})") from None
    try:
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    try:
        loaded: Any = json.loads(data)
        found = loaded["items"]
        if not all(isinstance(i, dict) and isinstance(i.get("id"), str) and isinstance(i.get("text"), str) for i in found):
            raise ValueError("an item without id or text")
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path.name} is not a queue ({str(exc).splitlines()[0]}); move it aside to start a new one") from None
    return [{"id": i["id"], "text": i["text"]} for i in found]


def _write(path: Path, found: list[Item]) -> None:
    """`path` replaced whole by the new queue, or left as it was (a full disk: OSError)."""
    with contextlib.suppress(FileExistsError):
        path.parent.mkdir(mode=0o700)
    data = json.dumps({"items": found}, ensure_ascii=False, indent=1).encode()
    temporary = path.with_name(f".tmp-{os.urandom(4).hex()}-{path.name}")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
