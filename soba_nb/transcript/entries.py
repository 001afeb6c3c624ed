"""Transcript entries (SPEC §7): pydantic models discriminated on `type`.

Format version 1. One JSON object per line, camelCase field names. Choices the spec
leaves open, documented in the README:

- tool calls are their own `tool_call` entries, one per call, following the assistant
  `message` that made them; each `tool_result` names its call by `callId`;
- provider usage figures are their own `usage` entries, following the assistant message
  whose request they measure;
- a compaction operation that ends without a capsule (skipped / failed) is recorded as a
  `compaction` entry (outcome, reason, the intents it consumed), so intents are consumed
  once and the loop guard's pause holds even across a kernel restart;
- a capsule may carry the provider's own compaction (`native`: provider, model, kind and the
  opaque payload, replayed only to that provider and model) beside its portable content;
- the effective configuration is a `config` entry (at the start and after each change);
- settings the user changes for the session (`%auto_compact off`) are `setting` entries, and
  what the session learned of the model's real window (from the server, an overflow error,
  a silently truncated prompt) is a `window` entry: both are read back on resume, from any
  branch of the file (they are facts about the session, not steps of the conversation).
"""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.alias_generators import to_camel

FORMAT_VERSION = 1
ENTRY_ID_BYTES = 4
CHECKPOINT_PREFIX = "ck_"
CHECKPOINT_ID_BYTES = 4

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


def new_entry_id() -> str:
    """A short random hex id (8 characters)."""
    return secrets.token_hex(ENTRY_ID_BYTES)


def new_checkpoint_id() -> str:
    """`ck_` + 8 hex characters."""
    return CHECKPOINT_PREFIX + secrets.token_hex(CHECKPOINT_ID_BYTES)


def utc_now() -> str:
    """ISO-8601 UTC timestamp with milliseconds and a `Z`."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Entry(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
        frozen=True,
    )

    id: str = Field(default_factory=new_entry_id, min_length=1)
    """Unique in the file."""
    parent_id: str | None = None
    """The entry this one hangs from; null for the first entry."""
    timestamp: str = Field(default_factory=utc_now)
    """ISO-8601 UTC."""


class SessionEntry(_Entry):
    """The header: first line of every transcript."""

    type: Literal["session"] = "session"
    version: int = FORMAT_VERSION
    created: str = Field(default_factory=utc_now)
    notebook: str | None = None
    """Path of the notebook the session belongs to, when known."""
    model: str | None = None
    """`provider/name` of the model at creation."""


class MessageEntry(_Entry):
    """A user, assistant or system message."""

    type: Literal["message"] = "message"
    role: Role
    content: str = ""


class ToolCallEntry(_Entry):
    """One tool call made by the preceding assistant message."""

    type: Literal["tool_call"] = "tool_call"
    call_id: str
    name: str
    arguments: str = "{}"
    """JSON text of the arguments, as the model produced it."""


class ToolResultEntry(_Entry):
    """The result of one tool call, whole (clipping happens only in model input)."""

    type: Literal["tool_result"] = "tool_result"
    call_id: str
    name: str
    content: str = ""
    is_error: bool = False
    duration_ms: int | None = None


class UsageEntry(_Entry):
    """Usage figures the provider reported for one request."""

    type: Literal["usage"] = "usage"
    input_tokens: int
    output_tokens: int = 0
    provider: str | None = None
    model: str | None = None
    operation_id: str | None = None
    sent_tokens: int | None = None
    """Our own count of the request this figure measures."""
    truncated: bool = False
    """The server counted far fewer input tokens than were sent: it cut the prompt silently
    (Ollama does when its num_ctx is smaller). Not used to measure the budget."""


class NativeContinuation(BaseModel):
    """Provider-side compaction state (SPEC §5 item 2), kept beside the portable capsule.

    Replayed only to the provider and model that produced it; any other model gets the
    portable capsule. The payload is the provider's own item, opaque (OpenAI's is encrypted):
    it is never shown (not in `repr`, `%capsule show`, `%budget`, `inspect`, flight records)
    and never exported.
    """

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True)

    provider: str
    """Provider kind that produced it (`ModelSettings.provider`, e.g. "openai", "anthropic")."""
    model: str
    """The model name it was produced for (`ModelSettings.name`)."""
    kind: str
    """What the payload is, e.g. "openai.responses.compact" or "anthropic.compact_20260112"."""
    payload: dict[str, Any] = Field(repr=False)
    """The provider's item(s), exactly as returned (replayed verbatim)."""
    request: str | None = None
    """The request being worked on, when the kept tail does not carry it: sent verbatim right
    after the native item (SPEC §5; the provider's summary may paraphrase it)."""


class CapsuleEntry(_Entry):
    """A committed Context Capsule (SPEC §4): replaces the path before `firstKeptEntryId`."""

    type: Literal["capsule"] = "capsule"
    operation_id: str
    checkpoint_id: str
    trigger: TriggerName
    quality: Quality
    tokens_before: int
    """Effective tokens before (as measured: provider usage when there was a figure)."""
    tokens_after: int
    """Tokens of the continuation, measured locally and exactly."""
    estimated_before: int | None = None
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


class CheckpointEntry(_Entry):
    """A named point on the path. Soft-trigger kinds also record a pending intent."""

    type: Literal["checkpoint"] = "checkpoint"
    checkpoint_id: str = Field(default_factory=new_checkpoint_id)
    kind: CheckpointKind
    note: str = ""
    intent: bool = False
    """True when this checkpoint asks for a compaction at the next preflight."""


class LeafEntry(_Entry):
    """Rewind: the next entry hangs from `targetId`."""

    type: Literal["leaf"] = "leaf"
    target_id: str


class SkillEntry(_Entry):
    """A skill was activated; its instructions are re-sent after every compaction."""

    type: Literal["skill"] = "skill"
    name: str
    path: str
    content: str


class CompactionEntry(_Entry):
    """A compaction that ended without a capsule (skipped / failed) after consuming intents."""

    type: Literal["compaction"] = "compaction"
    operation_id: str
    trigger: TriggerName
    outcome: Literal["skipped", "failed"]
    reason: str
    consumed: list[str] = Field(default_factory=list)
    """Checkpoint ids of the intents this operation consumed."""
    tokens_before: int | None = None
    """Effective tokens when the operation ran; absent when intents were consumed without
    an operation (their gates failed). The loop guard counts soft operations with it."""


SettingKey = Literal["compaction.auto"]


class SettingEntry(_Entry):
    """A setting the user changed for this session (`%auto_compact off`); read on resume."""

    type: Literal["setting"] = "setting"
    key: SettingKey
    value: bool


class ConfigEntry(_Entry):
    """The effective configuration the session runs with (SPEC §3 keys), recorded when the
    session starts and whenever it changes, so every view — `%budget`, the monitor,
    `soba-nb budget`, the demo — computes from the same settings the session used."""

    type: Literal["config"] = "config"
    config: dict[str, Any]
    """`SobaConfig.to_json()`: camelCase sections `model` and `compaction`."""
    explicit: dict[str, str] = Field(default_factory=dict)
    """Which keys a user layer set (`model.contextWindow` → the file that set it)."""


WindowSource = Literal["server", "overflow", "truncation"]


class WindowEntry(_Entry):
    """The model's real context window as the session learned it; a resumed session keeps it.

    `server`: the server said so when asked (llama.cpp `/props`, Ollama `/api/show`, vLLM
    `/v1/models`); `overflow`: an overflow error stated the limit; `truncation`: the server
    silently cut a prompt to this many tokens.
    """

    type: Literal["window"] = "window"
    context_window: int = Field(gt=0)
    source: WindowSource
    detail: str = ""
    """Where exactly the figure came from, one line (no secrets, no message text)."""
    model: str
    """`provider/name` of the model the figure applies to."""


Entry = Annotated[
    SessionEntry
    | MessageEntry
    | ToolCallEntry
    | ToolResultEntry
    | UsageEntry
    | CapsuleEntry
    | CheckpointEntry
    | LeafEntry
    | SkillEntry
    | CompactionEntry
    | SettingEntry
    | WindowEntry
    | ConfigEntry,
    Field(discriminator="type"),
]

ENTRY_ADAPTER: TypeAdapter[Entry] = TypeAdapter(Entry)


def entry_from_json(data: str | bytes) -> Entry:
    """Parse one JSON line into an entry (raises `pydantic.ValidationError`)."""
    return ENTRY_ADAPTER.validate_json(data)


def entry_from_dict(data: dict[str, Any]) -> Entry:
    return ENTRY_ADAPTER.validate_python(data)


def entry_to_dict(entry: Entry) -> dict[str, Any]:
    """The entry as JSON-ready data, camelCase, with `type` first (the on-disk key order)."""
    dumped = entry.model_dump(by_alias=True, mode="json")
    return {"type": dumped.pop("type"), **dumped}


def entry_to_json(entry: Entry) -> str:
    """One line of JSON exactly as the store writes it (compact, `type` first), without the
    trailing newline."""
    return json.dumps(entry_to_dict(entry), ensure_ascii=False, separators=(",", ":"))
