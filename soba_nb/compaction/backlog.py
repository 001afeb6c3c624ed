"""What a cold open need not count: the region's entries before the last usage figure.

SPEC §2's effective tokens are the provider's input count for the last request on the path
plus local counts of what came after it, so a path measured from nothing (a transcript copied,
downloaded or restored without the counts kept beside it) needs only the entries from the
assistant message that request produced: the anchor. Everything of the region before it is
the backlog, counted once, the first time a figure that needs it is read — the purely local
estimate of the whole input, the region's total a compaction plans with — never to show the
effective figure, to decide a trigger, or to assemble an input whose least possible size
(`MIN_ENTRY_TOKENS` an entry) is over the hard limit even without its tool outputs: no clip
could make it fit, it is never sent (compaction runs first, and its plan counts the backlog).
An input that may be sent is counted whole (about a window's worth).

A tracker that took a saved state (`budget_state`) or found no usable figure counts as
before; this is only the start of a measurement that has nothing to start from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

from soba_nb.compaction.model_input import VISIBLE_TYPES, entry_tokens
from soba_nb.tokens import TOKENS_PER_MESSAGE, TokenCounter
from soba_nb.transcript.entries import (
    CellsEntry,
    Entry,
    MessageEntry,
    ToolCallEntry,
    ToolResultEntry,
    UsageEntry,
)

MIN_ENTRY_TOKENS = TOKENS_PER_MESSAGE
"""The least a visible entry costs in model input, whatever its text: its message framing (a
tool call's is more). A lower bound of the backlog rests on it."""
_VISIBLE = frozenset(VISIBLE_TYPES)
_NOT_RESULTS = (MessageEntry, ToolCallEntry, CellsEntry)


class Backlog:
    """The visible entries of `path` in `ranges` (positions, end excluded), not yet counted.

    `sums()` counts them once (cached counts first: the `.tokens` index is read then, if
    there is one); `floor` bounds what its entries other than tool results cost, counting
    nothing. `kinds`: the path's entry types (types are final: counted in C).
    """

    def __init__(self, path: Sequence[Entry], ranges: Sequence[tuple[int, int]], kinds: list[type], counter: TokenCounter):
        self._path = path
        self.ranges = tuple(ranges)
        self._counter = counter
        self._sums: tuple[int, int] | None = None
        self.not_results = sum(kinds[lo:hi].count(kind) for lo, hi in self.ranges for kind in _NOT_RESULTS)
        self.visible = self.not_results + sum(kinds[lo:hi].count(ToolResultEntry) for lo, hi in self.ranges)
        """How many of its entries reach the model (what `sums` counts)."""

    @property
    def entries(self) -> int:
        """How many entries the backlog spans (visible or not)."""
        return sum(hi - lo for lo, hi in self.ranges)

    @property
    def floor(self) -> int:
        """At most what its messages, calls and cells cost (tool results left out)."""
        return MIN_ENTRY_TOKENS * self.not_results

    @property
    def counted(self) -> bool:
        return self._sums is not None

    def sums(self) -> tuple[int, int]:
        """Tokens of the backlog's visible entries, and of its tool results alone (counted
        the first time, then kept)."""
        if self._sums is None:
            path, counter = self._path, self._counter
            visible = [entry for lo, hi in self.ranges for entry in path[lo:hi] if type(entry) in _VISIBLE]
            costs = counter.known_all([entry.id for entry in visible])
            total = results = 0
            for entry, cost in zip(visible, costs, strict=True):
                if cost is None:
                    cost = entry_tokens(entry, counter)
                total += cost
                if type(entry) is ToolResultEntry:
                    results += cost
            self._sums = (total, results)
        return self._sums

    @property
    def tokens(self) -> int:
        return self.sums()[0]


def find_anchor(
    path: Sequence[Entry], kinds: list[type], start: int, capsule_at: int | None, trusted: Callable[[Entry], bool]
) -> int | None:
    """Where counting must begin for the effective figure: the assistant message answered by
    the last trusted usage figure after the latest capsule, when it lies after the region's
    start (and after the capsule: a figure after it measured the capsule's input, and the
    kept tail is counted whole). None: everything is counted (no such figure).

    `trusted(entry)`: whether a usage entry measures the path (`budget._trusted`)."""
    floor = start if capsule_at is None else capsule_at + 1
    usage = None
    for index in range(len(path) - 1, floor - 1, -1):
        if kinds[index] is UsageEntry and trusted(path[index]):
            usage = index
            break
    if usage is None:
        return None
    for index in range(usage - 1, floor - 1, -1):
        if kinds[index] is MessageEntry and cast(MessageEntry, path[index]).role == "assistant":
            return index if index > start else None
    return None
