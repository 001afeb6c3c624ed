"""Effective-token measurement (SPEC §2), incremental in what was appended.

`provider_usage`: the input tokens the provider reported for the last request on this
path, plus local counts of everything appended since. `estimated`: local counts only.
The tracker remembers how much of the path it has seen; a preflight processes only the
new entries, so its cost does not grow with the session (a rewind or a capsule rebuilds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

from soba_nb.compaction.model_input import (
    SKILLS_HEADING,
    capsule_tokens,
    entry_tokens,
)
from soba_nb.compaction.native import NativeTarget
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


@dataclass(frozen=True)
class Measurement:
    """Effective tokens of the next request and how they were measured."""

    effective: int
    source: Source
    estimated: int
    """The purely local estimate, for comparison."""
    reported_input_tokens: int | None
    """The last provider usage figure on this path since the latest capsule, if any."""


def _trusted(entry: Entry, ceiling: int | None) -> bool:
    """A usage figure that measures what was sent: not one of a prompt the server cut."""
    return isinstance(entry, UsageEntry) and not entry.truncated and (ceiling is None or entry.input_tokens < ceiling)


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
        self._skills: dict[str, SkillEntry] = {}
        self._intents: list[CheckpointEntry] = []
        self._capsule_at: int | None = None
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
        self._open_calls: dict[str, None] = {}
        """Tool calls in the region with no result yet, oldest first."""

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
        self._estimated += fixed - self.fixed
        self._before_last_assistant += fixed - self.fixed
        self._usage_offset += fixed - self.fixed
        self.fixed = fixed

    def measure(self, path: Sequence[Entry]) -> Measurement:
        """Bring the tracker up to date with `path` and return the measurement."""
        extends = (
            self._last_id is not None
            and len(path) >= self._seen
            and path[self._seen - 1].id == self._last_id
        )
        if not extends:
            self._rebuild(path)
        else:
            added = path[self._seen :]
            if any(type(entry) is CapsuleEntry for entry in added):
                self._rebuild(path)
            else:
                self._add_all(added)
                self._mark(path)
        if self._usage_input is not None:
            effective = self._usage_input + (self._estimated - self._usage_offset)
            return Measurement(effective, "provider_usage", self._estimated, self._usage_input)
        return Measurement(self._estimated, "estimated", self._estimated, None)

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
    def region_facts(self) -> RegionFacts:
        """The region's total and first unanswered call (as of the last `measure`): the
        compaction plan then walks only the kept tail."""
        return RegionFacts(self._region_tokens, next(iter(self._open_calls), None))

    @property
    def pending_intents(self) -> tuple[CheckpointEntry, ...]:
        """Unconsumed intent checkpoints (as of the last `measure`), kept incrementally."""
        return tuple(self._intents)

    def _mark(self, path: Sequence[Entry]) -> None:
        self._seen = len(path)
        self._last_id = path[-1].id if path else None

    def _rebuild(self, path: Sequence[Entry]) -> None:
        self.rebuilds += 1
        self._estimated = self.fixed
        self._before_last_assistant = self.fixed
        self._usage_input = None
        self._usage_offset = 0
        self._skills = {}
        self._soft_failures = self._tokens_at_last_soft = 0
        self._visible_since_capsule = False
        # Capsules and skills are few: found in the list of entry types (list searches in C).
        kinds = list(map(type, path))
        capsule_at = len(kinds) - 1 - kinds[::-1].index(CapsuleEntry) if CapsuleEntry in kinds else None
        self._capsule_at = capsule_at
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
            self._add_all([entry for entry, kind in zip(path[:start], kinds, strict=False) if kind is SkillEntry])
        self._region_tokens = 0
        self._open_calls = {}
        self._intents = []
        if capsule_at is not None and start < capsule_at:  # the kept tail, then what follows the capsule
            self._add_all(path[start:capsule_at])
            # What the guard counts, "just completed" and pending intents start after the
            # capsule (the operation that appended it consumed every intent before it).
            self._soft_failures = self._tokens_at_last_soft = 0
            self._visible_since_capsule = False
            self._intents = []
            start = capsule_at + 1
        self._add_all(path[start:])
        # A usage figure from before the latest capsule measured a different input: the
        # provider's calibration carries over through the capsule's before-figures instead
        # (SPEC §2: "minus what a compaction removed").
        if capsule_at is not None and not _usage_after(path, capsule_at, self._usage_ceiling):
            capsule = path[capsule_at]
            assert isinstance(capsule, CapsuleEntry)
            if capsule.estimated_before is not None and capsule.estimated_before != capsule.tokens_before:
                self._usage_input = capsule.tokens_before
                self._usage_offset = capsule.estimated_before
            else:
                self._usage_input = None
                self._usage_offset = 0
        self._mark(path)

    def _add_all(self, entries: Sequence[Entry]) -> None:
        """Count `entries` in, in order (a rebuild's whole region, or what a preflight finds
        appended). One loop over local variables: on a long path it runs once per entry."""
        counter = self.counter
        costs = counter.known_all([entry.id for entry in entries])  # cached counts, at once
        estimated, region, before_last = self._estimated, self._region_tokens, self._before_last_assistant
        open_calls, ceiling, visible = self._open_calls, self._usage_ceiling, self._visible_since_capsule
        usage_input, usage_offset = self._usage_input, self._usage_offset
        for entry, cost in zip(entries, costs, strict=True):
            kind = type(entry)  # entry types are final: one identity test each, no isinstance chain
            if kind is MessageEntry or kind is ToolCallEntry or kind is ToolResultEntry:
                if cost is None:
                    cost = entry_tokens(entry, counter)
                if kind is MessageEntry:
                    if cast(MessageEntry, entry).role == "assistant":
                        before_last = estimated
                elif kind is ToolCallEntry:
                    open_calls[cast(ToolCallEntry, entry).call_id] = None
                else:
                    open_calls.pop(cast(ToolResultEntry, entry).call_id, None)
                estimated += cost
                region += cost
                visible = True
            elif kind is UsageEntry:
                if _trusted(entry, ceiling):
                    # The figure measures the request that produced the preceding assistant message.
                    usage_input, usage_offset = cast(UsageEntry, entry).input_tokens, before_last
            elif kind is CheckpointEntry or kind is CompactionEntry or kind is SkillEntry:
                self._estimated = estimated
                self._add_rare(entry)
                estimated = self._estimated
        self._estimated, self._region_tokens, self._before_last_assistant = estimated, region, before_last
        self._visible_since_capsule = visible
        self._usage_input, self._usage_offset = usage_input, usage_offset

    def _add_rare(self, entry: Entry) -> None:
        """A checkpoint, compaction or skill entry (few on any path)."""
        kind = type(entry)
        if kind is CheckpointEntry:
            assert isinstance(entry, CheckpointEntry)
            if entry.intent and entry.kind in INTENT_KINDS:
                self._intents.append(entry)
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

    def _skill_tokens(self, skill: SkillEntry) -> int:
        return self.counter.cached(
            ("skill", skill.id),
            lambda: self.counter.count_text(f"{SKILLS_HEADING}## Skill: {skill.name}\n\n{skill.content}"),
        )
