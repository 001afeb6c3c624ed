"""Cut-point planning (SPEC §5): what is summarized and what is kept in full.

The kept tail is about `keepRecentTokens`, larger when needed to keep a tool call with its
results, smaller only when the hard limit or a provider overflow forces it. A cut is only
ever placed at a message that starts a new group, with every earlier call answered, so the
cut never separates a tool call from its result.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct

from soba_nb.compaction.model_input import (
    UNKNOWN,
    VISIBLE_TYPES,
    Unknown,
    entry_tokens,
    latest_capsule_index,
)
from soba_nb.compaction.requests import is_request
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CellsEntry,
    Entry,
    MessageEntry,
    ToolCallEntry,
    ToolResultEntry,
)


class Cut(Struct, frozen=True):
    """The outcome of planning: entries to summarize and the kept tail."""

    summarize: tuple[Entry, ...]
    """Entries folded into the new capsule (from the previous capsule's kept tail on)."""
    kept: tuple[Entry, ...]
    """Entries carried in full, from `first_kept_entry_id` to the leaf."""
    first_kept_entry_id: str | None
    kept_tokens: int
    summarized_tokens: int
    previous: CapsuleEntry | None
    """The capsule this one rolls up, if any."""
    request: MessageEntry | None = None
    """The request being worked on (`current_request` of the path), wherever it is."""

    @property
    def empty(self) -> bool:
        """Nothing the model sees would be summarized."""
        return self.summarized_tokens == 0


class RegionFacts(Struct, frozen=True):
    """What the budget tracker already knows of the region (kept as entries are appended),
    sparing the planner a pass over the whole of it."""

    tokens: int
    """What the region's entries cost in model input (cached counts of visible entries)."""
    first_open_call: str | None
    """Call id of the first tool call in the region with no result yet (no cut may follow it)."""


class NothingToCompact(ValueError):
    """There is no safely compactable history before the kept window. The message says why."""


def region(path: Sequence[Entry], *, capsule_at: int | None | Unknown = UNKNOWN) -> tuple[list[Entry], CapsuleEntry | None]:
    """The part of the path a new compaction works on, and the capsule it rolls up.

    A repeated compaction starts from the previous capsule's `firstKeptEntryId`, so what
    the previous capsule kept is summarized now, not lost. `capsule_at`: the latest
    capsule's index on `path` (None: there is none), when the caller already knows it
    (the budget tracker does), sparing a scan of the whole path.
    """
    if isinstance(capsule_at, Unknown):
        capsule_at = latest_capsule_index(path)
    if capsule_at is None:
        return list(path), None
    previous = path[capsule_at]
    assert isinstance(previous, CapsuleEntry)
    start = region_start(path, capsule_at)
    return [*path[start:capsule_at], *path[capsule_at + 1 :]], previous


def region_start(path: Sequence[Entry], capsule_at: int | None) -> int:
    """Index on `path` of the region's first entry: the latest capsule's first kept entry
    (found walking back from the capsule), else the entry after the capsule, else the root."""
    if capsule_at is None:
        return 0
    previous = path[capsule_at]
    assert isinstance(previous, CapsuleEntry)
    if previous.first_kept_entry_id is not None:
        for index in range(capsule_at - 1, -1, -1):
            if path[index].id == previous.first_kept_entry_id:
                return index
    return capsule_at + 1


def current_request(path: Sequence[Entry]) -> MessageEntry | None:
    """The user message that started the current turn: the latest request on the path (a
    steer sent into a running turn is part of it, not a new one: `requests.is_request`).

    It may lie before any number of capsules (a long tool loop compacts several times in
    one turn), so the whole path is searched, not only the region being summarized; a
    capsule loaded from a file (a handoff) starts the session afresh, so the search stops
    there.
    """
    for entry in reversed(path):
        if isinstance(entry, MessageEntry) and is_request(entry):
            return entry
        if isinstance(entry, CapsuleEntry) and entry.source is not None:
            return None
    return None


def valid_cuts(entries: Sequence[Entry]) -> list[int]:
    """Indices where a cut may fall: a message (or the cells ahead of a request) with every
    earlier tool call answered."""
    cuts: list[int] = []
    open_calls: set[str] = set()
    for index, entry in enumerate(entries):
        if isinstance(entry, MessageEntry | CellsEntry) and not open_calls:
            cuts.append(index)
        if isinstance(entry, ToolCallEntry):
            open_calls.add(entry.call_id)
        elif isinstance(entry, ToolResultEntry):
            open_calls.discard(entry.call_id)
    return cuts


def plan_cut(
    path: Sequence[Entry],
    counter: TokenCounter,
    *,
    keep_recent_tokens: int,
    max_kept_tokens: int | None = None,
    capsule_at: int | None | Unknown = UNKNOWN,
    facts: RegionFacts | None = None,
) -> Cut:
    """Choose the cut. Raises `NothingToCompact` when nothing before the kept window.

    `max_kept_tokens` (hard limit, overflow recovery) lets the kept tail shrink below
    `keep_recent_tokens`, down to the last group (the current request or an unanswered
    tool group), which is never dropped.

    Walks back from the leaf: only the kept tail is looked at entry by entry. The region's
    total and its first unanswered call come from `facts` when the caller has them (the
    budget tracker keeps both as entries are appended), else from one pass of cached counts.
    """
    entries, previous = region(path, capsule_at=capsule_at)
    if facts is None:
        facts = RegionFacts(_total_tokens(entries, counter), _first_unanswered_call(entries))
    total = facts.tokens
    if not total:
        raise NothingToCompact("nothing to compact: the session has no history the model sees yet")
    blocked = facts.first_open_call
    """While walking back past a call that is never answered, no cut: it would follow it."""
    cuts: list[tuple[int, int]] = []
    """Valid cuts from the leaf back, with the tokens kept from each: (index, kept tokens)."""
    awaiting: set[str] = set()
    """Results after the position whose calls come before it: no cut there."""
    kept = 0
    for index in range(len(entries) - 1, -1, -1):
        entry = entries[index]
        kind = type(entry)
        if kind is CapsuleEntry:
            continue  # an older capsule inside the region is not in model input
        kept += entry_tokens(entry, counter)
        if kind is ToolResultEntry:
            awaiting.add(entry.call_id)  # type: ignore[union-attr]
        elif kind is ToolCallEntry:
            awaiting.discard(entry.call_id)  # type: ignore[union-attr]
            if entry.call_id == blocked:  # type: ignore[union-attr]
                blocked = None
        elif (kind is MessageEntry or kind is CellsEntry) and not awaiting and blocked is None:
            cuts.append((index, kept))
            if kept >= keep_recent_tokens:
                break  # the cut is decided: this one, or under `max_kept_tokens` a later one
    if not cuts:
        raise NothingToCompact("nothing to compact: no message to cut at (the history is a single tool group)")
    cut, kept_tokens = _choose(cuts, keep_recent_tokens, max_kept_tokens)
    summarized = total - kept_tokens
    if summarized == 0 and (max_kept_tokens is None or previous is None):
        # Forced (`max_kept_tokens`) with a capsule, a region that is all the group being
        # worked on (a request and the calls it made since) is no dead end: nothing new is
        # summarized, but the capsule gives way — rolled up again alone, smaller (`fitting`).
        raise NothingToCompact(nothing_older(total, keep_recent_tokens))
    return Cut(
        summarize=tuple(entries[:cut]),
        kept=tuple(entries[cut:]),
        first_kept_entry_id=entries[cut].id if cut < len(entries) else None,
        kept_tokens=kept_tokens,
        summarized_tokens=summarized,
        previous=previous,
        request=current_request(path),
    )


def nothing_older(total: int, keep_recent_tokens: int) -> str:
    """Why a session with nothing before its kept window has nothing to compact, in plain words
    and figures (`%compact`, the sidebar's answer and `%budget`'s last attempt all show it; the
    notebook adds how to hand the session over as it is)."""
    if total <= keep_recent_tokens:
        return (
            f"nothing to compact: the last {keep_recent_tokens:,} tokens are kept whole "
            f"(compaction.keepRecentTokens) and the session has {total:,}; nothing older to compact"
        )
    return (
        f"nothing to compact: the session has {total:,} tokens and keeping its last "
        f"{keep_recent_tokens:,} whole reaches back to its start (a cut falls only before a "
        f"message, never between a tool call and its result); nothing older to compact"
    )


def _choose(cuts: list[tuple[int, int]], keep_recent_tokens: int, max_kept_tokens: int | None) -> tuple[int, int]:
    """The cut keeping about `keep_recent_tokens` (the nearest valid one at or before the
    budget boundary), or, under `max_kept_tokens`, the largest tail that fits it."""
    # `cuts` runs from the leaf back; the first one keeping at least the budget, else the oldest.
    cut = next(((i, k) for i, k in cuts if k >= keep_recent_tokens), cuts[-1])
    if max_kept_tokens is not None and cut[1] > max_kept_tokens:
        fitting = [(i, k) for i, k in cuts if k <= max_kept_tokens]
        cut = fitting[-1] if fitting else cuts[0]
    return cut


def _first_unanswered_call(entries: Sequence[Entry]) -> str | None:
    """Call id of the first tool call with no result in `entries` (no cut may follow it), or
    None; the common case (every call answered) is two set comprehensions."""
    calls = {e.call_id for e in entries if type(e) is ToolCallEntry}
    answered = {e.call_id for e in entries if type(e) is ToolResultEntry}
    if calls <= answered:
        return None
    return next(e.call_id for e in entries if type(e) is ToolCallEntry and e.call_id not in answered)


def _total_tokens(entries: Sequence[Entry], counter: TokenCounter) -> int:
    """What the region's visible entries cost in model input: cached counts, counting only
    what is new (an older capsule inside the region is not sent: not counted)."""
    visible = [entry for entry in entries if isinstance(entry, VISIBLE_TYPES)]
    costs = counter.known_all([entry.id for entry in visible])
    if None not in costs:
        return sum(costs)  # type: ignore[arg-type]  # no None left
    return sum(c if c is not None else entry_tokens(e, counter) for c, e in zip(costs, visible, strict=True))
