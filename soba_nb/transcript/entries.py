"""Transcript entries (SPEC §7): msgspec structs tagged on `type`.

Format version 1. One JSON object per line, camelCase field names. Choices the spec
leaves open, documented in docs/transcript.md:

- tool calls are their own `tool_call` entries, one per call, following the assistant
  `message` that made them; each `tool_result` names its call by `callId`;
- provider usage figures are their own `usage` entries, following the assistant message
  whose request they measure; a compaction operation's requests (`operation: compaction`)
  are recorded once it ended, after its capsule or `compaction` entry;
- a compaction operation that ends without a capsule (skipped / failed) is recorded as a
  `compaction` entry (outcome, reason, the intents it consumed), so intents are consumed
  once and the loop guard's pause holds even across a kernel restart;
- a capsule may carry the provider's own compaction (`native`: provider, model, kind and the
  opaque payload, replayed only to that provider and model) beside its portable content;
- the effective configuration is a `config` entry (at the start and after each change);
- a `turn` checkpoint carries the budget tracker's state (`budget`: ids and integers), so the
  file copied alone opens without counting what came before its last turn;
- settings the user changes for the session (`%auto_compact off`) are `setting` entries, and
  what the session learned of the model's real window (from the server, an overflow error,
  a silently truncated prompt) is a `window` entry: both are read back on resume, from any
  branch of the file (they are facts about the session, not steps of the conversation).

Why msgspec, not pydantic: a resumed session decodes every line of its file, and msgspec
decodes and validates a line into a struct faster than `orjson.loads` makes a dict of it
(benchmarks/run.py); its structs are small (no per-instance dict) and, holding no references
back to other entries, are left out of the cyclic garbage collector (`gc=False`), so a
100k-entry session does not make every later collection slower. Constructing a struct in
Python does not validate it: `Transcript.append` does, by decoding the line it is about to
write, so what is in memory is exactly what is on disk. Unknown fields in a file (a later
format) are ignored.

No `from __future__ import annotations` here: the decoder built at import reads every field's
type, and annotations kept as text would each be compiled and evaluated first (2 ms of every
`soba-nb` command); a type is defined before the entry that uses it.
"""

import json
import os
from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType, field

from soba_nb.transcript import parts
from soba_nb.transcript.parts import NonEmpty

# Re-exported: entries are built and read with them.
Artifact = parts.Artifact
CellRecord = parts.CellRecord
CellSource = parts.CellSource
FileChange = parts.FileChange
RestoredFile = parts.RestoredFile

FORMAT_VERSION = 1
ENTRY_ID_BYTES = 4
CHECKPOINT_PREFIX = "ck_"
CHECKPOINT_ID_BYTES = 4
FIRST_KEYS = ("type", "id", "parentId", "timestamp")
"""Keys every line starts with, in this order (the rest follow in field order)."""

Role = Literal["user", "assistant", "system"]
CheckpointKind = Literal["turn", "milestone", "plan_pivot", "user"]
TriggerName = Literal[
    "hard_limit",
    "auto_threshold",
    "turn_complete",
    "milestone",
    "plan_pivot",
    "user",
    "context_overflow",
]
Quality = Literal["full", "degraded"]
Continuation = Literal["native", "portable", "fallback"]
Count = Annotated[int, Meta(ge=0)]
"""A count (of tokens, or a position on the path): a line with a negative token figure is a bad
entry (it would hide the session's size from its budget, and its cost from the cap)."""


def new_entry_id() -> str:
    """A short random hex id (8 characters): `os.urandom`, as `secrets.token_hex` reads it
    (importing `secrets` brings hmac and base64 into every command that only reads)."""
    return os.urandom(ENTRY_ID_BYTES).hex()


def new_checkpoint_id() -> str:
    """`ck_` + 8 hex characters."""
    return CHECKPOINT_PREFIX + os.urandom(CHECKPOINT_ID_BYTES).hex()


def utc_now() -> str:
    """ISO-8601 UTC timestamp with milliseconds and a `Z`."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Entry(Struct, kw_only=True, frozen=True, rename="camel", tag_field="type", gc=False):
    type: ClassVar[str]
    """The entry's tag (`"message"`, …), as on disk."""

    id: NonEmpty = field(default_factory=new_entry_id)
    """Unique in the file."""
    parent_id: str | None = None
    """The entry this one hangs from; null for the first entry."""
    timestamp: str = field(default_factory=utc_now)
    """ISO-8601 UTC."""
    follows_torn_line: bool | UnsetType = UNSET
    """`followsTornLine`: set by the store on the first entry appended after lines a crash
    cut short; absent otherwise."""


class SessionEntry(_Entry, tag="session", kw_only=True, frozen=True):
    """The header: first line of every transcript."""

    type: ClassVar[str] = "session"
    version: int = FORMAT_VERSION
    created: str = field(default_factory=utc_now)
    notebook: str | None = None
    """Path of the notebook the session belongs to, when known."""
    model: str | None = None
    """`provider/name` of the model at creation."""


class EditDecision(Struct, kw_only=True, frozen=True, rename="camel", gc=False):
    """The user's decision on a cell edit the agent proposed (SPEC §18): `call`, the id of the
    `edit_cell` call that proposed it; `executionCount`, the cell `In [n]` it would change."""

    call: NonEmpty
    execution_count: Count
    decision: Literal["accepted", "rejected"]


class MessageEntry(_Entry, tag="message", kw_only=True, frozen=True):
    """A user, assistant or system message."""

    type: ClassVar[str] = "message"
    role: Role
    content: str = ""
    typed: str | None = None
    """On a user message soba expanded (a slash command such as `/fix`): what the user typed,
    as they typed it. Capsules quote this, never the expansion (SPEC §14)."""
    steer: bool | UnsetType = UNSET
    """`true` on a user message sent into a running turn from the sidebar (SPEC §18): part of
    the request being worked on, not a new one. Absent otherwise."""
    edit: EditDecision | UnsetType = UNSET
    """On the user message telling the model what became of a proposed cell edit. Absent otherwise."""


class ToolCallEntry(_Entry, tag="tool_call", kw_only=True, frozen=True):
    """One tool call made by the preceding assistant message."""

    type: ClassVar[str] = "tool_call"
    call_id: str
    name: str
    arguments: str = "{}"
    """JSON text of the arguments, as the model produced it."""


class ToolResultEntry(_Entry, tag="tool_result", kw_only=True, frozen=True):
    """The result of one tool call, whole (clipping happens only in model input)."""

    type: ClassVar[str] = "tool_result"
    call_id: str
    name: str
    content: str = ""
    is_error: bool = False
    duration_ms: int | None = None
    artifacts: list[Artifact] | UnsetType = UNSET
    """The images the call displayed (a `python` call's plots), in order; absent when none."""
    files: list[FileChange] | UnsetType = UNSET
    """The file the call wrote or edited (`write_file`, `edit_file`); absent when none."""


ApprovalDecision = Literal["approved", "declined", "approved_all", "no_input"]
ApprovalMode = Literal["never", "edits", "all"]


class ApprovalEntry(_Entry, tag="approval", kw_only=True, frozen=True):
    """The user's answer before a tool call ran (SPEC §11), between the call and its result."""

    type: ClassVar[str] = "approval"
    call_id: str
    decision: ApprovalDecision
    mode: ApprovalMode
    """The approval mode the call was asked under (`agent.approval` or `--approve`)."""


class RestoreEntry(_Entry, tag="restore", kw_only=True, frozen=True):
    """`%rewind TARGET --files`: the files put back as they were at the target (SPEC §11)."""

    type: ClassVar[str] = "restore"
    target_id: str
    files: list[RestoredFile] = field(default_factory=list)


class CellsEntry(_Entry, tag="cells", kw_only=True, frozen=True):
    """The cells the user ran since the previous turn, ahead of the request (SPEC §10)."""

    type: ClassVar[str] = "cells"
    cells: list[CellRecord] = field(default_factory=list)
    """Newest last."""
    omitted: int = 0
    """Cells run since the previous turn but left out to fit `notebook.contextTokens`."""


class CellSourcesEntry(_Entry, tag="cell_sources", kw_only=True, frozen=True):
    """Every cell the user ran since the previous record, whole (at a session's first turn in
    a kernel: every cell that kernel ran). The model never reads it: the `cells` entry is its
    view, clipped to a budget; this is the notebook's code, for `/code` and `/rebuild`."""

    type: ClassVar[str] = "cell_sources"
    cells: list[CellSource] = field(default_factory=list)
    """In the order they ran."""
    new_kernel: bool | UnsetType = UNSET
    """`newKernel`: `true` on the session's first record in a kernel process (absent otherwise):
    the cells from here ran in another kernel than those before (a restart, a resume)."""
    rerun: bool | UnsetType = UNSET
    """`true` on the record of cells `/rebuild` ran again (absent otherwise): `/code` leaves
    them out, as it leaves out the agent's re-run calls — their code is already there once."""


UsageOperation = Literal["inference", "compaction"]


class UsageEntry(_Entry, tag="usage", kw_only=True, frozen=True):
    """Usage figures the provider reported for one request."""

    type: ClassVar[str] = "usage"
    input_tokens: Count
    output_tokens: Count = 0
    provider: str | None = None
    model: str | None = None
    operation_id: str | None = None
    sent_tokens: Count | None = None
    """Our own count of the request this figure measures."""
    sent_image_tokens: Count | UnsetType = UNSET
    """`sentImageTokens`: the part of `sentTokens` that is our estimate of the images the request
    carried (the server counts images by its own rule, or not at all: the evidence about its
    counting compares the rest, SPEC §17); absent when it carried none."""
    truncated: bool = False
    """The server counted far fewer input tokens than were sent: it cut the prompt silently
    (Ollama does when its num_ctx is smaller). Not used to measure the budget."""
    cached_input_tokens: Count | UnsetType = UNSET
    """`cachedInputTokens`: the part of `inputTokens` the provider read from its prompt cache
    (priced at `cachedInputPerMTok`); absent when it did not say."""
    operation: UsageOperation = "inference"
    """What the request was: `inference` (its input is the path: the budget's figure) or
    `compaction` (a summary or native compaction request: priced, never a budget figure).
    Absent in files written before it was recorded: those are inference."""
    estimated: bool | UnsetType = UNSET
    """`estimated: true`: the server sent no usage for this request, so these are soba's own
    counts of what was sent and received (priced, marked estimated; never a budget figure or
    evidence about the server's counting). Absent for the server's own figures."""


class NativeContinuation(Struct, kw_only=True, frozen=True, rename="camel", gc=False):
    """Provider-side compaction state (SPEC §5 item 2), kept beside the portable capsule.

    Replayed only to the provider and model that produced it; any other model gets the
    portable capsule. The payload is the provider's own item, opaque (OpenAI's is encrypted):
    it is never shown (not in `repr`, `%capsule show`, `%budget`, `inspect`, flight records)
    and never exported.
    """

    provider: str
    """Provider kind that produced it (`ModelSettings.provider`, e.g. "openai", "anthropic")."""
    model: str
    """The model name it was produced for (`ModelSettings.name`)."""
    kind: str
    """What the payload is, e.g. "openai.responses.compact" or "anthropic.compact_20260112"."""
    payload: dict[str, Any]
    """The provider's item(s), exactly as returned (replayed verbatim)."""
    request: str | None = None
    """The request being worked on, when the kept tail does not carry it: sent verbatim right
    after the native item (SPEC §5; the provider's summary may paraphrase it)."""

    def __repr__(self) -> str:  # the payload is never shown
        return f"NativeContinuation(provider={self.provider!r}, model={self.model!r}, kind={self.kind!r})"


class CapsuleEntry(_Entry, tag="capsule", kw_only=True, frozen=True):
    """A committed Context Capsule (SPEC §4): replaces the path before `firstKeptEntryId`."""

    type: ClassVar[str] = "capsule"
    operation_id: str
    checkpoint_id: str
    trigger: TriggerName
    quality: Quality
    tokens_before: Count
    """Effective tokens before (as measured: provider usage when there was a figure)."""
    tokens_after: Count
    """Tokens of the continuation, measured locally and exactly."""
    estimated_before: Count | None = None
    """The local estimate before; with `tokensBefore` it carries the provider's calibration
    across the compaction (effective = tokensBefore - estimatedBefore + local count now)."""
    first_kept_entry_id: str | None
    """First entry carried in full after the capsule; null when nothing is kept."""
    rolls_up: str | None = None
    """Id of the previous capsule entry folded into this one."""
    model: str | None = None
    provider: str | None = None
    content: str
    """The capsule rendered as Markdown with the section headings of SPEC §4."""
    source: str | None = None
    """For loaded capsules: where it came from (a `.capsule.md` path)."""
    title: str | None = None
    native: NativeContinuation | None = None
    """The provider's own compaction of the same history, when it made one (used instead of
    `content` while the provider and model match)."""
    continuation: Continuation | None = None
    """Which continuation the operation produced when the provider offered native compaction:
    `native`, `portable` (the model capsule) or `fallback` (the deterministic capsule); null
    when it did not (older entries, other providers)."""
    amends: str | None = None
    """The checkpoint id of the capsule this one corrects (`%%capsule amend`, SPEC §14): it
    replaces that capsule in model input from here on; null for a capsule a compaction or a
    load made."""
    author: str | None = None
    """Who wrote an amended capsule, `user@host` (as `.capsule.md` files say it, SPEC §13);
    null for a capsule soba made."""


class CheckpointEntry(_Entry, tag="checkpoint", kw_only=True, frozen=True):
    """A named point on the path. Soft-trigger kinds also record a pending intent."""

    type: ClassVar[str] = "checkpoint"
    checkpoint_id: str = field(default_factory=new_checkpoint_id)
    kind: CheckpointKind
    note: str = ""
    intent: bool = False
    """True when this checkpoint asks for a compaction at the next preflight."""
    budget: Any = UNSET
    """On a `turn` checkpoint: the budget tracker's state as of the entry before it, so the
    transcript opened alone (no `.budget` beside it) need not count what came before. A cache,
    read by `compaction.budget_state`: used only when it is a state of its version that
    describes the path it is read on and the counter reading it; any other JSON value here
    is ignored, never a bad line (a later soba-nb may record another shape)."""


class LeafEntry(_Entry, tag="leaf", kw_only=True, frozen=True):
    """Rewind: the next entry hangs from `targetId`."""

    type: ClassVar[str] = "leaf"
    target_id: str


class SkillEntry(_Entry, tag="skill", kw_only=True, frozen=True):
    """A skill was activated; its instructions are re-sent after every compaction."""

    type: ClassVar[str] = "skill"
    name: str
    path: str
    content: str


class CompactionEntry(_Entry, tag="compaction", kw_only=True, frozen=True):
    """A compaction that ended without a capsule (skipped / failed) after consuming intents."""

    type: ClassVar[str] = "compaction"
    operation_id: str
    trigger: TriggerName
    outcome: Literal["skipped", "failed"]
    reason: str
    consumed: list[str] = field(default_factory=list)
    """Checkpoint ids of the intents this operation consumed."""
    tokens_before: Count | None = None
    """Effective tokens when the operation ran; absent when intents were consumed without
    an operation (their gates failed). The loop guard counts soft operations with it."""


SettingKey = Literal["compaction.auto"]


class SettingEntry(_Entry, tag="setting", kw_only=True, frozen=True):
    """A setting the user changed for this session (`%auto_compact off`); read on resume."""

    type: ClassVar[str] = "setting"
    key: SettingKey
    value: bool


class ConfigEntry(_Entry, tag="config", kw_only=True, frozen=True):
    """The effective configuration the session runs with (SPEC §3 keys), recorded when the
    session starts and whenever it changes, so every view — `%budget`, the monitor,
    `soba-nb budget`, the demo — computes from the same settings the session used."""

    type: ClassVar[str] = "config"
    config: dict[str, Any]
    """`SobaConfig.to_json()`: camelCase sections `model` and `compaction`."""
    explicit: dict[str, str] = field(default_factory=dict)
    """Which keys a user layer set (`model.contextWindow` → the file that set it)."""
    environment: str | None = None
    """The environment line the system prompt ends with (SPEC §15: the notebook, Python, the
    data libraries' versions, the date), so a view of the session counts the prompt it sent."""


WindowSource = Literal["server", "overflow", "truncation"]


class WindowEntry(_Entry, tag="window", kw_only=True, frozen=True):
    """The model's real context window as the session learned it; a resumed session keeps it.

    `server`: the server said so when asked (llama.cpp `/props`, Ollama `/api/show`, vLLM
    `/v1/models`); `overflow`: an overflow error stated the limit; `truncation`: the server
    silently cut a prompt to this many tokens.
    """

    type: ClassVar[str] = "window"
    context_window: Annotated[int, Meta(gt=0)]
    source: WindowSource
    detail: str = ""
    """Where exactly the figure came from, one line (no secrets, no message text)."""
    model: str
    """`provider/name` of the model the figure applies to."""


Entry = (
    SessionEntry
    | MessageEntry
    | ToolCallEntry
    | ToolResultEntry
    | CellsEntry
    | CellSourcesEntry
    | ApprovalEntry
    | RestoreEntry
    | UsageEntry
    | CapsuleEntry
    | CheckpointEntry
    | LeafEntry
    | SkillEntry
    | CompactionEntry
    | SettingEntry
    | WindowEntry
    | ConfigEntry
)

NESTED_TOO_DEEPLY = "nested too deeply"
EntryError = msgspec.ValidationError
"""Raised for data that is JSON but not a valid entry (the message names the field)."""

_DECODER: msgspec.json.Decoder[Entry] = msgspec.json.Decoder(Entry)


def entry_from_json(data: str | bytes) -> Entry:
    """Parse and validate one JSON line into an entry.

    Raises `EntryError` (`msgspec.ValidationError`) for JSON that is not a valid entry and
    `msgspec.DecodeError` for text that is not JSON at all. JSON that msgspec alone refuses but
    the JSON standard allows (a lone surrogate escape such as `"\\ud800"`) is read through
    `json` instead.
    """
    try:
        return _DECODER.decode(data)
    except EntryError:
        raise
    except RecursionError:
        raise EntryError(NESTED_TOO_DEEPLY) from None
    except msgspec.DecodeError:
        try:
            loaded = json.loads(data)
        except RecursionError:
            raise EntryError(NESTED_TOO_DEEPLY) from None
        except ValueError:
            raise msgspec.DecodeError("not valid JSON") from None
        return entry_from_dict(loaded)


def decode_lines(data: bytes | memoryview) -> list[Entry]:
    """Every line of newline-delimited JSON, each validated into an entry, in one call.

    Raises `msgspec.DecodeError` at the first line that is not a valid entry (without saying
    which: callers read line by line then, with `entry_from_json`, to name it).
    """
    return _DECODER.decode_lines(data)


def entry_from_dict(data: Any) -> Entry:
    """Validate JSON-ready data (camelCase keys, as on disk) into an entry (raises `EntryError`)."""
    try:
        entry: Entry = msgspec.convert(data, Entry)
    except RecursionError:
        raise EntryError(NESTED_TOO_DEEPLY) from None
    return entry


def entry_to_dict(entry: Entry) -> dict[str, Any]:
    """The entry as JSON-ready data, camelCase, in the on-disk key order (`type`, `id`,
    `parentId`, `timestamp`, then the entry's own fields)."""
    data: dict[str, Any] = msgspec.to_builtins(entry)
    ordered = {key: data.pop(key) for key in FIRST_KEYS}
    ordered.update(data)
    return ordered


def entry_to_json(entry: Entry) -> str:
    """One line of JSON exactly as the store writes it (compact, `type` first), without the
    trailing newline."""
    return json.dumps(entry_to_dict(entry), ensure_ascii=False, separators=(",", ":"))


def replace(entry: Entry, **changes: Any) -> Entry:
    """A copy of `entry` with some fields changed (Python names). Not validated: the store
    validates what it writes."""
    changed: Entry = msgspec.structs.replace(entry, **changes)
    return changed
