"""The `shell` tool keeps output and processes bounded: a capped result, and nothing left running.

Real processes throughout. Each test that starts a long-lived process gives it a unique
`sleep` argument (the `marker` fixture) and the fixture's teardown kills and reports any
process still carrying it, so a failing test leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import shlex
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from soba_nb.agent.tools import ToolContext, ToolOutcome, run_tool
from soba_nb.agent.tools.shell import HEAD_BYTES, OUTPUT_FILE_LIMIT_BYTES, TAIL_BYTES
from soba_nb.compaction.model_input import TOOL_OUTPUT_LIMIT_CHARS

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the tests look for processes in /proc"
)

DROPPED = re.compile(
    r"^\[… ([\d,]+) bytes of output dropped \(head and tail kept\); "
    r"the command wrote ([\d,]+) bytes in all …\]$",
    re.MULTILINE,
)
RSS_GROWTH_LIMIT_KB = 50 * 1024
SEEN_WAIT_S = 0.5
"""How long a command lingers after starting its escaping child, so the watcher sees it."""
PR_GET_CHILD_SUBREAPER = 37


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    return root


@pytest.fixture
def ctx(project: Path) -> ToolContext:
    return ToolContext(project_root=project, namespace={})


def call(ctx: ToolContext, command: str, timeout_s: float = 10) -> ToolOutcome:
    return run_tool("shell", json.dumps({"command": command, "timeout_s": timeout_s}), ctx)


def processes_with_argument(argument: str) -> list[int]:
    """Live processes that have `argument` as one whole command-line argument."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            arguments = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:  # exited meanwhile
            continue
        if argument.encode() in arguments:
            found.append(int(name))
    return found


@pytest.fixture
def marker() -> Iterator[str]:
    """A `sleep` duration no other process uses; no process may carry it after the test."""
    argument = f"300.{uuid.uuid4().int % 10**9:09d}"
    yield argument
    leftovers = processes_with_argument(argument)
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert leftovers == [], f"processes left running: {leftovers}"


class Watcher:
    """Polls /proc in a thread; records whether a process with the marker ever ran."""

    def __init__(self, argument: str) -> None:
        self.argument = argument
        self.seen = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.wait(0.01):
            self.seen = self.seen or bool(processes_with_argument(self.argument))

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def dropped_note(content: str) -> tuple[int, int]:
    match = DROPPED.search(content)
    assert match, content[:300]
    return int(match[1].replace(",", "")), int(match[2].replace(",", ""))


# --- output -----------------------------------------------------------------------------------


def test_endless_output_gives_a_bounded_result_without_memory_growth(
    ctx: ToolContext, marker: str
) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcome = call(ctx, f"yes {marker}", timeout_s=2)
    growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert growth < RSS_GROWTH_LIMIT_KB
    assert len(outcome.content) <= TOOL_OUTPUT_LIMIT_CHARS  # so the model sees the note too
    dropped, total = dropped_note(outcome.content)
    assert total - HEAD_BYTES - TAIL_BYTES <= dropped < total


def test_output_over_the_file_limit_stops_the_command(
    ctx: ToolContext, project: Path, marker: str
) -> None:
    started = time.monotonic()
    outcome = call(ctx, f"yes {marker}; touch finished", timeout_s=60)
    assert time.monotonic() - started < 10
    assert outcome.is_error
    assert outcome.content.startswith(f"exit status: stopped: output over 64 MB\n{marker}\n")
    _, total = dropped_note(outcome.content)
    assert OUTPUT_FILE_LIMIT_BYTES < total < 4 * OUTPUT_FILE_LIMIT_BYTES
    assert not (project / "finished").exists()


def test_long_output_keeps_its_first_and_last_lines(ctx: ToolContext) -> None:
    last = 200_000
    total = sum(len(f"{number}\n") for number in range(1, last + 1))
    outcome = call(ctx, f"seq 1 {last}")
    assert outcome.content.startswith("exit status: 0\n1\n2\n3\n")
    assert outcome.content.endswith(f"\n{last - 1}\n{last}")
    dropped, reported_total = dropped_note(outcome.content)
    assert reported_total == total
    kept = outcome.content.removeprefix("exit status: 0\n").split("\n")
    assert HEAD_BYTES + TAIL_BYTES - 2 * len(f"{last}\n") < total - dropped
    assert total - dropped <= HEAD_BYTES + TAIL_BYTES
    assert all(line.isdigit() for line in kept if not line.startswith("[…"))  # whole lines


def test_short_output_is_returned_whole(ctx: ToolContext) -> None:
    outcome = call(ctx, "seq 1 1000")
    assert outcome.content == "exit status: 0\n" + "\n".join(map(str, range(1, 1001)))


def test_invalid_utf8_is_decoded_with_replacement_characters(ctx: ToolContext) -> None:
    outcome = call(ctx, r"printf '\377\376 ok\n'")
    assert outcome == ToolOutcome("exit status: 0\n\ufffd\ufffd ok")


def test_a_cut_through_a_multibyte_character_does_not_fail(ctx: ToolContext) -> None:
    # 3-byte characters without newlines: the head and tail cuts fall inside characters.
    script = "import sys; sys.stdout.buffer.write('€'.encode() * 100_000)"
    outcome = call(ctx, f"{shlex.quote(sys.executable)} -c {shlex.quote(script)}")
    head, note, tail = outcome.content.removeprefix("exit status: 0\n").split("\n")
    assert DROPPED.match(note)
    assert set(head.rstrip("\ufffd")) == {"€"} and set(tail.lstrip("\ufffd")) == {"€"}
    assert "\ufffd" in head + tail


# --- exit status ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "status"),
    [("true", "0"), ("exit 3", "3"), ("no-such-command-5c1e", "127"), ("kill -9 $$", "-9")],
)
def test_exit_status_is_the_commands(ctx: ToolContext, command: str, status: str) -> None:
    outcome = call(ctx, command)
    assert outcome.content.startswith(f"exit status: {status}")
    assert outcome.is_error == (status != "0")


# --- processes --------------------------------------------------------------------------------

ESCAPES = {
    "setsid &": "setsid sleep {marker} &",
    "subshell &": "(sleep {marker} &)",
    "nohup &": "nohup sleep {marker} >/dev/null 2>&1 &",
    "setsid -f": "setsid -f sleep {marker}",
    "trap TERM &": "(trap '' TERM; sleep {marker}) &",
}


@pytest.mark.parametrize("escape", ESCAPES.values(), ids=ESCAPES.keys())
def test_nothing_outlives_a_command_that_exits(ctx: ToolContext, marker: str, escape: str) -> None:
    with Watcher(marker) as watcher:
        outcome = call(ctx, f"{escape.format(marker=marker)}\nsleep {SEEN_WAIT_S}; echo done")
    assert outcome == ToolOutcome("exit status: 0\ndone")
    assert watcher.seen
    assert processes_with_argument(marker) == []


@pytest.mark.parametrize("escape", ESCAPES.values(), ids=ESCAPES.keys())
def test_nothing_outlives_a_timeout(ctx: ToolContext, marker: str, escape: str) -> None:
    with Watcher(marker) as watcher:
        outcome = call(ctx, f"{escape.format(marker=marker)}\nsleep 30", timeout_s=1)
    assert outcome == ToolOutcome("exit status: timeout after 1s", is_error=True)
    assert watcher.seen
    assert processes_with_argument(marker) == []


def test_a_command_that_ignores_sigterm_is_killed(ctx: ToolContext, marker: str) -> None:
    with Watcher(marker) as watcher:
        outcome = call(ctx, f"trap '' TERM; sleep {marker}", timeout_s=1)
    assert outcome == ToolOutcome("exit status: timeout after 1s", is_error=True)
    assert watcher.seen
    assert processes_with_argument(marker) == []


def test_cancel_stops_everything_within_a_second(ctx: ToolContext, marker: str) -> None:
    cancel = ctx.cancel = threading.Event()
    cancelled_at: list[float] = []

    def cancel_turn() -> None:
        cancelled_at.append(time.monotonic())
        cancel.set()

    threading.Timer(SEEN_WAIT_S, cancel_turn).start()
    outcome = call(ctx, f"setsid sleep {marker} & sleep {marker}", timeout_s=60)
    assert time.monotonic() - cancelled_at[0] < 1
    assert outcome == ToolOutcome("exit status: cancelled", is_error=True)
    assert processes_with_argument(marker) == []


def test_keyboard_interrupt_stops_everything(ctx: ToolContext, marker: str) -> None:
    # The command outlasts the signal by far, so the interrupt lands inside the tool call.
    threading.Timer(SEEN_WAIT_S, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        call(ctx, f"setsid sleep {marker} & sleep {marker}", timeout_s=60)
    assert processes_with_argument(marker) == []


def test_nothing_outlives_the_kernel(project: Path, marker: str) -> None:
    kernel_code = textwrap.dedent(
        f"""
        from pathlib import Path
        from soba_nb.agent.tools import ToolContext, shell
        ctx = ToolContext(project_root=Path({str(project)!r}), namespace={{}})
        shell.run(shell.ShellArguments(command="setsid sleep {marker} & sleep {marker}"), ctx)
        """
    )
    kernel = subprocess.Popen([sys.executable, "-c", kernel_code])
    try:
        deadline = time.monotonic() + 30
        while len(processes_with_argument(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(processes_with_argument(marker)) == 2
    finally:
        kernel.kill()
        kernel.wait()
    deadline = time.monotonic() + 2
    while processes_with_argument(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with_argument(marker) == []


def test_the_kernel_does_not_become_a_subreaper(ctx: ToolContext) -> None:
    call(ctx, "true")
    is_subreaper = ctypes.c_int(-1)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(is_subreaper), 0, 0, 0) == 0
    assert is_subreaper.value == 0
