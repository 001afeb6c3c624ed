"""What can go wrong with a transcript, as exceptions and a warning (shared by the store,
the reader and the opener)."""

from __future__ import annotations

import msgspec


class TranscriptError(ValueError):
    """The transcript file is malformed. The message names the file and line."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


class TranscriptLockedError(RuntimeError):
    """Another writer (for example a second kernel on the same notebook) holds the file."""


class TranscriptWriteError(OSError):
    """An append did not reach the file (a full disk, a deleted transcript): the entry is not
    acknowledged, and the file stays as openable as after a crash."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.errno = code

    def __str__(self) -> str:  # the message alone, without OSError's "[Errno 28]"
        return str(self.args[0])


class TornLineWarning(UserWarning):
    """The last line was cut short by a crash; it is ignored."""


def is_json_error(exc: msgspec.DecodeError) -> bool:
    """True when the text was not JSON at all (a torn line), not JSON of the wrong shape."""
    return not isinstance(exc, msgspec.ValidationError)  # `entries.EntryError`


def describe_error(exc: msgspec.DecodeError) -> str:
    """`field: what was wrong`, from a decode or validation error."""
    message = str(exc)
    text, _, where = message.partition(" - at `$")
    if not where:
        return "not a JSON object" if message.startswith("Expected `object`") else message
    location = where.rstrip("`").lstrip(".") or "entry"
    return f"{location}: {text}"
