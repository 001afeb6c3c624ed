"""Reading a configuration file without trusting it (SPEC §12): only a regular file of a sane
size (a folder, a FIFO, a device or a broken link is one line of error, and a FIFO is never
waited on), JSON of a sane depth, an object at the top."""

from __future__ import annotations

import codecs
import json
import os
import stat
from pathlib import Path
from typing import Any

from soba_nb.config.errors import ConfigError
from soba_nb.layout import PROJECT_CONFIG_NAME

MAX_CONFIG_BYTES = 1024 * 1024
"""A configuration is a few hundred bytes; a larger file is not one, and `/dev/zero` must
not be read forever."""


MAX_CONFIG_DEPTH = 16
"""The deepest key is two levels down (`compaction.timeoutMs`); deeper nesting is not a
configuration, and nesting thousands deep would exhaust the parser's recursion."""


_FILE_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_a_file(path: Path, mode: int) -> ConfigError | None:
    """The refusal for anything but a regular file (links are followed to their target)."""
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
    return ConfigError(f"{path}: cannot read config file: it is {kind}, not a JSON file")


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, refusing what is not a small regular file without waiting on it.

    `stat` first, so a FIFO is never opened (an open for reading blocks until a writer
    comes); the open is non-blocking all the same and checked again, as the name may be
    replaced in between. At most `MAX_CONFIG_BYTES` are read, so a file that never ends
    (`/dev/zero` behind a link, a growing log) ends here."""
    try:
        refusal = _not_a_file(path, os.stat(path).st_mode)
        if refusal is not None:
            raise refusal
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        refusal = _not_a_file(path, info.st_mode)
        if refusal is not None:
            raise refusal
        data = b"" if info.st_size > MAX_CONFIG_BYTES else file.read(MAX_CONFIG_BYTES + 1)
    if info.st_size > MAX_CONFIG_BYTES or len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: config file is larger than {MAX_CONFIG_BYTES:,} bytes; not a configuration")
    return data


def depth(value: Any) -> int:
    """How deeply `value` nests (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            if deepest > MAX_CONFIG_DEPTH:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _mistake_at(text: str, at: int) -> str:
    """What a hand-edited file most often holds where JSON stopped reading it, in words
    (Python's message says only what it expected there), or nothing."""
    if text.startswith(("//", "/*", "#"), at):
        return " — comments are not JSON"
    if text.startswith("'", at):
        return " — JSON names and strings take double quotes"
    if text.startswith(("}", "]"), at) and text[:at].rstrip().endswith(","):
        return f" — a comma before {text[at]!r}, which JSON does not allow"
    return ""


def read_config_file(path: Path) -> dict[str, Any]:
    data = _read_bytes(path)
    # A byte order mark before the JSON (Windows editors save UTF-8 with one) is not part of
    # it: RFC 8259 lets a reader ignore it, and a user cannot see it to take it out.
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        text = data[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {bom + exc.start})") from None

    def not_a_number(name: str) -> Any:
        # Python's json reads NaN and Infinity, which are not JSON and no figure can be.
        raise ConfigError(f"{path}: not valid JSON ({name} is not a JSON number)")

    too_deep = ConfigError(f"{path}: nested too deeply (more than {MAX_CONFIG_DEPTH} levels); not a configuration")
    try:
        parsed = json.loads(text, parse_constant=not_a_number)
    except json.JSONDecodeError as exc:
        hint = _mistake_at(exc.doc, exc.pos)
        raise ConfigError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}{hint})"
        ) from None
    except RecursionError:
        raise too_deep from None
    except ConfigError:
        raise
    except ValueError:  # an integer of thousands of digits: Python refuses to convert it
        raise ConfigError(f"{path}: a number in it has too many digits to be a setting") from None
    if depth(parsed) > MAX_CONFIG_DEPTH:
        raise too_deep
    if not isinstance(parsed, dict):
        raise ConfigError(f"{path}: the top level must be a JSON object")
    return parsed


def find_project_config(start: Path) -> Path | None:
    """The `soba.json` in `start` or its nearest parent holding one.

    Whatever stands under that name counts (a folder, a FIFO, a link to a device): it is
    refused when read, rather than skipped for a parent's file or the defaults (SPEC §12)."""
    start = start.resolve()
    for folder in (start, *start.parents):
        candidate = folder / PROJECT_CONFIG_NAME
        if os.path.lexists(candidate):
            return candidate
    return None
