"""Effective-token measurement (SPEC §2), incremental in what was appended.

`provider_usage`: the input tokens the provider reported for the last request on this
path, plus local counts of everything appended since. `estimated`: local counts only.
The tracker remembers how much of the path it has seen; a preflight processes only the
new entries, so its cost does not grow with the session (a rewind or a capsule rebuilds).
A rebuild counts from the last usage figure's answer on (`backlog`): what came before it is
counted the first time a figure needs it, so a path measured from nothing costs what its
last request added, not what the whole session holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import count
from typing import Literal, cast

from msgspec import Struct

from soba_nb.compaction.backlog import Backlog, find_anchor
from soba_nb.compaction.budget_state import TrackerState
from soba_nb.compaction.effective import effective_from, measured_count
from soba_nb.compaction.model_input import (
    SKILLS_HEADING,
    capsule_tokens,
    entry_tokens,
)
from soba_nb.compaction.native_continuation import NativeTarget
from soba_nb.compaction.planner import RegionFacts
from soba_nb.compaction.triggers import (
    INTENT_KINDS,
    SOFT_TRIGGERS,
    LoopGuard,
    Trigger,
)
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CellsEntry,
    CheckpointEntry,
    CompactionEntry,
    Entry,
    MessageEntry,
    SkillEntry,
    ToolCallEntry,
    ToolResultEntry,
    UsageEntry,
)

Source = Literal["provider_usage", "estimated"]
EAGER_BACKLOG_ENTRIES = 256
"""A backlog spanning fewer entries is counted at once (a few milliseconds): laziness pays
only on a long path, and a settled tracker's state is saved beside the transcript."""
_RARE = (CheckpointEntry, CompactionEntry, SkillEntry)


class Measurement(Struct, frozen=True, eq=False):
    """Effective tokens of the next request and how they were measured."""

    effective: int
    source: Source
    counted: int
    """The purely local estimate but for the backlog's entries (all of it without one)."""
    reported_input_tokens: int | None
    """The last provider usage figure on this path since the latest capsule, if any."""
    backlog: Backlog | None = None
    """The region's entries not counted yet (`soba_nb.compaction.backlog`)."""

    @property
    def estimated(self) -> int:
        """The purely local estimate, for comparison (the backlog is counted when it is read)."""
        return self.counted if self.backlog is None else self.counted + self.backlog.tokens

    def _figures(self) -> tuple[int, str, int, int | None]:
        return self.effective, self.source, self.estimated, self.reported_input_tokens

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Measurement) and self._figures() == other._figures()

    def __hash__(self) -> int:
        return hash(self._figures())


def _trusted(entry: Entry, ceiling: int | None) -> bool:
    """A usage figure that measures what was sent: the path (an inference request's, never a
    compaction request's: its input is the summary prompt), not a prompt the server cut, and
    the server's (not our estimate when it sent none)."""
    return (
        isinstance(entry, UsageEntry)
        and entry.operation == "inference"
        and not entry.truncated
        and entry.estimated is not True  # our own count, the server sent none
        and (ceiling is None or entry.input_tokens < ceiling)
    )


def _usage_after(path: Sequence[Entry], index: int, ceiling: int | None) -> bool:
    return any(_trusted(entry, ceiling) for entry in path[index + 1 :])


class BudgetTracker:
    """Incremental effective-token measurement of one transcript path."""

    def __init__(self, counter: TokenCounter, fixed: int):
        self.counter = counter
        self.fixed = fixed
        """Tokens of the system prompt, tool schemas and reply priming."""
        self._seen = 0
        self._last_id: str | None = None
        self._estimated = 0
        self._before_last_assistant = 0
        self._usage_input: int | None = None
        self._usage_offset = 0
        self._usage_sent: int | None = None
        """The `sentTokens` of the figure in `_usage_input` (`effective.measured_count`)."""
        self._skills: dict[str, SkillEntry] = {}
        self._intents: list[CheckpointEntry] = []
        self._capsule_at: int | None = None
        self._capsule_id: str | None = None
        self._soft_failures = 0
        self._tokens_at_last_soft = 0
        self._visible_since_capsule = False
        self.rebuilds = 0
        """How many full rebuilds happened (tests and benchmarks read it)."""
        self._usage_ceiling: int | None = None
        self._target: NativeTarget | None = None
        self._region_tokens = 0
        """Model-input tokens of the region a compaction would work on (visible entries from
        the latest capsule's kept tail, or the root, to the leaf)."""
        self._region_result_tokens = 0
        """The part of `_region_tokens` that is tool results (what clipping could reclaim)."""
        self._open_calls: dict[str, None] = {}
        """Tool calls in the region with no result yet, oldest first."""
        self._root_id: str | None = None
        self._positions: dict[str, int] = {}
        """Where on the path the intents and skills are (by entry id), for `state`."""
        self._offered: tuple[TrackerState, ...] = ()
        self.restores = 0
        """How many times a saved state replaced a rebuild (tests and benchmarks read it)."""
        self._backlog: Backlog | None = None
        """The region's entries before the anchor, not counted yet: `_estimated`,
        `_before_last_assistant`, `_usage_offset` and the region sums leave them out (the
        differences effective tokens are made of do not need them), `_open_calls` is not kept."""
        self._region_start = 0
        self._path: Sequence[Entry] = ()

    def set_target(self, target: NativeTarget | None) -> None:
        """The provider and model the next requests go to: a capsule costs its native item
        when they produced it, else its portable text (a switch rebuilds the measurement)."""
        if target != self._target:
            self._target = target
            self._last_id = None  # the next measure rebuilds

    def distrust_usage_from(self, ceiling: int | None) -> None:
        """Usage figures of `ceiling` tokens or more are not used: the server cuts prompts to
        about that size silently (a `truncation` window), so such a figure may measure a cut
        prompt even when it was not flagged at the time."""
        if ceiling != self._usage_ceiling:
            self._usage_ceiling = ceiling
            self._last_id = None  # the next measure rebuilds

    def set_fixed(self, fixed: int) -> None:
        """The system prompt and tool schemas cost `fixed` from now on (other tool schemas):
        the next request grows or shrinks by the difference, whatever the provider counted for
        the last one (that figure and our estimate of the same request stay a pair)."""
        self._estimated += fixed - self.fixed
        self.fixed = fixed

    def measure(self, path: Sequence[Entry]) -> Measurement:
        """Bring the tracker up to date with `path` and return the measurement."""
        extends = (
            self._last_id is not None
            and len(path) >= self._seen
            and path[self._seen - 1].id == self._last_id
        )
        restored = False
        if not extends and self._offered:
            restored = extends = any(self._restore(state, path) for state in self._offered)
            self._offered = ()
        if not extends:
            self._rebuild(path)
        else:
            added = path[self._seen :]
            if any(type(entry) is CapsuleEntry for entry in added):
                self._rebuild(path)
            elif restored:
                # What came after a saved state was never counted (a measure would have saved
                # a newer one): counted now, without reading every count of the path first.
                with self.counter.backfill_held():
                    self._add_all(added, self._seen)
                self._mark(path)
            else:
                self._add_all(added, self._seen)
                self._mark(path)
        backlog = self._backlog
        if self._usage_input is not None:
            effective = effective_from(self._usage_input, self._counted_then(), self._estimated)
            return Measurement(effective, "provider_usage", self._estimated, self._usage_input, backlog)
        assert backlog is None  # a backlog has a usage figure after it
        return Measurement(self._estimated, "estimated", self._estimated, None)

    def _counted_then(self) -> int:
        """Our count of what the usage figure measured (`effective.measured_count`); with a
        backlog the path's count lacks it, so the comparison waits for `settle`."""
        offset = self._usage_offset
        return offset if self._backlog is not None else measured_count(offset, self._usage_sent)

    @property
    def backlog(self) -> Backlog | None:
        """The region's entries not counted yet (as of the last `measure`), or None."""
        return self._backlog

    def settle(self) -> bool:
        """Count the backlog in (once): every figure is then the whole region's (and the usage
        figure pairs with what its request held, `_counted_then`). False: there was none."""
        backlog = self._backlog
        if backlog is None:
            return False
        tokens, results = backlog.sums()
        self._estimated += tokens
        self._before_last_assistant += tokens
        self._usage_offset += tokens  # taken after the anchor: on the same footing
        self._region_tokens += tokens
        self._region_result_tokens += results
        open_calls: dict[str, None] = {}
        for entry in self._path[self._region_start : self._seen]:
            kind = type(entry)
            if kind is ToolCallEntry:
                open_calls[cast(ToolCallEntry, entry).call_id] = None
            elif kind is ToolResultEntry:
                open_calls.pop(cast(ToolResultEntry, entry).call_id, None)
        self._open_calls = open_calls
        self._backlog = None
        return True

    @property
    def counted_region(self) -> tuple[int, int]:
        """`region_tokens` but for the backlog (as of the last `measure`): nothing is counted."""
        return self._region_tokens, self._region_result_tokens

    @property
    def visible_floor(self) -> int:
        """At most what the region's entries other than tool results cost (exactly that without
        a backlog), counting nothing: enough to know that no clip could make the input fit."""
        floor = self._region_tokens - self._region_result_tokens
        return floor if self._backlog is None else floor + self._backlog.floor

    @property
    def skills(self) -> tuple[SkillEntry, ...]:
        """Active skills on the path (as of the last `measure`), latest activation last."""
        return tuple(self._skills.values())

    @property
    def guard(self) -> LoopGuard:
        """The loop guard's state on the path (as of the last `measure`)."""
        return LoopGuard(
            failures=self._soft_failures,
            tokens_at_last_attempt=self._tokens_at_last_soft,
            just_completed=self._capsule_at is not None and not self._visible_since_capsule,
        )

    @property
    def capsule_index(self) -> int | None:
        """Index on the path of the latest capsule (as of the last `measure`)."""
        return self._capsule_at

    @property
    def capsule_id(self) -> str | None:
        """Id of the latest capsule on the path (as of the last `measure`)."""
        return self._capsule_id

    @property
    def region_tokens(self) -> tuple[int, int]:
        """Tokens of the region's visible entries, and of its tool results alone (as of the
        last `measure`): what the model input of the path sums, without looking a count up
        (but the backlog's, counted now if there is one)."""
        self.settle()
        return self._region_tokens, self._region_result_tokens

    @property
    def region_facts(self) -> RegionFacts:
        """The region's total and first unanswered call (as of the last `measure`): the
        compaction plan then walks only the kept tail."""
        self.settle()
        return RegionFacts(self._region_tokens, next(iter(self._open_calls), None))

    @property
    def pending_intents(self) -> tuple[CheckpointEntry, ...]:
        """Unconsumed intent checkpoints (as of the last `measure`), kept incrementally."""
        return tuple(self._intents)

    def _mark(self, path: Sequence[Entry]) -> None:
        self._path = path
        self._seen = len(path)
        self._last_id = path[-1].id if path else None
        self._root_id = path[0].id if path else None

    # -- saved state (`budget_state`) ----------------------------------------------------

    def _target_key(self) -> tuple[str, ...] | None:
        target = self._target
        return None if target is None else (target.provider, target.model, *sorted(target.kinds))

    def state(self, counts: Mapping[str, int]) -> TrackerState | None:
        """What the tracker knows (as of the last `measure`), to be offered to a tracker of a
        later process; `counts`: what the model input needs besides the entries' counts.
        None before the first measure of a non-empty path, and while there is a backlog (a
        later process measures that from the anchor as cheaply as from a state)."""
        if self._last_id is None or self._root_id is None or self._backlog is not None:
            return None
        capsule_at = self._capsule_at
        positions = self._positions
        return TrackerState(
            counter=self.counter.key,
            fixed=self.fixed,
            usage_ceiling=self._usage_ceiling,
            target=self._target_key(),
            root_id=self._root_id,
            seen=self._seen,
            last_id=self._last_id,
            estimated=self._estimated,
            before_last_assistant=self._before_last_assistant,
            usage_input=self._usage_input,
            usage_offset=self._counted_then(),
            capsule_at=capsule_at,
            capsule_id=None if capsule_at is None else self._capsule_id,
            skills=[(positions[skill.id], skill.id) for skill in self._skills.values()],
            intents=[(positions[intent.id], intent.id) for intent in self._intents],
            soft_failures=self._soft_failures,
            tokens_at_last_soft=self._tokens_at_last_soft,
            visible_since_capsule=self._visible_since_capsule,
            region_tokens=self._region_tokens,
            region_result_tokens=self._region_result_tokens,
            open_calls=list(self._open_calls),
            counts=dict(counts),
        )

    def offer(self, *states: TrackerState | None) -> None:
        """Saved states to start from instead of a rebuild (the first that still describes the
        path and the settings at the next `measure` that would rebuild is taken)."""
        self._offered = tuple(state for state in states if state is not None)

    def _restore(self, state: TrackerState, path: Sequence[Entry]) -> bool:
        """Take `state` when it is a point of `path` measured with these settings."""
        seen = state.seen
        if (
            state.counter != self.counter.key
            or state.fixed != self.fixed
            or state.usage_ceiling != self._usage_ceiling
            or state.target != self._target_key()
            or not 0 < seen <= len(path)
            or path[seen - 1].id != state.last_id
            or path[0].id != state.root_id
            or any(type(entry) is CapsuleEntry for entry in path[seen:])  # a capsule since: rebuilt
        ):
            return False
        capsule_at = state.capsule_at
        if capsule_at is not None and not (
            0 <= capsule_at < seen and type(path[capsule_at]) is CapsuleEntry and path[capsule_at].id == state.capsule_id
        ):
            return False
        skills = [path[at] for at, entry_id in state.skills if 0 <= at < seen and path[at].id == entry_id]
        intents = [path[at] for at, entry_id in state.intents if 0 <= at < seen and path[at].id == entry_id]
        if len(skills) != len(state.skills) or len(intents) != len(state.intents):
            return False
        if not all(type(skill) is SkillEntry for skill in skills) or not all(
            type(intent) is CheckpointEntry for intent in intents
        ):
            return False
        self._seen, self._last_id, self._root_id = seen, state.last_id, state.root_id
        self._estimated, self._before_last_assistant = state.estimated, state.before_last_assistant
        self._usage_input, self._usage_offset, self._usage_sent = state.usage_input, state.usage_offset, None
        self._capsule_at = capsule_at
        self._capsule_id = state.capsule_id
        self._skills = {cast(SkillEntry, skill).name: cast(SkillEntry, skill) for skill in skills}
        self._intents = cast(list[CheckpointEntry], intents)
        self._positions = {entry_id: at for at, entry_id in (*state.skills, *state.intents)}
        self._soft_failures, self._tokens_at_last_soft = state.soft_failures, state.tokens_at_last_soft
        self._visible_since_capsule = state.visible_since_capsule
        self._region_tokens, self._region_result_tokens = state.region_tokens, state.region_result_tokens
        self._open_calls = dict.fromkeys(state.open_calls)
        self._backlog = None
        self.restores += 1
        return True

    def _rebuild(self, path: Sequence[Entry]) -> None:
        self.rebuilds += 1
        self._estimated = self.fixed
        self._before_last_assistant = self.fixed
        self._usage_input, self._usage_offset, self._usage_sent = None, 0, None
        self._skills = {}
        self._soft_failures = self._tokens_at_last_soft = 0
        self._visible_since_capsule = False
        # Capsules and skills are few: found in the list of entry types (list searches in C).
        kinds = list(map(type, path))
        capsule_at = len(kinds) - 1 - kinds[::-1].index(CapsuleEntry) if CapsuleEntry in kinds else None
        self._capsule_at = capsule_at
        self._capsule_id = None if capsule_at is None else path[capsule_at].id
        self._positions = {}
        start = 0
        if capsule_at is not None:
            capsule = path[capsule_at]
            assert isinstance(capsule, CapsuleEntry)
            self._estimated += capsule_tokens(capsule, self.counter, self._target)
            start = capsule_at + 1
            kept = capsule.first_kept_entry_id
            if kept is not None:
                for index in range(capsule_at - 1, -1, -1):
                    if path[index].id == kept:
                        start = index
                        break
        # Skills activated before the region are in effect from its start; those in it count
        # where they were activated, as when the path grew (a usage figure before one did
        # not include it).
        if SkillEntry in kinds[:start]:
            for index in [index for index, kind in enumerate(kinds[:start]) if kind is SkillEntry]:
                self._add_rare(path[index], index)
        self._region_tokens = self._region_result_tokens = 0
        self._open_calls = {}
        self._intents = []
        self._region_start = start
        anchor = find_anchor(path, kinds, start, capsule_at, lambda entry: _trusted(entry, self._usage_ceiling))
        skipped: list[tuple[int, int]] = []
        if capsule_at is not None and start < capsule_at:  # the kept tail, then what follows the capsule
            if anchor is None:
                self._add_all(path[start:capsule_at], start)
            else:
                self._add_rare_in(path, kinds, start, capsule_at)
                skipped.append((start, capsule_at))
            # What the guard counts, "just completed" and pending intents start after the
            # capsule (the operation that appended it consumed every intent before it).
            self._soft_failures = self._tokens_at_last_soft = 0
            self._visible_since_capsule = False
            self._intents = []
            start = capsule_at + 1
        if anchor is not None:  # what the effective figure does not need: its checkpoints and skills only
            self._add_rare_in(path, kinds, start, anchor)
            skipped.append((start, anchor))
            start = anchor
        self._add_all(path[start:], start)
        self._backlog = Backlog(path, skipped, kinds, self.counter) if skipped else None
        if self._backlog is not None and self._backlog.entries < EAGER_BACKLOG_ENTRIES:
            self._mark(path)
            self.settle()
        # A usage figure from before the latest capsule measured a different input: the
        # provider's calibration carries over through the capsule's before-figures instead
        # (SPEC §2: "minus what a compaction removed").
        if capsule_at is not None and not _usage_after(path, capsule_at, self._usage_ceiling):
            capsule = path[capsule_at]
            assert isinstance(capsule, CapsuleEntry)
            self._usage_sent = None
            if capsule.estimated_before is not None and capsule.estimated_before != capsule.tokens_before:
                self._usage_input = capsule.tokens_before
                self._usage_offset = capsule.estimated_before
            else:
                self._usage_input = None
                self._usage_offset = 0
        self._mark(path)

    def _add_all(self, entries: Sequence[Entry], offset: int) -> None:
        """Count `entries` (from position `offset` of the path) in, in order (a rebuild's
        whole region, or what a preflight finds appended). One loop over local variables: on
        a long path it runs once per entry."""
        counter = self.counter
        costs = counter.known_all([entry.id for entry in entries])  # cached counts, at once
        estimated, region, before_last = self._estimated, self._region_tokens, self._before_last_assistant
        results = self._region_result_tokens
        open_calls, ceiling, visible = self._open_calls, self._usage_ceiling, self._visible_since_capsule
        usage_input, usage_offset, usage_sent = self._usage_input, self._usage_offset, self._usage_sent
        for position, entry, cost in zip(count(offset), entries, costs):
            kind = type(entry)  # entry types are final: one identity test each, no isinstance chain
            if kind is MessageEntry or kind is ToolCallEntry or kind is ToolResultEntry or kind is CellsEntry:
                if cost is None:
                    cost = entry_tokens(entry, counter)
                if kind is MessageEntry:
                    if cast(MessageEntry, entry).role == "assistant":
                        before_last = estimated
                elif kind is ToolCallEntry:
                    open_calls[cast(ToolCallEntry, entry).call_id] = None
                elif kind is ToolResultEntry:
                    open_calls.pop(cast(ToolResultEntry, entry).call_id, None)
                    results += cost
                estimated += cost
                region += cost
                visible = True
            elif kind is UsageEntry:
                if _trusted(entry, ceiling):
                    # The figure measures the request that produced the preceding assistant message.
                    usage_input, usage_offset = cast(UsageEntry, entry).input_tokens, before_last
                    usage_sent = cast(UsageEntry, entry).sent_tokens
            elif kind is CheckpointEntry or kind is CompactionEntry or kind is SkillEntry:
                self._estimated = estimated
                self._add_rare(entry, position)
                estimated = self._estimated
        self._estimated, self._region_tokens, self._before_last_assistant = estimated, region, before_last
        self._region_result_tokens = results
        self._visible_since_capsule = visible
        self._usage_input, self._usage_offset, self._usage_sent = usage_input, usage_offset, usage_sent

    def _add_rare_in(self, path: Sequence[Entry], kinds: list[type], low: int, high: int) -> None:
        """`_add_rare` of each checkpoint, compaction and skill entry of `path[low:high]`, in
        order, found in the list of types (searches in C: the entries between are not looked at)."""
        found: list[int] = []
        for kind in _RARE:
            at = low
            while True:
                try:
                    at = kinds.index(kind, at, high)
                except ValueError:
                    break
                found.append(at)
                at += 1
        for position in sorted(found):
            self._add_rare(path[position], position)

    def _add_rare(self, entry: Entry, position: int) -> None:
        """A checkpoint, compaction or skill entry (few on any path) at `position`."""
        kind = type(entry)
        if kind is CheckpointEntry:
            assert isinstance(entry, CheckpointEntry)
            if entry.intent and entry.kind in INTENT_KINDS:
                self._intents.append(entry)
                self._positions[entry.id] = position
        elif kind is CompactionEntry:
            assert isinstance(entry, CompactionEntry)
            consumed = set(entry.consumed)
            self._intents = [i for i in self._intents if i.checkpoint_id not in consumed]
            if entry.tokens_before is not None and Trigger(entry.trigger) in SOFT_TRIGGERS:
                self._soft_failures += 1
                self._tokens_at_last_soft = entry.tokens_before
        elif kind is SkillEntry:
            assert isinstance(entry, SkillEntry)
            previous = self._skills.pop(entry.name, None)
            if previous is not None:  # re-activated: the latest text is the one sent
                self._estimated -= self._skill_tokens(previous)
            self._estimated += self._skill_tokens(entry)
            self._skills[entry.name] = entry
            self._positions[entry.id] = position

    def _skill_tokens(self, skill: SkillEntry) -> int:
        return self.counter.cached(
            ("skill", skill.id),
            lambda: self.counter.count_text(f"{SKILLS_HEADING}## Skill: {skill.name}\n\n{skill.content}"),
        )
