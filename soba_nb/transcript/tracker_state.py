"""The budget tracker's state as a record: what `compaction.budget.BudgetTracker` knows after a
measure, and what it was measured with.

Kept in two places, both caches and never the truth: the `.budget` file beside a transcript
(`compaction.budget_state`, rewritten at every preflight) and the `budget` field of each
`turn` checkpoint in the transcript itself, so a transcript copied alone (a handoff's source,
an attachment, a backup) still opens without counting what came before its last turn. A
tracker takes a state only when it describes its own path and settings; otherwise it counts.
"""

from __future__ import annotations

import msgspec

VERSION = 1
"""Bump when what the tracker keeps changes: an older state is then not used."""


class TrackerState(msgspec.Struct, kw_only=True, frozen=True, rename="camel", gc=False):
    """What `BudgetTracker` knows after a measure, and what it was measured with."""

    version: int = VERSION
    counter: str
    """The counter's key (encoding and factor): counts from another do not add up."""
    fixed: int
    usage_ceiling: int | None
    target: tuple[str, ...] | None
    """Provider, model and the item kinds it replays, when a capsule's native item could be
    costed for it."""
    root_id: str
    seen: int
    last_id: str
    estimated: int
    before_last_assistant: int
    usage_input: int | None
    usage_offset: int
    capsule_at: int | None
    capsule_id: str | None
    skills: list[tuple[int, str]]
    """Active skills, by position on the path and id, latest activation last."""
    intents: list[tuple[int, str]]
    soft_failures: int
    tokens_at_last_soft: int
    visible_since_capsule: bool
    region_tokens: int
    region_result_tokens: int
    open_calls: list[str]
    counts: dict[str, int] = {}
    """Counts the model input needs besides the entries' (keyed as the counter keys them)."""
