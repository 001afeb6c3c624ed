"""Servers the tests start: tied to the test process, waited for, and stopped.

Every fixture that starts a server stops it when its block ends; a pytest killed outright
(SIGKILL, an out-of-memory kill, a CI job cut off) runs no finalizer, and its llama.cpp,
LiteLLM, Jupyter and JupyterHub servers lived on, holding ports, memory and both cores for the
next run. `tied_to_this_process` starts a command under util-linux's `setpriv --pdeathsig
TERM`: the kernel sends it SIGTERM when the process that started it ends, however it ends.
`wait_until_answering` waits for a server's first 200; `stop_process_group` stops one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

SETPRIV = shutil.which("setpriv")


def tied_to_this_process(command: Sequence[str]) -> list[str]:
    """`command`, sent SIGTERM by the kernel when this process ends (as is without `setpriv`)."""
    if SETPRIV is None:
        return list(command)
    return [SETPRIV, "--pdeathsig", "TERM", "--", *command]


def stop_process_group(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM (a server shuts down what it started), `timeout_s` for it to exit, then SIGKILL to
    whatever of its process group is left (each server is started in a session of its own)."""
    if process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def wait_until_answering(
    process: subprocess.Popen[bytes], url: str, what: str, log: Path, timeout_s: float,
    *, headers: Mapping[str, str] | None = None, interval_s: float = 0.2,
) -> None:
    """Until a GET of `url` answers 200; `RuntimeError` with the end of `log` when the process
    exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, headers=headers, timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start in {timeout_s:.0f} s: {log.read_text()[-2000:]}")
        time.sleep(interval_s)
