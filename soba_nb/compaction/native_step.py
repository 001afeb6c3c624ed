"""The native step of a compaction operation: ask the provider, within the barrier's deadline.

The barrier (`soba_nb.compaction.barrier`) calls `ask_native` before the model summary when
the provider offers native compaction. The request is the region the capsule replaces, as
the provider would see it (the previous capsule's native item when it accepts it, else the
portable capsule; then the summarized entries), fitted under the hard limit. It runs in a
worker thread, abortable: a cancel, the deadline (`timeoutMs`, shared with the summary that
may follow), a failure or a refusal each end it at once, and the portable path runs with
the usual outcome rules. A request the deadline cut off is priced for what was sent, once
(figures that arrive after the operation stopped waiting are dropped).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from soba_nb.compaction.instructions import without_instructions
from soba_nb.compaction.model_input import VISIBLE_TYPES, VisibleContext, assemble
from soba_nb.compaction.native_continuation import (
    NativeCompactor,
    NativeRefused,
    NativeRequest,
    NativeTarget,
    UsageSink,
)
from soba_nb.compaction.planner import Cut
from soba_nb.compaction.summarizer import RequestNotSent
from soba_nb.messages import ToolSchema
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import NativeContinuation, SkillEntry, UsageEntry
from soba_nb.transcript.estimated import estimated_usage

POLL_S = 0.05


@dataclass(frozen=True)
class NativeFailure:
    """Why the provider's compaction was not used (one line, for the result's reason)."""

    text: str
    refused: bool = False
    timed_out: bool = False


def native_request(
    cut: Cut,
    *,
    operation_id: str,
    system: str,
    tools: Sequence[ToolSchema],
    skills: Sequence[SkillEntry],
    counter: TokenCounter,
    target: NativeTarget,
    hard_limit: int,
    soft_limit: int,
    max_output_tokens: int,
) -> NativeRequest:
    """The region `cut` summarizes, as the provider's compaction request."""
    region = tuple(entry for entry in cut.summarize if isinstance(entry, VISIBLE_TYPES))
    previous = cut.previous
    native = previous.native if previous is not None and target.accepts(previous.native) else None
    context = VisibleContext(previous, region, tuple(skills), native)
    # The project's instructions stay out of the provider's item: every request after it
    # carries them on their own (SPEC §19), not twice.
    built = assemble(context, system=without_instructions(system), tools=tools, counter=counter, fit_to=hard_limit)
    return NativeRequest(
        operation_id=operation_id,
        system=built.system,
        tools=built.tools,
        messages=built.messages,
        native=built.native,
        input_tokens=built.tokens,
        soft_limit=soft_limit,
        max_output_tokens=max_output_tokens,
    )


def ask_native(
    compactor: NativeCompactor,
    request: NativeRequest,
    *,
    cancel: threading.Event,
    deadline: float,
    timeout_ms: int,
    on_poll: Callable[[], None],
    on_usage: UsageSink | None = None,
) -> NativeContinuation | NativeFailure | None:
    """The provider's item, why there is none, or None when cancelled (nothing is appended).

    `deadline` is a `time.monotonic()` instant: the same one the model summary works to."""
    remaining = deadline - time.monotonic()
    late = NativeFailure(f"native compaction did not finish within timeoutMs={timeout_ms}", timed_out=True)
    if remaining <= 0:
        return late
    abort = threading.Event()
    done = threading.Event()
    outcome: list[NativeContinuation | BaseException] = []
    reports = _Reports(on_usage)

    def work() -> None:
        try:
            outcome.append(compactor.compact(request, cancel=abort, timeout_s=remaining, on_usage=reports.report))
        except BaseException as exc:  # reported to the barrier, never raised in a thread
            outcome.append(exc)
        finally:
            done.set()

    threading.Thread(target=work, daemon=True, name="soba-native").start()
    try:
        while not done.wait(POLL_S):
            if cancel.is_set():
                abort.set()
                return None
            if time.monotonic() >= deadline:
                abort.set()
                reports.close(_cut_off(compactor, request))
                return late
            on_poll()
    except KeyboardInterrupt:
        abort.set()
        reports.close(None)
        raise
    if cancel.is_set():
        reports.close(None)
        return None
    [result] = outcome
    if isinstance(result, NativeContinuation):
        return result
    if time.monotonic() >= deadline and not isinstance(result, NativeRefused | RequestNotSent):
        reports.close(_cut_off(compactor, request))
        return late  # the provider's own deadline (the same one) ended it
    if isinstance(result, NativeRefused):
        return NativeFailure(f"native compaction refused ({result})", refused=True)
    if isinstance(result, RequestNotSent):
        return NativeFailure(f"native compaction not asked ({result})", refused=True)
    return NativeFailure(f"native compaction failed ({type(result).__name__}: {result})")


class _Reports:
    """The usage sink of one native request, closed when the operation stops waiting for it:
    figures that arrive later (the thread outlives a deadline) are dropped, so the request is
    priced once, by what the operation recorded when it ended."""

    def __init__(self, sink: UsageSink | None):
        self._sink = sink
        self._lock = threading.Lock()
        self._reported = False
        self._closed = False

    def report(self, entry: UsageEntry) -> None:
        with self._lock:
            if self._closed or self._sink is None:
                return
            self._reported = True
            self._sink(entry)

    def close(self, cut_off: UsageEntry | None) -> None:
        """Stop taking figures; `cut_off` prices the request when none arrived (SPEC §16)."""
        with self._lock:
            if not self._closed and not self._reported and cut_off is not None and self._sink is not None:
                self._sink(cut_off)
            self._closed = True


def _cut_off(compactor: NativeCompactor, request: NativeRequest) -> UsageEntry:
    """A native request the deadline cut off, priced for what was sent (SPEC §16)."""
    target = compactor.target
    return estimated_usage(
        request.input_tokens, 0, provider=target.provider, model=target.model, operation_id=request.operation_id,
        operation="compaction",
    )  # fmt: skip
