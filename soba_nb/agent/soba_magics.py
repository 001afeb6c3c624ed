"""soba's own magics in a cell's source: the conversation, not the notebook's code.

A cell that uses them is left out of the model's view of the cells (`notebook/cells.py`); its
other lines are still the user's code, which `/code` exports and `/rebuild` re-runs without
them (a re-run must never start a turn or load soba again).
"""

from __future__ import annotations

import re

SOBA_MAGICS = re.compile(
    r"^[ \t]*%{1,2}(soba|compact|budget|capsule|auto_compact|rewind|checkpoint)\b|^[ \t]*%(re|un)?load_ext[ \t]+soba_nb\b",
    re.MULTILINE,
)
"""A line that uses soba's own magics. (No `\\s` before the `%`: it would cross lines, and a
cell of many blank lines took quadratic time.)"""
_SOBA_CELL_MAGIC = re.compile(r"\A\s*%%(soba|capsule|compact)\b")


def without_soba_lines(source: str) -> str:
    """`source` without the lines that use soba's magics (all of it for a `%%soba` cell)."""
    if _SOBA_CELL_MAGIC.match(source):
        return ""
    return "\n".join(line for line in source.splitlines() if not SOBA_MAGICS.match(line))


def is_only_soba(source: str) -> bool:
    """True for a cell that is soba's conversation alone (a `%%soba` request, magic lines)."""
    return not without_soba_lines(source).strip()
