"""Text from a user, a file, a server or the model, made safe to show (SPEC §13).

A note, a title or a request can hold terminal control sequences (`\\x1b[2J` clears the
screen, `\\x07` rings the bell, `\\x1b]8;;…` plants a link) or bidirectional overrides that
make text read differently from what it is. Every listing shows such characters escaped, as
Python would write them (`\\x1b`), never raw: C0 and C1 controls, DEL, and the Unicode
bidirectional controls.
"""

from __future__ import annotations

import re

from soba_nb.text import one_line

NOTE_CHARS = 70
"""A note or title in a one-line listing is clipped to this many characters."""

_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROLS_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str, *, lines: bool = False) -> str:
    """`text` with every control character escaped; `lines`: newlines and tabs kept (a
    capsule's Markdown shown whole)."""
    return (_CONTROLS_BUT_LINES if lines else _CONTROLS).sub(_escape, text)


def note_line(text: str, limit: int = NOTE_CHARS) -> str:
    """A note on one line of a listing: whitespace collapsed, clipped to `limit` characters
    with an ellipsis, control characters escaped (after clipping, so an escape is never cut)."""
    return printable(one_line(text, limit))
