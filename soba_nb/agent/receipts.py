"""A tool call's receipt line, in the same words wherever it is shown: the cell, the
sidebar's conversation, and the conversation the Jupyter server reads back from a transcript
(`soba_nb.server.conversation`)."""

from __future__ import annotations

MS_PER_S = 1000
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
