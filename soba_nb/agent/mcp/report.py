"""`soba-nb doctor`'s lines on the MCP servers (SPEC §19): each server started as a session
would start it, its tools listed under the names the model is offered, or its one-line
failure; then stopped. The command and arguments are shown redacted; `env` by its names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from soba_nb.agent.mcp.servers import McpServers
from soba_nb.printable import note_line
from soba_nb.redact import redact

LINE_CHARS = 400
LABEL = "mcp        "


def doctor_lines(config: Any, folder: Path) -> list[str]:
    """One line per configured server (none: one line saying so)."""
    settings = config.mcp_servers
    if not settings:
        return [LABEL + "no servers (mcpServers)"]
    servers = McpServers(settings, cwd=folder)
    try:
        servers.start()
        lines = []
        for name in sorted(settings):
            given = settings[name]
            where = f"url {given.url}" if given.url else "stdio " + " ".join([given.command or "", *given.args])
            if given.env:
                where += " · env " + ", ".join(sorted(given.env))
            set_in = config.set_by(f"mcpServers.{name}")
            where += f" ({set_in})" if set_in else ""
            if name in servers.failures:
                told = f"{name} · {where} · FAILED: {servers.failures[name]}"
            else:
                offered = [tool for tool, found in servers.tools.items() if found.server == name]
                told = f"{name} · {where} · {len(offered)} tools: {', '.join(offered) or '(none)'}"
            lines.append(LABEL + note_line(redact(told), LINE_CHARS))
        return lines
    finally:
        servers.close()
