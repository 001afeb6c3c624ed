"""The `shell(command, timeout_s)` tool: one shell command in the project folder.

The content starts with a status line, then the combined stdout and stderr:

    exit status: 0
    <output>

or `exit status: timeout after 60s` / `exit status: cancelled` when the command was stopped.
The command runs in its own session (process group) so that stopping it also stops whatever
it started (`sh -c "sleep 30"` would otherwise leave `sleep` running). Output goes to a
temporary file rather than a pipe: a child that outlives the kill cannot keep us waiting on
the pipe, and a chatty command cannot fill a pipe buffer and stall. Standard input is empty,
so a command that prompts fails instead of hanging.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time

from pydantic import Field

from soba_nb.agent.tools.base import ToolArguments, ToolContext, ToolOutcome

NAME = "shell"
DESCRIPTION = (
    "Run a shell command in the project folder with a time limit. Returns the exit status "
    "on the first line, then the combined stdout and stderr. Standard input is empty."
)

DEFAULT_TIMEOUT_S = 60
MAX_TIMEOUT_S = 600
POLL_INTERVAL_S = 0.05
"""How often the wait checks the deadline and the cancel flag."""
KILL_WAIT_S = 5
"""How long to wait for the killed process to be reaped."""


class ShellArguments(ToolArguments):
    command: str = Field(description="The command line, run by the system shell.")
    timeout_s: float = Field(
        DEFAULT_TIMEOUT_S,
        gt=0,
        le=MAX_TIMEOUT_S,
        description=f"Time limit in seconds (default {DEFAULT_TIMEOUT_S}, at most {MAX_TIMEOUT_S}).",
    )


def summarize(arguments: ShellArguments) -> str:
    return f"shell: {arguments.command.strip()} (timeout {_seconds(arguments.timeout_s)}s)"


def run(arguments: ShellArguments, ctx: ToolContext) -> ToolOutcome:
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(
            arguments.command,
            shell=True,
            cwd=ctx.project_root,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            status = _wait(process, arguments.timeout_s, ctx)
        except BaseException:  # KeyboardInterrupt: stop the command before the turn stops
            _kill_group(process)
            raise
        output.seek(0)
        text = output.read().decode("utf-8", errors="replace")
    failed = status != "0"
    return ToolOutcome(f"exit status: {status}\n{text}".rstrip("\n"), is_error=failed)


def _wait(process: subprocess.Popen[bytes], timeout_s: float, ctx: ToolContext) -> str:
    """Wait for the command; return its exit status, or why it was stopped."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return str(process.wait(timeout=POLL_INTERVAL_S))
        except subprocess.TimeoutExpired:
            pass
        if ctx.cancel is not None and ctx.cancel.is_set():
            _kill_group(process)
            return "cancelled"
        if time.monotonic() >= deadline:
            _kill_group(process)
            return f"timeout after {_seconds(timeout_s)}s"


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=KILL_WAIT_S)


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
