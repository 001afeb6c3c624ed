"""A tool call's receipt line, in the same words wherever it is shown: the cell, the
sidebar's conversation, and the conversation the Jupyter server reads back from a transcript
(`soba_nb.server.conversation`)."""

from __future__ import annotations

MS_PER_S = 1000
PREVIEW_LINES = 3
PREVIEW_CHARS = 240
"""A receipt shows the first lines of a call's result, at most this long."""
DECLINED = "declined"
"""The status of a call the user declined (an `approval` entry, `declined` or `no_input`): it
never ran, so it is neither `ok` nor `error`, and has no duration."""


def receipt_status(is_error: bool, declined: bool = False) -> str:
    return DECLINED if declined else "error" if is_error else "ok"


def receipt_text(name: str, summary: str, status: str, duration_ms: int | None) -> str:
    """`python: df.describe() · ok · 0.4 s` (the summary names the tool; else it is added)."""
    parts = [summary if summary.startswith(name) else " · ".join(filter(None, (name, summary)))]
    parts.append(status)
    if duration_ms is not None:
        parts.append(f"{duration_ms / MS_PER_S:.1f} s")
    return " · ".join(parts)


def result_preview(content: str) -> str:
    """The first lines of a call's result for its receipt, and what was left out of them
    (`… 10 more lines (the whole result is in the transcript)`): a preview that stops without
    saying so reads as the whole output."""
    lines = content.splitlines()
    shown = "\n".join(lines[:PREVIEW_LINES])
    clipped = shown[:PREVIEW_CHARS]
    more = len(lines) - PREVIEW_LINES
    if more > 0:
        return f"{clipped}{'…' if len(clipped) < len(shown) else ''}\n… {more} more line{'s' if more != 1 else ''} (the whole result is in the transcript)"
    return clipped + ("…" if len(clipped) < len(shown) else "")
