"""Clipping text to a size, the one way soba does it everywhere: a line in a listing or an
error, an item of a capsule, a tool output in model input or in a summary request.

- `clip(text, limit)`: at most `limit` characters, an ellipsis when cut;
- `one_line(text, limit)`: whitespace collapsed to single spaces, then `clip`;
- `first_line(text, limit)`: the first line that says something (not blank, not a fence);
- `head_and_tail(text, limit)`: on one line, its start and its end around an ellipsis;
- `clip_middle(text, limit, note)`: multi-line, its head and tail around a note saying how
  much was cut (the note is the caller's: model input and summary requests word it so).

This module imports nothing of soba's: every layer may use it.
"""

from __future__ import annotations

ELLIPSIS = "…"
MIDDLE_NOTE = "[… {count} characters clipped …]"
"""The note `clip_middle` puts where it cut, unless the caller words its own."""
WIDTH_SCAN = 4
"""`one_line` looks at no more than this many characters per character it may keep: a huge
text is not split whole to show its first line."""


def clip(text: str, limit: int) -> str:
    """`text`, or its first `limit - 1` characters and an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def one_line(text: str, limit: int) -> str:
    """Whitespace collapsed, clipped to `limit` characters with an ellipsis."""
    return clip(" ".join(text[: limit * WIDTH_SCAN].split()), limit)


def first_line(text: str, limit: int) -> str:
    """The first line that says something: blank lines and code-fence markers are skipped."""
    meaningful = (s for s in text[: limit * 8].splitlines() if s.strip() and not s.lstrip().startswith(("```", "~~~")))
    return one_line(next(meaningful, ""), limit)


def head_and_tail(text: str, limit: int) -> str:
    """Whitespace collapsed; when longer than `limit` characters, its start and its end around
    an ellipsis (a request's end often says what it asks: "… and plot the outliers")."""
    if len(text) <= limit * WIDTH_SCAN:
        line = " ".join(text.split())
    else:
        line = " ".join((text[: limit * 2] + " " + text[-limit * 2 :]).split())
    if len(line) <= limit:
        return line
    head = max((limit - 3) * 2 // 3, 1)
    tail = max(limit - 3 - head, 1)
    return f"{line[:head]} {ELLIPSIS} {line[-tail:]}"


def clip_middle(text: str, limit: int, note: str = MIDDLE_NOTE) -> str:
    """`text` if it fits `limit` characters, else `limit` of them, its head and tail (half
    each; the note alone for 0), around `note` (`{count}`: the characters cut), each on its
    own line."""
    if len(text) <= limit:
        return text
    head = max(limit, 0) // 2
    tail = max(limit, 0) - head
    removed = len(text) - head - tail
    return f"{text[:head]}\n{note.format(count=removed)}\n{text[len(text) - tail:] if tail else ''}"
