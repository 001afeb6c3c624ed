"""An MCP call's receipt line: `mcp__time__get_current_time {"timezone": "UTC"}`, one line,
control characters escaped (the arguments are the model's, the name a server's)."""

from __future__ import annotations

import json
from collections.abc import Callable

from soba_nb.agent.mcp.names import is_mcp_tool
from soba_nb.printable import printable
from soba_nb.text import one_line

SUMMARY_CHARS = 80


def summarize_call(name: str, arguments: str, soba_summary: Callable[[str, str], str]) -> str:
    """The receipt line of a call: an MCP tool's name and arguments, or soba's own summary."""
    if not is_mcp_tool(name):
        return soba_summary(name, arguments)
    try:
        given = json.loads(arguments or "{}", strict=False)
        shown = json.dumps(given, ensure_ascii=False) if given else ""
    except (ValueError, RecursionError):
        shown = "(invalid arguments)"
    return printable(one_line(f"{name} {shown}".strip(), SUMMARY_CHARS))
