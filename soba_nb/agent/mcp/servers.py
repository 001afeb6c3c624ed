"""A session's MCP servers (SPEC §19): started, asked for their tools, called, stopped.

The SDK is async; soba's turn loop is not. The servers live on one thread of this manager's
own, running an asyncio loop: each server is one task holding the SDK's transport
(`stdio_client`: a child process; `streamable_http_client`: a URL) and `ClientSession` open
until `close()`, so the SDK's own shutdown (stdin closed, then the process group terminated,
then killed) runs in the task that opened it. The kernel's thread only ever waits with a
timeout: `START_TIMEOUT_S` for every server to start and list its tools (they start side by
side), `CALL_TIMEOUT_S` for a call, `STOP_TIMEOUT_S` for all to stop. A server that fails
or does not answer is one line naming it, and the session goes on without its tools.

`env` values are handed to the child process and nowhere else: never logged, shown or
recorded. A server's stderr goes to the null device, never into a cell or a transcript."""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soba_nb.agent.mcp.names import offered_name
from soba_nb.agent.mcp.results import outcome_of, tool_schema
from soba_nb.agent.tools.base import ToolOutcome
from soba_nb.config.settings import McpServerSettings
from soba_nb.messages import ToolSchema
from soba_nb.printable import printable
from soba_nb.redact import register_child_environment
from soba_nb.text import one_line

START_TIMEOUT_S = 20.0
"""How long the servers have, side by side, to start, initialize and list their tools."""
CALL_TIMEOUT_S = 120.0
"""How long one tool call may take before it is answered as a timeout (the server lives on)."""
STOP_TIMEOUT_S = 8.0
"""How long stopping may take (the SDK waits 2 s for a server to leave, then terminates it)."""
MAX_TOOL_PAGES = 20
"""`tools/list` pages read at most (a server that pages forever is not waited on)."""
_POLL_S = 0.2
_LIVE: set[McpServers] = set()
"""Every manager with servers running, held until `close()`: a session dropped without closing
still has its servers stopped at exit (a weak set would let it go, and them run on)."""


@dataclass(frozen=True)
class McpTool:
    """One server's tool as offered: the name the model calls, the server's own name for it."""

    server: str
    name: str
    schema: ToolSchema


class _Server:
    """One open server: its task, the SDK session, and the event that ends it."""

    def __init__(self, name: str, settings: McpServerSettings):
        self.name = name
        self.settings = settings
        self.session: Any = None
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


class McpServers:
    """The MCP servers of one configuration; nothing starts until `start()`."""

    def __init__(self, servers: Mapping[str, McpServerSettings], cwd: Path | None = None):
        self.settings = dict(servers)
        self.cwd = cwd
        self.tools: dict[str, McpTool] = {}
        """The tools offered, by the name the model calls them."""
        self.listed: dict[str, tuple[str, ...]] = {}
        """Each server that started: the names of its tools as the server gives them."""
        self.failures: dict[str, str] = {}
        """Each server that failed: why, in a few words (`start` returns the whole lines)."""
        self._servers: dict[str, _Server] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = False
        self._lock = threading.Lock()

    @property
    def schemas(self) -> tuple[ToolSchema, ...]:
        return tuple(tool.schema for tool in self.tools.values())

    def start(self) -> list[str]:
        """Start every server (once); the lines for those that failed, each naming its server.
        Interrupted (■), every server is stopped and the next turn starts them again."""
        try:
            return self._start()
        except KeyboardInterrupt:
            self.close()
            self.listed, self.failures, self._started = {}, {}, False
            raise

    def _start(self) -> list[str]:
        with self._lock:
            if self._started or not self.settings:
                return []
            self._started = True
            loop = self._run_loop()
            pending = {name: self._open(loop, name, settings) for name, settings in sorted(self.settings.items())}
            deadline = time.monotonic() + START_TIMEOUT_S
            for name, future in pending.items():
                try:
                    tools = _wait(future, deadline)
                except FutureTimeout:
                    future.cancel()
                    self._fail(name, f"did not answer within {START_TIMEOUT_S:g} s")
                    continue
                except Exception as exc:
                    self._fail(name, f"failed to start ({_why(exc)})")
                    continue
                self._offer(name, tools)
            return [failure_line(name, self.failures[name]) for name in sorted(self.failures)]

    def call(self, offered: str, arguments: str, cancel: threading.Event | None = None) -> ToolOutcome:
        """Call an offered tool with the model's argument text; every problem is an error outcome."""
        tool = self.tools.get(offered)
        server = self._servers.get(tool.server) if tool is not None else None
        if tool is None or server is None or server.session is None or self._loop is None:
            return ToolOutcome(f"unknown tool '{printable(offered)}': no MCP server offers it in this turn", True)
        try:
            given = json.loads(arguments if arguments.strip() else "{}", strict=False)
        except (ValueError, RecursionError) as exc:
            return ToolOutcome(f"{offered}: arguments are not valid JSON ({exc})", True)
        if not isinstance(given, dict):
            return ToolOutcome(f"{offered}: arguments must be a JSON object", True)
        future = asyncio.run_coroutine_threadsafe(server.session.call_tool(tool.name, given), self._loop)
        deadline = time.monotonic() + CALL_TIMEOUT_S
        try:
            while True:
                try:
                    return outcome_of(future.result(timeout=_POLL_S))
                except FutureTimeout:
                    if cancel is not None and cancel.is_set():
                        future.cancel()
                        return ToolOutcome(f"{offered}: cancelled", True)
                    if time.monotonic() >= deadline:
                        future.cancel()
                        return ToolOutcome(
                            f"{offered}: MCP server '{tool.server}' did not answer within {CALL_TIMEOUT_S:g} s", True
                        )
        except KeyboardInterrupt:
            future.cancel()
            raise
        except Exception as exc:
            return ToolOutcome(f"{offered}: MCP server '{tool.server}' failed: {_why(exc)}", True)

    def close(self) -> None:
        """Stop every server and the loop's thread; no process is left behind."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
            servers, self._servers = list(self._servers.values()), {}
            self.tools = {}
            _LIVE.discard(self)
            if loop is None or thread is None:
                return
            with suppress(Exception):  # on a timeout each task was cancelled: the SDK's shielded shutdown ran
                asyncio.run_coroutine_threadsafe(_stop_all(servers), loop).result(timeout=STOP_TIMEOUT_S + 2)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=STOP_TIMEOUT_S)

    def _run_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                loop.close()

        thread = threading.Thread(target=run, name="soba-mcp", daemon=True)
        thread.start()
        ready.wait()
        self._loop, self._thread = loop, thread
        _LIVE.add(self)
        return loop

    def _open(self, loop: asyncio.AbstractEventLoop, name: str, settings: McpServerSettings) -> Future[list[Any]]:
        server = _Server(name, settings)
        self._servers[name] = server
        listed: Future[list[Any]] = Future()

        def begin() -> None:
            server.task = loop.create_task(_serve(server, self.cwd, listed))

        loop.call_soon_threadsafe(begin)
        return listed

    def _offer(self, server: str, tools: list[Any]) -> None:
        self.listed[server] = tuple(str(tool.name) for tool in tools)
        for tool in tools:
            name = offered_name(server, str(tool.name), self.tools)
            schema = tool_schema(name, server, tool.description, tool.input_schema)
            self.tools[name] = McpTool(server, str(tool.name), schema)

    def _fail(self, name: str, why: str) -> None:
        self.failures[name] = why
        server = self._servers.pop(name, None)
        if server is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(server.stop.set)
            if server.task is not None:
                self._loop.call_soon_threadsafe(server.task.cancel)


def _wait(future: Future[list[Any]], deadline: float) -> list[Any]:
    """The future's result by `deadline`, waited for in short slices: an interrupt is taken at
    once, however it comes (a signal, or `interrupt_main` from the sidebar's Cancel)."""
    while True:
        try:
            return future.result(timeout=max(0.0, min(_POLL_S, deadline - time.monotonic())))
        except FutureTimeout:
            if time.monotonic() >= deadline:
                raise


def failure_line(name: str, why: str) -> str:
    """The one line a cell shows for a server that failed."""
    return f"MCP server '{printable(name)}' {why}: the turn goes on without its tools"


async def _serve(server: _Server, cwd: Path | None, listed: Future[list[Any]]) -> None:
    """Open the server, list its tools into `listed`, then hold it open until told to stop."""
    from mcp import ClientSession  # the SDK is imported when a server is started, not before

    try:
        async with AsyncExitStack() as stack:
            streams = await stack.enter_async_context(_transport(server.settings, cwd, stack))
            session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
            await session.initialize()
            tools: list[Any] = []
            cursor = None
            for _ in range(MAX_TOOL_PAGES):
                page = await session.list_tools(params=None if cursor is None else _page(cursor))
                tools += page.tools
                cursor = page.next_cursor
                if cursor is None:
                    break
            server.session = session
            if not listed.set_running_or_notify_cancel():
                return
            listed.set_result(tools)
            await server.stop.wait()
    except BaseException as exc:
        if not listed.done() and listed.set_running_or_notify_cancel():
            listed.set_exception(exc if isinstance(exc, Exception) else RuntimeError("stopped"))
        if not isinstance(exc, Exception):
            raise
    finally:
        server.session = None


def _transport(settings: McpServerSettings, cwd: Path | None, stack: AsyncExitStack) -> Any:
    if settings.url is not None:
        from mcp.client.streamable_http import streamable_http_client

        return streamable_http_client(settings.url)
    from mcp.client.stdio import StdioServerParameters, stdio_client

    register_child_environment(settings.env)  # a secret it echoes back is redacted on disk
    errlog = stack.enter_context(open(os.devnull, "w"))  # noqa: SIM115 - closed with the stack
    parameters = StdioServerParameters(
        command=settings.command or "", args=list(settings.args), env=dict(settings.env) or None,
        cwd=str(cwd) if cwd is not None else None,
    )
    return stdio_client(parameters, errlog=errlog)


def _page(cursor: str) -> Any:
    from mcp_types import PaginatedRequestParams

    return PaginatedRequestParams(cursor=cursor)


async def _stop_all(servers: list[_Server]) -> None:
    """Cancel every server's task, serving or still starting (a hung handshake does not look at
    `stop`): the SDK's shutdown runs shielded from the cancel (stdin closed, a grace period,
    the process group terminated, then killed), so each ends with its process."""
    for server in servers:
        server.stop.set()
    tasks = [server.task for server in servers if server.task is not None and not server.task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)


def _why(exc: BaseException) -> str:
    """An exception in one line; a group (anyio's task groups) by its first leaf."""
    while getattr(exc, "exceptions", None):
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    text = one_line(str(exc), 160) if str(exc) else ""
    return printable(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


@atexit.register
def _close_all() -> None:
    """The kernel shuts down: every manager still open stops its servers."""
    for servers in list(_LIVE):
        servers.close()
