"""A time limit on code the `python` tool runs in the kernel: a KeyboardInterrupt at the limit.

On the main thread (where a kernel runs its cells) the limit sends a real SIGINT to that
thread (`signal.pthread_kill`), as Jupyter's interrupt button does, so a blocking call
(`time.sleep(600)`, a socket read) is woken. For the call's duration SIGINT's handler raises
KeyboardInterrupt, as `signal.default_int_handler` does (ipykernel sets that one while a cell
runs); the previous handler is put back after. Off the main thread no signal can be aimed at
the code, so the exception is set on its thread (`PyThreadState_SetAsyncExc`): it lands at the
next bytecode, and a blocking C call ends before it does.

Code that catches the interrupt and goes on (IPython's `!cmd` does: it stops the command and
returns) is interrupted again every `RESEND_S` until the call returns. `fired` says whether
the limit was reached; an interrupt while it is False is the user's, and the caller lets it
through so the turn stops as it always did.

No interrupt of ours arrives after the call: the timer sends only while the call runs (one
lock decides between sending and ending), and a signal already sent when the call ends is
waited for and dropped by our handler before the previous handler is put back. A user's SIGINT
that arrives in that moment is raised once the previous handler is back.
"""

from __future__ import annotations

import ctypes
import signal
import threading
import time
from types import FrameType, TracebackType
from typing import Any

RESEND_S = 5.0
"""After the limit, how long code that caught the interrupt may run on before the next one."""
DRAIN_S = 1.0
"""At most this long, as the call ends, for a signal already sent to reach our handler."""
_DRAIN_POLL_S = 0.001


class TimeLimit:
    """`with TimeLimit(seconds):` interrupts the block's thread after `seconds`.

    The KeyboardInterrupt it raises leaves the block: catch it outside and look at `fired`.
    Call `end()` in a `finally` too (it is idempotent): an interrupt can land in `__exit__`
    itself, before it has finished.
    """

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.fired = False
        """The limit was reached and the code interrupted (at least once)."""
        self._lock = threading.Lock()
        self._done = False
        self._finished = threading.Event()
        self._thread = threading.get_ident()
        self._signal = threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_kill")
        self._previous: Any = None
        self._installed = False
        self._active = False
        self._sent = 0
        self._seen = 0
        self._user_interrupt = False

    def __enter__(self) -> TimeLimit:
        if self._signal:
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        self._active = True
        threading.Thread(target=self._watch, name="soba-python-time-limit", daemon=True).start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.end()

    def end(self) -> None:
        """Stop the timer, drop a signal of ours still on its way, put the handler back."""
        self._active = False  # from here our handler never raises
        with self._lock:
            self._done = True  # from here the timer never sends
        self._finished.set()
        if not self._signal:
            _set_async_exc(self._thread, None)  # one set but not yet raised is cleared
            return
        if not self._installed:
            return
        deadline = time.monotonic() + DRAIN_S
        while self._seen < self._sent and time.monotonic() < deadline:
            time.sleep(_DRAIN_POLL_S)  # the handler runs here, between bytecodes
        previous = self._previous if self._previous is not None else signal.SIG_DFL
        signal.signal(signal.SIGINT, previous)
        self._installed = False
        if self._user_interrupt:
            self._user_interrupt = False
            raise KeyboardInterrupt

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self._seen += 1
        if self._active:
            raise KeyboardInterrupt
        if self._seen > self._sent:  # not one of ours: the user's, raised once we are done
            self._user_interrupt = True

    def _watch(self) -> None:
        wait = self.seconds
        while not self._finished.wait(wait):
            with self._lock:
                if self._done:
                    return
                self.fired = True
                self._sent += 1
                if self._signal:
                    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
                else:
                    _set_async_exc(self._thread, KeyboardInterrupt)
            wait = RESEND_S


def _set_async_exc(thread: int, exception: type[BaseException] | None) -> None:
    """Raise `exception` in `thread` at its next bytecode; None clears one not yet raised."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread), ctypes.py_object(exception) if exception is not None else None
    )
