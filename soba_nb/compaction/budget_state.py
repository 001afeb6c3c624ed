"""The budget tracker's state, kept beside the transcript: a resumed session measures its
path without re-reading every count.

`<session-id>.budget` holds one JSON object, replaced atomically whenever a measure moved the
tracker on (at most once per preflight): where on the path it stands (entries seen, the id
of the last one and of the first), what it was measured with (counter, fixed tokens, usage
ceiling, the provider and model requests went to), its sums and its open items (intents,
skills, calls waiting for a result, by position and id), and the counts the model input
needs besides the entries' (system prompt and tools, the capsule). A resumed tracker takes it
when all of that matches its own path and settings, then counts only what was appended
after it; the index of counts (`.tokens`) is then read only if something needs a count it
does not have (a compaction plan, a clip).

A cache, never the truth: a missing, stale, foreign or malformed file costs one rebuild from
the counts, exactly what a session without it does. It holds ids and integers; it passes
`redact_data` all the same, like every sidecar, and a state in which that would change
anything is not written at all (a redacted call id would be a wrong one).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import msgspec

from soba_nb.redact import redact_data
from soba_nb.transcript.sidecar import read_regular, replace_with

SUFFIX = ".budget"
VERSION = 1
"""Bump when what the tracker keeps changes: an older file is then not used."""
MAX_BYTES = 1 << 20
"""A bigger file is not ours: it is ignored (and replaced at the next save)."""


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


_DECODER = msgspec.json.Decoder(TrackerState)


def state_path(transcript: Path) -> Path:
    return transcript.with_suffix(SUFFIX)


class BudgetStateFile:
    """Reads and replaces the `.budget` file of one transcript (best effort both ways)."""

    def __init__(self, transcript: Path):
        self.path = state_path(transcript)
        self._saved: TrackerState | None = None
        self.failed = False
        """A save failed (a read-only folder): no more are tried this session."""

    def load(self) -> TrackerState | None:
        """The saved state, or None when there is none usable (missing, malformed, other
        version)."""
        raw = read_regular(self.path, MAX_BYTES)
        if raw is None:
            return None
        try:
            state = _DECODER.decode(raw)
        except msgspec.DecodeError:
            return None
        if state.version != VERSION:
            return None
        self._saved = state
        return state

    def save(self, state: TrackerState) -> None:
        """Replace the file with `state`, unless it already holds it."""
        if self.failed or self._saved == state:
            return
        data = msgspec.to_builtins(state)
        if redact_data(data) != data:
            # Something in it looks like a secret (a call id?): it is not written, and not
            # written redacted either (a state that differs from the tracker's is wrong).
            self._forget()
            return
        try:
            replace_with(self.path, msgspec.json.encode(data))
        except OSError:
            self.failed = True
            self._forget()
            return
        self._saved = state

    def _forget(self) -> None:
        """No stale state left to mislead a later resume (it would be checked, and then only
        cost a rebuild: this spares that)."""
        self._saved = None
        with contextlib.suppress(OSError):
            self.path.unlink()
