"""A heads-up before an automatic compaction (SPEC §14).

With `auto` on, a turn that ends past `HEADS_UP_RATIO` of the soft limit says so in one line:
how close, that the next request may (or will) compact first, and how to steer it
(`%compact FOCUS` now) or avoid it (`%auto_compact off`). The magic prints the line and the
JupyterLab sidebar shows it; this module only decides whether one is due and words it.

"Will" is said only when the next preflight is certain to start a compaction: the trigger
rules (`triggers.decide`) already choose one with today's figures — a pending
`turn_complete` intent (`compactOnTurnComplete`), a milestone, the auto threshold or the hard
limit — and their gates pass. The next request only adds tokens, and every gate (the
`minTokensForAutoCompact` floor, the pre-generation ROI, the loop guard's pause) is one that
more tokens can only open, so what passes now passes then. Gates that fail now might open
with the next message: then the line says "may". (The post-generation gate may still keep the
capsule it produces out of the transcript: a compaction *runs* first, as the line says.)
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from msgspec import Struct

from soba_nb.compaction.triggers import LoopGuard, Thresholds, Trigger, TurnState, decide
from soba_nb.transcript.entries import CheckpointEntry

HEADS_UP_RATIO = 0.85
"""A turn ending at or past this share of the soft limit gets the heads-up (SPEC §14)."""
PERCENT = 100
STEER = "%compact FOCUS now to steer what it keeps"
AVOID = "%auto_compact off to avoid it"


class HeadsUp(Struct, frozen=True):
    """A compaction is near: the figures, and whether the next request will compact first."""

    effective: int
    soft_limit: int
    hard_limit: int
    trigger: Trigger | None
    """The trigger the next preflight will run (certain), or None when it only may."""

    @property
    def percent(self) -> int:
        """Effective tokens as a share of the soft limit; below it never rounds up to 100."""
        share = round(PERCENT * self.effective / max(self.soft_limit, 1))
        return min(share, PERCENT - 1) if self.effective < self.soft_limit else share

    @property
    def certain(self) -> bool:
        return self.trigger is not None

    def line(self) -> str:
        """The one line the cell prints and the sidebar shows."""
        figures = (
            f"soba: context at {self.effective:,} / {self.soft_limit:,} tokens "
            f"({self.percent}% of the auto-compact threshold)"
        )
        if self.trigger is Trigger.HARD_LIMIT:
            # Mandatory (SPEC §6): turning auto off does not avoid it, so the line does not offer that.
            return (
                f"{figures}: past the hard limit ({self.hard_limit:,}), the next request will compact "
                f"first whatever %auto_compact says — {STEER}"
            )
        if self.trigger is not None:
            return f"{figures}: the next request will compact first ({self.trigger.value}) — {STEER}, or {AVOID}"
        return f"{figures}: the next request may compact first — {STEER}, or {AVOID}"


def heads_up(
    *,
    effective: int,
    thresholds: Thresholds,
    intents: Sequence[CheckpointEntry],
    guard: LoopGuard,
) -> HeadsUp | None:
    """The heads-up due at the end of a turn, or None: auto off, or below `HEADS_UP_RATIO` of
    the soft limit (a compaction at the end of the turn that brought it below included).

    `effective`, `intents` and `guard` are the tracker's as the turn ends (measured after it).
    """
    if not thresholds.auto or effective < HEADS_UP_RATIO * thresholds.soft_limit:
        return None
    # The next preflight comes after a new user message: a fresh turn (no soft attempt made
    # yet), and not "just after a capsule" (something visible follows it by then).
    next_guard = msgspec.structs.replace(guard, just_completed=False)
    decision = decide(effective=effective, t=thresholds, intents=intents, turn=TurnState(), guard=next_guard)
    return HeadsUp(effective, thresholds.soft_limit, thresholds.hard_limit, decision.trigger)
