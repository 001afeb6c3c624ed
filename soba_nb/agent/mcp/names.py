"""The names MCP tools are offered under: `mcp__<server>__<tool>`, within the providers' rule
for tool names (`^[a-zA-Z0-9_-]{1,64}$`). No soba tool starts with `mcp__`, so none can clash
with soba's own; two tools whose names meet after sanitizing get a numbered suffix."""

from __future__ import annotations

import re
from collections.abc import Container

MCP_PREFIX = "mcp__"
MAX_NAME_CHARS = 64
"""The longest tool name OpenAI and Anthropic take."""
_NOT_ALLOWED = re.compile(r"[^a-zA-Z0-9_-]")


def is_mcp_tool(name: str) -> bool:
    """Whether a call names an MCP tool (never one of soba's)."""
    return name.startswith(MCP_PREFIX)


def offered_name(server: str, tool: str, taken: Container[str]) -> str:
    """`mcp__<server>__<tool>`, sanitized and at most 64 characters, none of `taken`."""
    base = (MCP_PREFIX + _NOT_ALLOWED.sub("_", server) + "__" + (_NOT_ALLOWED.sub("_", tool) or "_"))
    name = base[:MAX_NAME_CHARS]
    number = 2
    while name in taken:
        suffix = f"_{number}"
        name = base[: MAX_NAME_CHARS - len(suffix)] + suffix
        number += 1
    return name
