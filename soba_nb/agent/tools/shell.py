"""The `shell(command, timeout_s)` tool: one shell command in the project folder.

The content starts with a status line, then the combined stdout and stderr:

    exit status: 0
    <output>

or `exit status: timeout after 60s` / `exit status: cancelled` / `exit status: stopped: output
over 64 MB` when the command was stopped. Standard input is empty, so a command that prompts
fails instead of hanging.

Processes: the command runs under a reaper process (`reaper.py`, a child subreaper) that kills
everything the command started, including what escaped its process group with `setsid` or a
double fork, when the shell exits or when we stop it. Nothing the command started outlives
the call. The price is the reaper's Python start-up: `echo hi` takes about 14 ms instead of 1.5.

Output is bounded in memory and on disk. It goes to a temporary file rather than a pipe: a
child that outlives the kill cannot keep us waiting on a pipe, and a chatty command cannot
fill a pipe buffer and stall. While waiting we watch the file's size and stop the command
once it passes `OUTPUT_FILE_LIMIT_BYTES`, so the file holds at most that much plus what the
command writes in one poll interval (`yes` at 1.6 GB/s was stopped at 77 MB). Set aside:
`RLIMIT_FSIZE` would also break every large file the command legitimately writes, and reading
a pipe to keep only a head and a tail would need a reader thread and lose the file's
don't-block property. The result keeps only the first `HEAD_BYTES` and the last `TAIL_BYTES`
(read with seek, never the whole file) with a line saying how many bytes were dropped; the
sizes are chosen so that a bounded result fits model input's 12,000-character clip, so the
model sees that note.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from pydantic import Field

from soba_nb.agent.tools.base import (
    CLIPPED,
    ToolArguments,
    ToolContext,
    ToolOutcome,
    optional_parameter,
)

NAME = "shell"
DESCRIPTION = (
    "Run a shell command in the project folder (no stdin; background processes stopped); "
    "returns exit status, stdout, stderr." + CLIPPED
)

DEFAULT_TIMEOUT_S = 60
MAX_TIMEOUT_S = 600
POLL_INTERVAL_S = 0.01
"""How often the wait checks the deadline, the cancel flag and the output file's size."""
REAPER_STOP_WAIT_S = 5
"""How long the reaper may take to kill the command's processes before we kill the reaper."""
REAPER = Path(__file__).with_name("reaper.py")
OUTPUT_FILE_LIMIT_BYTES = 64 * 1024 * 1024
"""A command whose output passes this size is stopped: the temporary file stays bounded."""
HEAD_BYTES = 5 * 1024
"""The first bytes of a long output kept in the result."""
TAIL_BYTES = 5 * 1024
"""The last bytes kept: head, tail and the note fit model input's 12,000-character clip."""
LINE_SEARCH_FRACTION = 2
"""The head is cut at its last newline (the tail after its first) if one is in this part."""
DROPPED_NOTE = (
    "[… {dropped:,} bytes of output dropped (head and tail kept); "
    "the command wrote {total:,} bytes in all …]"
)


class ShellArguments(ToolArguments):
    command: str = Field(description="The command line.")
    timeout_s: float = Field(
        DEFAULT_TIMEOUT_S,
        gt=0,
        le=MAX_TIMEOUT_S,
        description=f"Seconds, at most {MAX_TIMEOUT_S}; default {DEFAULT_TIMEOUT_S}.",
        json_schema_extra=optional_parameter,
    )


def summarize(arguments: ShellArguments) -> str:
    return f"shell: {arguments.command.strip()} (timeout {_seconds(arguments.timeout_s)}s)"


def run(arguments: ShellArguments, ctx: ToolContext) -> ToolOutcome:
    with tempfile.TemporaryFile() as output:
        process = _start(arguments.command, ctx.project_root, output)
        try:
            status = _wait(process, output, arguments.timeout_s, ctx)
        except BaseException:  # KeyboardInterrupt: stop the command before the turn stops
            _stop(process)
            raise
        text = read_head_and_tail(output)
    failed = status != "0"
    return ToolOutcome(f"exit status: {status}\n{text}".rstrip("\n"), is_error=failed)


def _start(command: str, cwd: Path, output: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start the reaper, which runs `/bin/sh -c command` and reports its exit status."""
    return subprocess.Popen(
        [sys.executable, "-I", "-S", str(REAPER), str(os.getpid()), command],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait(
    process: subprocess.Popen[bytes], output: IO[bytes], timeout_s: float, ctx: ToolContext
) -> str:
    """Wait for the command; return its exit status, or why it was stopped."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return str(process.wait(timeout=POLL_INTERVAL_S))
        except subprocess.TimeoutExpired:
            pass
        if ctx.cancel is not None and ctx.cancel.is_set():
            reason = "cancelled"
        elif os.fstat(output.fileno()).st_size > OUTPUT_FILE_LIMIT_BYTES:
            reason = f"stopped: output over {OUTPUT_FILE_LIMIT_BYTES // (1024 * 1024)} MB"
        elif time.monotonic() >= deadline:
            reason = f"timeout after {_seconds(timeout_s)}s"
        else:
            continue
        _stop(process)
        return reason


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Ask the reaper to kill the command's processes; kill the reaper if it takes too long."""
    process.send_signal(signal.SIGTERM)  # a no-op once the reaper has been waited for
    try:
        process.wait(timeout=REAPER_STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def read_head_and_tail(output: IO[bytes]) -> str:
    """The output as text: whole if short, else its head, a note of what was dropped, its tail."""
    total = output.seek(0, os.SEEK_END)
    output.seek(0)
    if total <= HEAD_BYTES + TAIL_BYTES:
        return _decode(output.read(total))
    head = output.read(HEAD_BYTES)
    output.seek(total - TAIL_BYTES)
    tail = output.read(TAIL_BYTES)
    head, tail = _cut_at_lines(head, tail)
    note = DROPPED_NOTE.format(dropped=total - len(head) - len(tail), total=total)
    separator = "" if head.endswith(b"\n") else "\n"
    return f"{_decode(head)}{separator}{note}\n{_decode(tail)}"


def _cut_at_lines(head: bytes, tail: bytes) -> tuple[bytes, bytes]:
    """Drop the partial line at the end of the head and at the start of the tail, if short."""
    head_end = head.rfind(b"\n") + 1
    if head_end >= len(head) - len(head) // LINE_SEARCH_FRACTION:
        head = head[:head_end]
    tail_start = tail.find(b"\n") + 1
    if 0 < tail_start <= len(tail) // LINE_SEARCH_FRACTION:
        tail = tail[tail_start:]
    return head, tail


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")  # invalid or cut characters become U+FFFD


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
