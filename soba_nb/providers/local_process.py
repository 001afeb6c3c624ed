"""The embedded model's process: started on first use, shared, restarted after a crash.

`python -m soba_nb.engine` loads the GGUF and serves it on 127.0.0.1 (see
`soba_nb.engine.server`). Running the model out of the kernel's process is what keeps the
user's kernel and variables alive whatever the model does: a crash, an out-of-memory kill
or a hang of the engine is a failed request with a clear message, and the next request
starts a fresh engine.

The engine's stdout carries only `loading NN%` and `ready URL` lines; its stderr goes to a
log file (`log_path`) that is named in error messages and never shown otherwise. It exits
within a second of the kernel (it watches its parent), and is stopped at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from soba_nb.providers.errors import Cancelled, ProviderError, ProviderTimeout

LOAD_TIMEOUT_S = 180.0
"""Longest wait for the engine to load its weights and listen (a few seconds normally)."""
STOP_WAIT_S = 5.0
POLL_S = 0.1
READY = "ready "
LOADING = "loading "
SIGNAL_NAMES = {
    signal.SIGKILL: "killed (SIGKILL: out of memory, or stopped from outside)",
    signal.SIGSEGV: "crashed (segmentation fault)",
    signal.SIGABRT: "aborted",
    signal.SIGBUS: "crashed (bus error)",
    signal.SIGILL: "crashed (illegal instruction)",
    signal.SIGTERM: "stopped (SIGTERM)",
}

Progress = Callable[[str], None]


class EngineProcess:
    """One engine process for one model file."""

    def __init__(self, model_path: Path):
        self.model_path = model_path
        self.log_path = Path(tempfile.gettempdir()) / f"soba-nb-engine-{os.getpid()}.log"
        self._process: subprocess.Popen[str] | None = None
        self._url: str | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()
        self.last_exit: str | None = None
        """How the previous engine ended, when it did not end on our request."""

    def alive(self, settle_s: float = 0.0) -> bool:
        """Whether the engine runs. `settle_s`: after a broken connection, wait up to this
        long for it to end first (its socket closes a moment before its exit status exists)."""
        process = self._process
        if process is None:
            return False
        if settle_s > 0:
            try:
                process.wait(timeout=settle_s)
            except subprocess.TimeoutExpired:
                return True
        return process.poll() is None

    def url(self, *, timeout_s: float = LOAD_TIMEOUT_S, cancel: threading.Event | None = None,
            on_progress: Progress | None = None) -> str:
        """The engine's base URL, starting (or restarting) it and waiting until it serves."""
        with self._lock:
            if self._url is not None and self.alive():
                return self._url
            if self._process is not None:
                self.last_exit = self.describe_exit()
            self._start()
            deadline = time.monotonic() + timeout_s
            while self._url is None:
                self._wait_line(deadline, timeout_s, cancel, on_progress)
            return self._url

    def _start(self) -> None:
        self._url = None
        self._lines = queue.Queue()
        log = self.log_path.open("ab")
        command = [sys.executable, "-m", "soba_nb.engine", "--model", str(self.model_path), "--parent", str(os.getpid())]
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,  # a Ctrl-C meant for the kernel does not kill the model
        )
        log.close()
        stdout = self._process.stdout
        assert stdout is not None
        lines = self._lines

        def read() -> None:
            with stdout:  # closed at the end: an engine restarted after a crash leaks no pipe
                for line in stdout:
                    lines.put(line.strip())
            lines.put(None)

        threading.Thread(target=read, daemon=True, name="soba-engine-stdout").start()

    def _wait_line(self, deadline: float, timeout_s: float, cancel: threading.Event | None,
                   on_progress: Progress | None) -> None:
        try:
            line = self._lines.get(timeout=POLL_S)
        except queue.Empty:
            line = ""
        if line is None:  # stdout closed: the engine died while loading
            self._stop_process()
            raise ProviderError(f"local: the embedded model could not start: {self.describe_exit()}; see {self.log_path}")
        if line.startswith(READY):
            self._url = line[len(READY):].strip()
        elif line.startswith(LOADING) and on_progress is not None:
            on_progress(f"loading the embedded model · {line[len(LOADING):]}")
        if cancel is not None and cancel.is_set():
            self._stop_process()
            raise Cancelled("local: cancelled while the embedded model loaded")
        if time.monotonic() >= deadline:
            self._stop_process()
            raise ProviderTimeout(f"local: the embedded model did not load within {timeout_s:g} s; see {self.log_path}")

    def describe_exit(self) -> str:
        """How the process ended, in words a user can act on."""
        process = self._process
        code = process.poll() if process is not None else None
        if code is None:
            return "still running"
        if code < 0:
            return SIGNAL_NAMES.get(signal.Signals(-code), f"ended by signal {-code}")
        return f"exited with status {code}"

    def _stop_process(self) -> None:
        process, self._process, self._url = self._process, None, None
        if process is None or process.poll() is not None:
            if process is not None:
                self._process = process  # keep it: describe_exit reads its status
            return
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            process.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self) -> None:
        """Stop the engine (it is started again on the next request)."""
        with self._lock:
            self._stop_process()
            self._process = None


_ENGINES: dict[Path, EngineProcess] = {}
_ENGINES_LOCK = threading.Lock()


def engine_for(model_path: Path) -> EngineProcess:
    """The process-wide engine of a model file (not started until its `url()` is asked)."""
    with _ENGINES_LOCK:
        engine = _ENGINES.get(model_path)
        if engine is None:
            engine = _ENGINES[model_path] = EngineProcess(model_path)
        return engine


@atexit.register
def stop_engines() -> None:
    """Stop every engine this process started."""
    with _ENGINES_LOCK:
        engines = list(_ENGINES.values())
    for engine in engines:
        engine.stop()
