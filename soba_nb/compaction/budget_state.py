"""The budget tracker's state, kept beside the transcript: a resumed session measures its
path without re-reading every count.

`<session-id>.budget` holds one JSON object (after its checksum), rewritten whenever a measure
moved the tracker on (at most once per preflight): where on the path it stands (entries seen, the id
of the last one and of the first), what it was measured with (counter, fixed tokens, usage
ceiling, the provider and model requests went to), its sums and its open items (intents,
skills, calls waiting for a result, by position and id), and the counts the model input
needs besides the entries' (system prompt and tools, the capsule). A resumed tracker takes it
when all of that matches its own path and settings, then counts only what was appended
after it; the index of counts (`.tokens`) is then read only if something needs a count it
does not have (a compaction plan, a clip).

A cache, never the truth: a missing, stale, foreign or malformed file costs one rebuild from
the counts, exactly what a session without it does. It holds ids and integers; its texts pass
redaction all the same, like every sidecar, and a state in which that would change anything
is not written at all (a redacted call id would be a wrong one).

The same state goes into the transcript itself, as the `budget` of each `turn` checkpoint, so a
transcript copied alone (a handoff's source, an attachment, a backup) opens from its last
finished turn without counting what came before: `recorded_state` finds it, under the same
checks, and a state this version cannot read is ignored there too.
"""

from __future__ import annotations

import contextlib
import os
import stat
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import msgspec
from msgspec import UNSET, UnsetType

from soba_nb.layout import SessionLayout
from soba_nb.redact import redact
from soba_nb.transcript.entries import CapsuleEntry, CheckpointEntry, Count, Entry, entry_from_json
from soba_nb.transcript.sidecar import read_regular, read_tail

if TYPE_CHECKING:
    from soba_nb.tokens import TokenCounter

VERSION = 1
"""Bump when what the tracker keeps changes: an older state is then not used."""
MAX_BYTES = 1 << 20
"""A bigger file is not ours: it is ignored (and replaced at the next save)."""
TAIL_BYTES = 16 * 1024
"""`has_saved_state` reads at most this much of a transcript's end."""


class TrackerState(msgspec.Struct, kw_only=True, frozen=True, rename="camel", gc=False):
    """What `BudgetTracker` knows after a measure, and what it was measured with. Every figure
    and position is a `Count`: a state with a negative one is not read (it would put the
    session under any limit)."""

    version: int = VERSION
    counter: str
    """The counter's key (encoding and factor): counts from another do not add up."""
    fixed: Count
    usage_ceiling: Count | None
    target: tuple[str, ...] | None
    """Provider, model and the item kinds it replays, when a capsule's native item could be
    costed for it."""
    root_id: str
    seen: Count
    last_id: str
    estimated: Count
    before_last_assistant: Count
    usage_input: Count | None
    usage_offset: Count
    capsule_at: Count | None
    capsule_id: str | None
    skills: list[tuple[Count, str]]
    """Active skills, by position on the path and id, latest activation last."""
    intents: list[tuple[Count, str]]
    soft_failures: Count
    tokens_at_last_soft: Count
    visible_since_capsule: bool
    region_tokens: Count
    region_result_tokens: Count
    open_calls: list[str]
    counts: dict[str, Count] = {}
    """Counts the model input needs besides the entries' (keyed as the counter keys them)."""


_DECODER = msgspec.json.Decoder(TrackerState)


def state_path(transcript: Path) -> Path:
    return SessionLayout(transcript).budget


class BudgetStateFile:
    """Reads and rewrites the `.budget` file of one transcript (best effort both ways).

    The file is one line, `<crc32 of the JSON, 8 hex digits> <JSON>`, rewritten in place (a
    save is part of every preflight: no temporary file and rename each time). A write a crash
    cut short fails its checksum, and a longer old state left behind a shorter new one lies
    after the new line's end: either way a load never takes a mix of two states.
    """

    def __init__(self, transcript: Path):
        self.path = state_path(transcript)
        self._saved: TrackerState | None = None
        self.failed = False
        """A save failed (a read-only folder): no more are tried this session."""

    def load(self) -> TrackerState | None:
        """The saved state, or None when there is none usable (missing, torn, malformed, other
        version)."""
        raw = read_regular(self.path, MAX_BYTES)
        if raw is None:
            return None
        check, _, body = raw.partition(b"\n")[0].partition(b" ")
        if check != _checksum(body):
            return None
        try:
            state = _DECODER.decode(body)
        except msgspec.DecodeError:
            return None
        if state.version != VERSION:
            return None
        self._saved = state
        return state

    def save(self, state: TrackerState) -> None:
        """Write `state`, unless the file already holds it."""
        if self.failed or self._saved == state:
            return
        if not may_be_written(state):
            # Something in it looks like a secret (a call id?): it is not written, and not
            # written redacted either (a state that differs from the tracker's is wrong).
            self._forget()
            return
        body = msgspec.json.encode(state)
        line = _checksum(body) + b" " + body + b"\n"
        try:
            self._write(line)
        except OSError:
            self.failed = True
            self._forget()
            return
        self._saved = state

    def _write(self, line: bytes) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError:  # a symlink or a FIFO in its place: replaced by a file of our own
            self.path.unlink()
            fd = os.open(self.path, flags, 0o600)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{self.path} is not a regular file")
            if os.pwrite(fd, line, 0) != len(line):
                raise OSError(f"{self.path}: short write")
            os.ftruncate(fd, len(line))
        finally:
            os.close(fd)

    def _forget(self) -> None:
        """No stale state left to mislead a later resume (it would be checked, and then only
        cost a rebuild: this spares that)."""
        self._saved = None
        with contextlib.suppress(OSError):
            self.path.unlink()


def states_to_offer(file: BudgetStateFile, path: Sequence[Entry], counter: TokenCounter) -> tuple[TrackerState, ...]:
    """Where a tracker of `path` may start from, best first: the state beside the transcript,
    then the one its last turn recorded in it (a transcript copied alone). Their counts for
    `counter` are primed into it (what the model input needs besides the entries' counts)."""
    states = tuple(state for state in (file.load(), recorded_state(path)) if state is not None)
    for state in states:
        if state.counter == counter.key:
            counter.prime(state.counts)
    return states


def has_saved_state(transcript: Path) -> bool:
    """Whether a tracker of `transcript` will likely start from a saved state rather than
    count: the `.budget` file is beside it, or its last line is a checkpoint carrying one (a
    finished turn). A guess made before the file is read (is its tokenizer worth loading
    first?), from its last `TAIL_BYTES` at most; it is checked when the file is read."""
    if state_path(transcript).exists():
        return True
    read = read_tail(transcript, TAIL_BYTES)  # no link followed, no FIFO waited on
    if read is None:
        return False
    tail, size = read
    lines = tail.rstrip(b"\n").rsplit(b"\n", 1)
    try:
        last = entry_from_json(lines[-1]) if len(lines) == 2 or size <= TAIL_BYTES else None
    except msgspec.DecodeError:
        return False
    return isinstance(last, CheckpointEntry) and readable_state(last.budget) is not None


def tail_is_plain(transcript: Path) -> bool:
    """Whether the last `TAIL_BYTES` of `transcript` are plain text (`soba_nb.plain_counts`): a
    tracker that opens it without a saved state counts what came after its last usage figure,
    then likely plain text too, which the encoding's plain tokens count (`TokenCounter.load`).
    A guess (JSON may escape other characters): the counts are the same either way."""
    read = read_tail(transcript, TAIL_BYTES)
    if read is None:
        return False
    if read[0].isascii():
        return True
    from soba_nb.plain_counts import is_plain

    return is_plain(read[0].decode("utf-8", "ignore"))  # (a character cut at the start is ignored)


def recorded_state(path: Sequence[Entry]) -> TrackerState | None:
    """The newest state a `turn` checkpoint of `path` carries that this version reads, looked
    for back to the latest capsule (a state from before it would not be taken), or None."""
    for entry in reversed(path):
        kind = type(entry)
        if kind is CheckpointEntry:
            state = readable_state(cast(CheckpointEntry, entry).budget)
            if state is not None:
                return state
        elif kind is CapsuleEntry:
            return None
    return None


def readable_state(recorded: object) -> TrackerState | None:
    """A checkpoint's `budget` as a state of this version, or None: a cache, so a state of
    another version or shape (a later soba-nb's, a hand edit) is not used, never an error."""
    if not isinstance(recorded, dict):
        return None
    try:
        state = msgspec.convert(recorded, TrackerState)
    except msgspec.ValidationError:
        return None
    return state if state.version == VERSION else None


def recordable(state: TrackerState | None) -> dict[str, Any] | UnsetType:
    """`state` as a checkpoint's `budget` (JSON-ready), or UNSET (the field left out) when
    there is none or it may not be written."""
    if state is None or not may_be_written(state):
        return UNSET
    return cast(dict[str, Any], msgspec.to_builtins(state))


def may_be_written(state: TrackerState) -> bool:
    """False when redaction would change any text the state holds (its ids and keys; the
    rest are numbers and our own field names), checked in one pass over them all: such a
    state is written nowhere, not even redacted (a redacted call id would be a wrong one)."""
    texts = [state.counter, state.root_id, state.last_id, state.capsule_id or "", *(state.target or ())]
    texts += [entry_id for _, entry_id in (*state.skills, *state.intents)]
    texts += [*state.open_calls, *state.counts]
    joined = "\n".join(texts)
    return redact(joined) == joined


def _checksum(body: bytes) -> bytes:
    return b"%08x" % zlib.crc32(body)
