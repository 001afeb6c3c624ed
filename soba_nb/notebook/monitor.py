"""The budget figures (SPEC §9): what `%budget` shows, the barrier line, the sidebar feed.

`BudgetSnapshot` is pure data computed from a session — the same figures the engine uses,
so tests compare them directly.

`%budget` shows a `BudgetView`: the snapshot of that moment as static HTML (the bar with
the soft threshold marked, then the figure lines) with the identical text as `text/plain`,
which is also what a terminal prints. Nothing later changes it: an earlier `%budget` keeps
the figures of its moment. Static HTML rather than ipywidgets because a snapshot has no
state to sync: HTML is saved with the notebook and renders the same in JupyterLab,
Notebook 7, VS Code and nbconvert, after a reload too, where a widget needs a live kernel
(or saved widget state) and keeps a comm open per output for nothing.

Two things are live. The running cell's barrier line (`TurnRenderer`, through a
`BarrierLine`): `Compacting context before response · NN%` while an inference waits for the
compaction (every trigger but `user`), `Compacting context · NN%` for `%compact` (trigger
`user`), refreshed as progress events arrive (the barrier emits one at least every
0.25 s) but never more than `MAX_UPDATES_PER_S` times a second, then collapsing to the one
result line of `result_line`. And the JupyterLab sidebar: `SidebarPublisher` sends it the
snapshot after every magic that changes the budget, and the same barrier line and result
line as the cell (`soba_nb.notebook.comm`), so one outcome is worded the same in the cell,
in `%budget`'s "Last attempt" and in the sidebar. A snapshot sent between turns also
carries the heads-up line a turn ending past 85 % of the soft limit prints
(`soba_nb.compaction.heads_up`), so the panel says the same as the cell.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from soba_nb.agent.cost import cap_note
from soba_nb.compaction.heads_up import HeadsUp, heads_up
from soba_nb.compaction.native_continuation import continuation_label
from soba_nb.compaction.outcomes import CompactionEvent, CompactionResult, Outcome
from soba_nb.compaction.triggers import Trigger
from soba_nb.notebook.comm import publish
from soba_nb.transcript.entries import CapsuleEntry

if TYPE_CHECKING:
    from soba_nb.agent.session import AgentSession

MAX_UPDATES_PER_S = 10
"""Display updates per second, at most (streamed answer, barrier line, sidebar)."""
MIN_UPDATE_INTERVAL_S = 1 / MAX_UPDATES_PER_S
LIVE_LINE = "Compacting context before response · {percent}%"
"""The live line while an inference waits for the compaction (every trigger but `user`)."""
USER_LIVE_LINE = "Compacting context · {percent}%"
"""The live line of `%compact` (trigger `user`): no response follows."""
PERCENT = 100
BAR_HEIGHT_PX = 10
BAR_COLORS = {"ok": "#4caf50", "soft": "#ff9800", "hard": "#e53935"}
SOFT_MARKER_COLOR = "#555"

Clock = Callable[[], float]


class Throttle:
    """At most one update per `interval_s` of `clock` time (tests pass a fake clock)."""

    def __init__(self, max_per_s: float = MAX_UPDATES_PER_S, clock: Clock = time.monotonic):
        self.interval_s = 1 / max_per_s
        self.clock = clock
        self._last: float | None = None

    def ready(self) -> bool:
        """True (and counted as an update) when the interval has passed since the last one."""
        now = self.clock()
        if self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        return True

    def mark(self) -> None:
        """Count an update made regardless of the throttle (a final render)."""
        self._last = self.clock()


def result_line(result: CompactionResult) -> str:
    """The one line a finished operation collapses to."""
    if result.outcome is Outcome.COMPLETED:
        return result.line()
    if result.outcome is Outcome.SKIPPED:
        return f"skipped: {result.reason}"
    return f"compaction {result.outcome.value} ({result.trigger}): {result.reason}"


def live_line(trigger: str, percent: int) -> str:
    """The barrier's live line: "before response" only when an inference follows."""
    template = USER_LIVE_LINE if trigger == Trigger.USER.value else LIVE_LINE
    return template.format(percent=percent)


def capsule_line(capsule: CapsuleEntry) -> str:
    """A committed capsule as a result line: trigger, before → after, reclaimed %, checkpoint,
    and the continuation it made (native / portable / fallback), worded as `result_line`.

    A capsule loaded from a `.capsule.md` file is not a compaction and says where it came from.
    """
    label = continuation_label(capsule)
    suffix = f" · {label}" if label else ""
    if capsule.source:
        title = f' "{capsule.title}"' if capsule.title else ""
        return f"Loaded capsule{title} from {capsule.source} · {capsule.tokens_after:,} tokens · {capsule.checkpoint_id}{suffix}"
    before, after = capsule.tokens_before, capsule.tokens_after
    reclaimed = round(PERCENT * (before - after) / max(before, 1))
    return (
        f"Compacted ({capsule.trigger}) · {before:,} → {after:,} tokens · "
        f"reclaimed {reclaimed}% · {capsule.checkpoint_id}{suffix}"
    )


@dataclass(frozen=True)
class BudgetSnapshot:
    """What `%budget` shows, as data."""

    effective: int
    hard_limit: int
    soft_limit: int
    source: str
    """`provider_usage` or `estimated`."""
    auto: bool
    last_compaction: str | None = None
    """Result line of the latest capsule on the current path."""
    last_quality: str | None = None
    last_continuation: str | None = None
    """`native`, `portable` or `fallback` for the latest capsule (see `capsule_line`)."""
    last_attempt: str | None = None
    """Result line of this kernel's latest operation when it did not complete."""
    model: str = ""
    """`provider/name` of the session's model."""
    session: str = ""
    """Session id (the transcript's file stem)."""
    provider_source: str = ""
    """How the provider was chosen (see `soba_nb.resolution`)."""
    context_window: int = 0
    max_output_tokens: int = 0
    window_source: str = ""
    """Where the context window came from (`soba_nb.window`)."""
    paused: str | None = None
    """Why soft triggers are paused (the loop guard), when they are."""
    cost: str = ""
    """The session's cost line (SPEC §11: `Cost: $0.0123 this session (…) · prices: …` or
    `Cost: not priced`), with the cap when one is set."""
    heads_up: HeadsUp | None = None
    """A compaction is near (SPEC §14): what a turn ending now prints, and the sidebar shows."""

    @property
    def percent(self) -> float:
        """Effective tokens as a percentage of hardLimit (may exceed 100)."""
        return PERCENT * self.effective / max(self.hard_limit, 1)

    @property
    def shown_percent(self) -> int:
        """`percent` as shown, rounded half up like the sidebar's `Math.round` (Python's own
        rounding takes 18.5 to 18: the cell said 18 % where the panel said 19 %)."""
        return math.floor(self.percent + 0.5)

    @property
    def soft_percent(self) -> float:
        return PERCENT * self.soft_limit / max(self.hard_limit, 1)

    @property
    def level(self) -> str:
        """`ok`, `soft` (at or past softLimit) or `hard` (past hardLimit)."""
        if self.effective > self.hard_limit:
            return "hard"
        return "soft" if self.effective >= self.soft_limit else "ok"

    def lines(self) -> list[str]:
        out = [
            f"Budget: {self.effective:,} / {self.hard_limit:,} tokens ({self.shown_percent}% of hardLimit)"
            f" · softLimit {self.soft_limit:,} · source {self.source} · auto {'on' if self.auto else 'off'}",
        ]
        if self.last_compaction is None:
            out.append("Last compaction: none on this path")
        else:
            out.append(f"Last compaction: {self.last_compaction} · quality {self.last_quality}")
        if self.last_attempt is not None:
            out.append(f"Last attempt: {self.last_attempt}")
        if self.paused is not None:
            out.append(f"Soft triggers paused: {self.paused}")
        if self.context_window:
            out.append(
                f"Window: {self.context_window:,} tokens ({self.window_source}) · "
                f"maxOutputTokens {self.max_output_tokens:,}"
            )
        if self.model:
            source = f" · {self.provider_source}" if self.provider_source else ""
            out.append(f"Model: {self.model}{source}")
        if self.cost:
            out.append(self.cost)
        return out

    def text(self) -> str:
        return "\n".join(self.lines())

    def message(self) -> dict[str, Any]:
        """The `snapshot` message of the JupyterLab sidebar (`soba_nb.notebook.comm`)."""
        return {
            "type": "snapshot",
            "effective": self.effective,
            "hardLimit": self.hard_limit,
            "softLimit": self.soft_limit,
            "source": self.source,
            "auto": self.auto,
            "lastResult": self.last_compaction,
            "lastAttempt": self.last_attempt,
            "degraded": self.last_continuation == "fallback",
            "provider": self.model,
            "session": self.session,
            "contextWindow": self.context_window,
            "windowSource": self.window_source,
            "cost": self.cost,
            "headsUp": self.heads_up.line() if self.heads_up is not None else None,
        }


def snapshot_of(session: AgentSession) -> BudgetSnapshot:
    """The session's budget, measured by its own engine (the figures `%budget` shows)."""
    compactor = session.compactor
    measurement = compactor.measure()
    thresholds = compactor.thresholds
    limits = session.limits
    guard = compactor.tracker.guard
    paused = (
        f"{guard.failures} fruitless attempts; they resume when effective reaches "
        f"{guard.tokens_at_last_attempt + thresholds.min_reclaimable_tokens:,}"
        if guard.paused(measurement.effective, thresholds.min_reclaimable_tokens)
        else None
    )
    capsules = session.capsules()
    latest = capsules[-1] if capsules else None
    attempt = compactor.last_result
    return BudgetSnapshot(
        effective=measurement.effective,
        hard_limit=thresholds.hard_limit,
        soft_limit=thresholds.soft_limit,
        source=measurement.source,
        auto=thresholds.auto,
        last_compaction=capsule_line(latest) if latest else None,
        last_quality=latest.quality if latest else None,
        last_continuation=continuation_label(latest) if latest else None,
        last_attempt=result_line(attempt) if attempt and attempt.outcome is not Outcome.COMPLETED else None,
        model=f"{session.config.model.provider}/{session.config.model.name}",
        session=session.session_id,
        provider_source=session.config.provider_source,
        context_window=limits.context_window,
        max_output_tokens=limits.max_output_tokens,
        window_source=limits.window_source,
        paused=paused,
        cost=session.cost().line() + cap_note(session.config),
        heads_up=heads_up(
            effective=measurement.effective,
            thresholds=thresholds,
            intents=compactor.tracker.pending_intents,
            guard=guard,
        ),
    )


class BarrierLine:
    """The live barrier line, throttled, collapsing to the result line.

    `sink(text, final)` shows the text; `final` is True for the collapsed result.
    """

    def __init__(self, sink: Callable[[str, bool], None], clock: Clock = time.monotonic):
        self.sink = sink
        self.throttle = Throttle(MAX_UPDATES_PER_S, clock)
        self.text = ""
        self.running = False
        self.trigger = ""
        self.percent = 0
        self.result: CompactionResult | None = None

    def on_event(self, event: CompactionEvent) -> None:
        self.trigger, self.percent = event.trigger, event.percent
        if event.kind == "compaction_start":
            self.running, self.result = True, None
            self._show(live_line(event.trigger, 0), force=True)
        elif event.kind == "compaction_progress" and self.running:
            self._show(live_line(event.trigger, event.percent), force=False)
        elif event.kind == "compaction_end" and event.result is not None:
            self.running, self.result = False, event.result
            self._show(result_line(event.result), force=True, final=True)

    def _show(self, text: str, *, force: bool, final: bool = False) -> None:
        self.text = text
        if force:
            self.throttle.mark()
        elif not self.throttle.ready():
            return
        self.sink(text, final)


def _bar_html(snapshot: BudgetSnapshot) -> str:
    width = min(PERCENT, snapshot.percent)
    soft = min(PERCENT, snapshot.soft_percent)
    title = html.escape(snapshot.lines()[0])
    return (
        f'<div class="soba-bar" title="{title}" style="position:relative;height:{BAR_HEIGHT_PX}px;'
        f'background:#e0e0e0;border-radius:3px;margin:4px 0">'
        f'<div class="soba-bar-fill" style="width:{width:.1f}%;height:100%;'
        f'background:{BAR_COLORS[snapshot.level]};border-radius:3px"></div>'
        f'<div class="soba-soft-marker" title="softLimit {snapshot.soft_limit:,}" '
        f'style="position:absolute;left:{soft:.1f}%;top:-3px;bottom:-3px;'
        f'border-left:2px solid {SOFT_MARKER_COLOR}"></div></div>'
    )


class BudgetView:
    """`%budget`'s output: the figures of one moment, as HTML with the same text as
    `text/plain`. Displayed once, never updated."""

    def __init__(self, snapshot: BudgetSnapshot):
        self.snapshot = snapshot

    def text(self) -> str:
        return self.snapshot.text()

    def html(self) -> str:
        lines = "".join(f'<div class="soba-budget-line">{html.escape(line)}</div>' for line in self.snapshot.lines())
        return (
            f'<div class="soba-budget" data-level="{self.snapshot.level}">{_bar_html(self.snapshot)}'
            f'<div class="soba-budget-figures">{lines}</div></div>'
        )

    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/html": self.html(), "text/plain": self.text()}


def result_message(result: CompactionResult) -> dict[str, Any]:
    """The sidebar's `result` message: the line the cell shows, and what kind of outcome."""
    return {
        "type": "result",
        "line": result_line(result),
        "outcome": result.outcome.value,
        "degraded": result.continuation == "fallback",
    }


Send = Callable[[dict[str, Any]], bool]


class SidebarPublisher:
    """Feeds the JupyterLab sidebar (`comm.publish`, a no-op without a kernel).

    `refresh(snapshot)` after every magic that changes the budget; `on_event` during a
    barrier: its live line (throttled like the cell's) as `progress`, then its result line.
    """

    def __init__(self, clock: Clock = time.monotonic, send: Send | None = None):
        self.send: Send = send or publish
        self.snapshot: BudgetSnapshot | None = None
        self.barrier_line = BarrierLine(self._show_barrier, clock)
        self.in_turn = False
        """A turn is running (`turn`): its snapshots carry no heads-up."""

    @contextmanager
    def turn(self) -> Iterator[None]:
        """While a turn runs, the figures it sends carry no heads-up: the heads-up is worded
        for the end of a turn (SPEC §14: "the next request may compact first"), and inside
        one the next preflight is the turn's own, with its one soft attempt perhaps spent."""
        self.in_turn = True
        try:
            yield
        finally:
            self.in_turn = False

    def refresh(self, snapshot: BudgetSnapshot) -> None:
        self.snapshot = snapshot
        message = snapshot.message()
        if self.in_turn:
            message["headsUp"] = None
        self.send(message)

    def on_event(self, event: object) -> None:
        if isinstance(event, CompactionEvent):
            self.barrier_line.on_event(event)

    def _show_barrier(self, text: str, final: bool) -> None:
        line = self.barrier_line
        if final and line.result is not None:
            self.send(result_message(line.result))
        else:
            self.send({"type": "progress", "percent": line.percent, "trigger": line.trigger, "line": text})
