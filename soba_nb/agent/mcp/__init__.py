"""Tools from MCP servers (SPEC §19), through the official MCP Python SDK (`mcp` on PyPI).

`servers.McpServers` is a session's client manager: the servers of `mcpServers` started on a
thread of its own running an event loop (the SDK is async; the kernel's thread never waits on
a server longer than a timeout), their tools offered beside soba's under names that cannot
clash (`names`), called and their results turned into soba's tool outcomes (`results`), and
every server stopped with the session (no process left behind). `servers` is imported where
a session is built, not here: a command that reads a transcript imports no event loop."""

from soba_nb.agent.mcp.names import MCP_PREFIX as MCP_PREFIX  # re-exported
from soba_nb.agent.mcp.names import is_mcp_tool as is_mcp_tool  # re-exported
