"""Bounded retries with backoff, an overall deadline, and cancellation (SPEC §9).

Pure machinery with no HTTP in it: `call_with_retries` runs one attempt after another
while the attempt fails with a *retryable* `ProviderError` (rate limit, server error,
dropped connection, a stream that ended with no finish reason), waiting between attempts
with exponential backoff plus jitter — or the server's `Retry-After`, capped. Context
overflow and rejected requests are never retried: sending the same request again cannot
help (SPEC §6: the same oversized request is never sent again).

Every wait is bounded by the caller's `Deadline` and interrupted by its cancel event. With a
`Silence` (the call's wait clock, `soba_nb.providers.waits`), a backoff is made only while it fits
what is left of the idle limit: retries happen inside one wait, never after it.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from soba_nb.providers.errors import Cancelled, ProviderError, ProviderTimeout
from soba_nb.providers.waits import Silence

DEFAULT_MAX_RETRIES = 3
"""Retries after the first attempt, so at most 4 requests per call."""
DEFAULT_BACKOFF_BASE_S = 0.5
"""Wait before the first retry; doubled for each further retry."""
DEFAULT_BACKOFF_MAX_S = 8.0
"""Ceiling for the exponential backoff."""
DEFAULT_RETRY_AFTER_CAP_S = 60.0
"""A server's Retry-After is honoured up to this many seconds (and only while it fits what is
left of the call's idle limit)."""
DEFAULT_JITTER_RATIO = 0.25
"""Backoff waits are stretched by a random factor in [1, 1 + ratio] so that clients that
failed together do not retry together."""

T = TypeVar("T")


class Deadline:
    """An overall time limit for one call, including its retries and waits."""

    def __init__(self, timeout_s: float | None, *, clock: Callable[[], float] = time.monotonic):
        self.timeout_s = timeout_s
        """The limit as given; None means no deadline."""
        self._clock = clock
        self._ends_at = math.inf if timeout_s is None else clock() + timeout_s

    def remaining(self) -> float:
        """Seconds left (infinite without a deadline, never negative)."""
        return max(0.0, self._ends_at - self._clock())

    def expired(self) -> bool:
        """True once the deadline has passed."""
        return self._clock() >= self._ends_at

    def check(self, source: str) -> None:
        """Raise `ProviderTimeout` if the deadline has passed."""
        if self.expired():
            raise self.timeout_error(source)

    def timeout_error(self, source: str, detail: str = "") -> ProviderTimeout:
        """The error to raise when this deadline stops a call."""
        suffix = f" ({detail})" if detail else ""
        return ProviderTimeout(
            f"{source}: no answer within the deadline of {self.timeout_s:g} s{suffix}"
        )


def check_cancel(cancel: threading.Event | None, source: str) -> None:
    """Raise `Cancelled` if the caller's cancel event is set."""
    if cancel is not None and cancel.is_set():
        raise Cancelled(f"{source}: request cancelled")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry."""

    max_retries: int = DEFAULT_MAX_RETRIES
    """Retries after the first attempt (0 disables retrying)."""
    backoff_base_s: float = DEFAULT_BACKOFF_BASE_S
    backoff_max_s: float = DEFAULT_BACKOFF_MAX_S
    retry_after_cap_s: float = DEFAULT_RETRY_AFTER_CAP_S
    jitter_ratio: float = DEFAULT_JITTER_RATIO

    def delay_s(self, retry_index: int, error: ProviderError, rng: random.Random) -> float:
        """The wait before retry number `retry_index` (0 for the first retry)."""
        server_hint = getattr(error, "retry_after_s", None)
        if isinstance(server_hint, (int, float)):
            return min(float(server_hint), self.retry_after_cap_s)
        backoff = min(self.backoff_max_s, self.backoff_base_s * 2**retry_index)
        return float(backoff * (1 + rng.uniform(0, self.jitter_ratio)))


def wait(
    seconds: float,
    *,
    cancel: threading.Event | None,
    deadline: Deadline,
    source: str,
    reason: str = "",
) -> None:
    """Sleep, waking at once on cancel; a wait that would outlast the deadline is not started."""
    if seconds > deadline.remaining():
        detail = f"a {seconds:.1f} s wait would pass it" + (
            f"; last error: {reason}" if reason else ""
        )
        raise deadline.timeout_error(source, detail)
    event = cancel if cancel is not None else threading.Event()
    if event.wait(seconds):
        raise Cancelled(f"{source}: request cancelled")


def call_with_retries(
    attempt: Callable[[int], T],
    *,
    policy: RetryPolicy,
    deadline: Deadline,
    source: str,
    cancel: threading.Event | None = None,
    rng: random.Random | None = None,
    silence: Silence | None = None,
) -> T:
    """Run `attempt(attempt_index)` until it returns, retrying retryable errors.

    When the retries run out, the last error is raised with the attempt count added to
    its message. Errors that are not retryable are raised at once, and so is one whose
    backoff would pass what is left of `silence` (saying so).
    """
    rng = rng or random.Random()
    attempt_index = 0
    while True:
        check_cancel(cancel, source)
        deadline.check(source)
        try:
            return attempt(attempt_index)
        except ProviderError as exc:
            if not exc.retryable:
                raise
            if attempt_index >= policy.max_retries:
                exc.args = (f"{exc} (gave up after {attempt_index + 1} attempts)",)
                raise
            delay = policy.delay_s(attempt_index, exc, rng)
            if silence is not None and delay >= silence.remaining():
                exc.args = (silence.retry_refused(exc, delay),)
                raise
            wait(delay, cancel=cancel, deadline=deadline, source=source, reason=str(exc))
            attempt_index += 1
