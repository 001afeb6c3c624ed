"""The native step of a compaction operation: ask the provider, within the barrier's deadline.

The barrier (`soba_nb.compaction.barrier`) calls `ask_native` before the model summary when
the provider offers native compaction. The request is the region the capsule replaces, as
the provider would see it (the previous capsule's native item when it accepts it, else the
portable capsule; then the summarized entries), fitted under the hard limit. It runs in a
worker thread, abortable: a cancel, the deadline (`timeoutMs`, shared with the summary that
may follow), a failure or a refusal each end it at once, and the portable path runs with
the usual outcome rules.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
from soba_nb.transcript.entries import NativeContinuation, SkillEntry

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
    built = assemble(context, system=system, tools=tools, counter=counter, fit_to=hard_limit)
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

    def work() -> None:
        try:
            outcome.append(compactor.compact(request, cancel=abort, timeout_s=remaining, on_usage=on_usage))
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
                return late
            on_poll()
    except KeyboardInterrupt:
        abort.set()
        raise
    if cancel.is_set():
        return None
    [result] = outcome
    if isinstance(result, NativeContinuation):
        return result
    if time.monotonic() >= deadline:
        return late  # the provider's own deadline (the same one) ended it
    if isinstance(result, NativeRefused):
        return NativeFailure(f"native compaction refused ({result})", refused=True)
    if isinstance(result, RequestNotSent):
        return NativeFailure(f"native compaction not asked ({result})", refused=True)
    return NativeFailure(f"native compaction failed ({type(result).__name__}: {result})")
