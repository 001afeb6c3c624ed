"""One HTTP attempt read by a worker thread, handed over to the caller's thread.

httpx's sync API cannot be interrupted: a read blocked on a silent server returns only when
its timeout fires, so a cancel, the deadline or a stall would be noticed only then (a server
that stalled took 4 × 120 s to fail). Here a worker thread does the blocking I/O and puts
what it reads on a queue; the caller's thread takes from the queue in short waits
(`POLL_S`), so it notices a cancel, the deadline, or a silence longer than the idle limit
within a fraction of a second, and gives up at once: the worker is abandoned (its socket
shut down when it has one, else it ends at its own read timeout) and anything it reads
later is dropped. Parsing and the text callback stay on the caller's thread (a notebook
cell's output must come from the thread running the cell).

The idle limit is the call's `Silence` (`soba_nb.providers.waits`): it runs on through the
headers and through lines that add nothing to the answer (SSE comments, pings, empty events),
and only the parser, finding content, resets it; so an endless stream of pings is a stall too.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import httpx

from soba_nb.providers.errors import Cancelled, ProviderError
from soba_nb.providers.retry import Deadline
from soba_nb.providers.waits import POLL_S, Silence

DATA_PREFIX = "data:"
WAITING = "waiting for the model"


@dataclass(frozen=True)
class Head:
    """The status line and headers, and the whole body when it is not a stream."""

    status: int
    headers: httpx.Headers
    text: str | None
    """The body, read whole (non-streamed requests, errors, JSON answers); None for a stream."""


_END = object()


class Feed:
    """The caller's side of one attempt: `head()`, then `lines()` for a stream."""

    def __init__(
        self,
        *,
        cancel: threading.Event | None,
        deadline: Deadline,
        silence: Silence,
        source: str,
        on_wait: Callable[[str], None] | None = None,
        status: str = WAITING,
    ):
        self.cancel = cancel
        self.on_wait = on_wait
        """Told `status` at every poll until the answer's first data."""
        self.status = status
        """"waiting for the model", or "the model is reading 12,400 tokens" while a local server
        reads a long prompt (SPEC §17)."""
        self.deadline = deadline
        self.silence = silence
        """The call's wait clock, shared with the earlier attempts and reset by the parser."""
        self.source = source
        self.abandoned = threading.Event()
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._headers = False
        self._response: httpx.Response | None = None

    # -- the worker's side ---------------------------------------------------------------

    def start(self, work: Callable[[Feed], None]) -> None:
        def run() -> None:
            try:
                work(self)
            except BaseException as exc:  # reported to the caller's thread, never raised here
                self._queue.put(("error", exc))
            finally:
                self._queue.put(("end", _END))

        threading.Thread(target=run, daemon=True, name="soba-http").start()

    def put_head(self, response: httpx.Response, text: str | None) -> None:
        self._response = response
        self._queue.put(("head", Head(response.status_code, response.headers, text)))

    def put_line(self, line: str) -> bool:
        """Hand one line over; False once the caller gave up (the worker should stop)."""
        if self.abandoned.is_set():
            return False
        self._queue.put(("line", line))
        return True

    # -- the caller's side ---------------------------------------------------------------

    def _take(self) -> tuple[str, Any]:
        while True:
            try:
                kind, value = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                self._check()
                if self.on_wait is not None:
                    self.on_wait(self.status)
                continue
            if kind == "error":
                raise value
            return kind, value

    def _check(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            self.abandon()
            raise Cancelled(f"{self.source}: request cancelled")
        if self.deadline.expired():
            self.abandon()
            raise self.deadline.timeout_error(self.source)
        if self.silence.expired():
            self.abandon()
            raise self.silence.stalled(self.source, headers=self._headers)

    def head(self) -> Head:
        """Wait for the status line (within what is left of the call's wait)."""
        kind, value = self._take()
        if kind != "head":
            raise ProviderError(f"{self.source}: the connection ended before an answer")
        self._headers = True
        assert isinstance(value, Head)
        return value

    def lines(self) -> Generator[str, None, None]:
        """The stream's lines as they come; cancel, deadline and the silence clock apply
        between them (checked at every line, so a flood of pings cannot keep it from noticing)."""
        finished = False
        try:
            while True:
                kind, value = self._take()
                if kind == "end":
                    finished = True
                    return
                self._check()
                if value.strip():
                    self.silence.heard()
                if value.startswith(DATA_PREFIX):
                    self.on_wait = None  # the server has started answering
                yield value
        finally:
            if not finished:  # the caller stopped early (an error, a cancel): stop the worker
                self.abandon()

    def abandon(self) -> None:
        """Stop the worker: it reads nothing more, and a socket under a blocked read is shut."""
        self.abandoned.set()
        response = self._response
        if response is None:
            return
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
