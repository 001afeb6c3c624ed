"""SPEC §7: entry structs, tagged on `type`, camelCase on the wire."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

import pytest
from msgspec import ValidationError

from soba_nb.transcript.entries import (
    FORMAT_VERSION,
    CapsuleEntry,
    CheckpointEntry,
    CompactionEntry,
    Entry,
    LeafEntry,
    MessageEntry,
    NativeContinuation,
    SessionEntry,
    SkillEntry,
    ToolCallEntry,
    ToolResultEntry,
    UsageEntry,
    entry_from_dict,
    entry_from_json,
    entry_to_dict,
    entry_to_json,
    new_checkpoint_id,
    new_entry_id,
    replace,
    utc_now,
)

ONE_OF_EACH: list[Entry] = [
    SessionEntry(notebook="analysis.ipynb", model="openai/gpt-4o-mini"),
    MessageEntry(role="user", content="Load sales.csv"),
    MessageEntry(role="assistant", content="Reading it."),
    MessageEntry(role="system", content="You are soba."),
    ToolCallEntry(call_id="call_1", name="read_file", arguments='{"path": "sales.csv"}'),
    ToolResultEntry(call_id="call_1", name="read_file", content="a,b\n1,2\n", duration_ms=4),
    UsageEntry(input_tokens=1234, output_tokens=56, provider="openai", model="gpt-4o-mini"),
    CapsuleEntry(
        operation_id="op_1",
        checkpoint_id="ck_0011aabb",
        trigger="auto_threshold",
        quality="degraded",
        tokens_before=90000,
        tokens_after=21000,
        first_kept_entry_id="abcd1234",
        rolls_up="eeee0000",
        content="## Goal and constraints\n…",
    ),
    CheckpointEntry(kind="milestone", note="cleaning done", intent=True),
    LeafEntry(target_id="abcd1234"),
    SkillEntry(name="pandas", path=".soba/skills/pandas/SKILL.md", content="Use .loc"),
    CompactionEntry(
        operation_id="op_2", trigger="milestone", outcome="skipped", reason="roi", consumed=["ck_1"]
    ),
]


@pytest.mark.parametrize("entry", ONE_OF_EACH, ids=lambda entry: entry.type)
def test_round_trip_through_json(entry: Entry) -> None:
    line = entry_to_json(entry)
    assert "\n" not in line
    parsed = entry_from_json(line)
    assert type(parsed) is type(entry)
    assert parsed == entry
    assert entry_from_json(line.encode()) == entry
    assert entry_from_dict(json.loads(line)) == entry


@pytest.mark.parametrize("entry", ONE_OF_EACH, ids=lambda entry: entry.type)
def test_wire_format_is_type_first_and_camel_case(entry: Entry) -> None:
    data = json.loads(entry_to_json(entry))
    keys = list(data)
    assert keys[0] == "type"
    assert {"type", "id", "parentId", "timestamp"} <= set(keys)
    assert all(re.fullmatch(r"[a-z][a-zA-Z]*", key) for key in keys), keys
    assert entry_to_dict(entry) == data


def test_camel_case_names_from_the_spec() -> None:
    capsule = json.loads(entry_to_json(ONE_OF_EACH[7]))
    for key in (
        "checkpointId",
        "trigger",
        "quality",
        "tokensBefore",
        "tokensAfter",
        "firstKeptEntryId",
        "rollsUp",
        "operationId",
    ):
        assert key in capsule
    assert json.loads(entry_to_json(ONE_OF_EACH[4]))["callId"] == "call_1"
    assert json.loads(entry_to_json(ONE_OF_EACH[9]))["targetId"] == "abcd1234"


def test_compact_and_utf8() -> None:
    line = entry_to_json(MessageEntry(role="user", content="données ✓"))
    assert "données ✓" in line
    assert ", " not in line and '": ' not in line


def test_header_defaults() -> None:
    header = SessionEntry()
    assert header.version == FORMAT_VERSION == 1
    assert header.parent_id is None


def test_ids_are_short_random_hex() -> None:
    ids = {new_entry_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{8}", entry_id) for entry_id in ids)
    assert MessageEntry(role="user").id != MessageEntry(role="user").id


def test_checkpoint_ids() -> None:
    assert re.fullmatch(r"ck_[0-9a-f]{8,}", new_checkpoint_id())
    assert re.fullmatch(r"ck_[0-9a-f]{8,}", CheckpointEntry(kind="turn").checkpoint_id)


def test_timestamps_are_iso_8601_utc() -> None:
    stamp = utc_now()
    assert stamp.endswith("Z")
    parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert parsed.tzinfo is not None
    assert parsed.utcoffset() == timezone.utc.utcoffset(None)
    assert MessageEntry(role="user").timestamp.endswith("Z")


def test_python_names_work_in_code() -> None:
    entry = ToolResultEntry(call_id="c", name="shell", is_error=True)
    assert json.loads(entry_to_json(entry))["isError"] is True
    assert entry_from_dict({"type": "tool_result", "callId": "c", "name": "shell"}).call_id == "c"  # type: ignore[union-attr]


def test_entries_are_frozen() -> None:
    entry = MessageEntry(role="user", content="x")
    with pytest.raises(AttributeError):
        entry.content = "y"  # type: ignore[misc]


def test_unknown_fields_are_ignored() -> None:
    # A newer writer may add fields; an older reader reads the line rather than failing.
    entry = entry_from_json('{"type":"message","id":"m","role":"user","future":{"x":1}}')
    assert entry == MessageEntry(id="m", role="user", timestamp=entry.timestamp)
    assert "future" not in json.loads(entry_to_json(entry))


NATIVE_CAPSULE_LINE = (
    '{"type":"capsule","id":"c1","parentId":"m1","timestamp":"2026-02-01T10:00:00.000Z",'
    '"operationId":"op_1","checkpointId":"ck_0011aabb","trigger":"user","quality":"degraded",'
    '"tokensBefore":9000,"tokensAfter":2100,"firstKeptEntryId":"m1","content":"## Goal and constraints",'
    '"continuation":"native","native":{"provider":"openai","model":"gpt-5","kind":"openai.responses.compact",'
    '"payload":{"items":[{"type":"compaction","encrypted_content":"gAAAAB-opaque"}]},"request":"plot it"}}'
)


def test_a_capsule_carries_its_native_continuation_in_camel_case() -> None:
    entry = entry_from_json(NATIVE_CAPSULE_LINE)
    assert isinstance(entry, CapsuleEntry) and entry.continuation == "native"
    assert entry.native == NativeContinuation(
        provider="openai", model="gpt-5", kind="openai.responses.compact",
        payload={"items": [{"type": "compaction", "encrypted_content": "gAAAAB-opaque"}]}, request="plot it",
    )
    written = json.loads(entry_to_json(entry))
    assert written["native"] == json.loads(NATIVE_CAPSULE_LINE)["native"]
    assert entry_from_json(entry_to_json(entry)) == entry
    assert "gAAAAB-opaque" not in repr(entry)  # never shown, not even in a repr or a log line


def test_capsules_written_before_native_continuation_still_load() -> None:
    old = json.loads(NATIVE_CAPSULE_LINE)
    del old["native"], old["continuation"]
    entry = entry_from_json(json.dumps(old))
    assert isinstance(entry, CapsuleEntry) and entry.native is None and entry.continuation is None


def test_tool_result_keeps_its_content_whole() -> None:
    big = "x" * 200_000
    entry = entry_from_json(entry_to_json(ToolResultEntry(call_id="c", name="python", content=big)))
    assert entry.content == big  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "data",
    [
        {"type": "nope", "id": "x"},
        {"id": "x", "role": "user"},
        {"type": "message", "id": "x"},
        {"type": "message", "role": "robot"},
        {"type": "message", "role": "user", "id": ""},
        {"type": "tool_result", "name": "shell"},
        {"type": "usage"},
        {"type": "checkpoint", "kind": "whenever"},
        {"type": "leaf"},
        {
            "type": "compaction",
            "operationId": "o",
            "trigger": "user",
            "outcome": "done",
            "reason": "",
        },
        {
            "type": "capsule",
            "operationId": "o",
            "checkpointId": "ck_1",
            "trigger": "sometimes",
            "quality": "full",
            "tokensBefore": 1,
            "tokensAfter": 1,
            "firstKeptEntryId": None,
            "content": "",
        },
        {
            "type": "capsule",
            "operationId": "o",
            "checkpointId": "ck_1",
            "trigger": "user",
            "quality": "great",
            "tokensBefore": 1,
            "tokensAfter": 1,
            "firstKeptEntryId": None,
            "content": "",
        },
    ],
)
def test_invalid_entries_are_refused(data: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        entry_from_dict(data)


def test_capsule_must_say_what_it_keeps() -> None:
    # firstKeptEntryId may be null (nothing kept) but must be present.
    with pytest.raises(ValidationError, match="firstKeptEntryId"):
        entry_from_dict(
            {
                "type": "capsule",
                "operationId": "o",
                "checkpointId": "ck_1",
                "trigger": "user",
                "quality": "full",
                "tokensBefore": 1,
                "tokensAfter": 1,
                "content": "",
            }
        )


@pytest.mark.parametrize(
    "trigger",
    [
        "hard_limit",
        "auto_threshold",
        "turn_complete",
        "milestone",
        "plan_pivot",
        "user",
        "context_overflow",
    ],
)
def test_all_seven_triggers(trigger: str) -> None:
    capsule = replace(ONE_OF_EACH[7], trigger=trigger)
    assert entry_from_json(entry_to_json(capsule)).trigger == trigger  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["turn", "milestone", "plan_pivot", "user"])
def test_checkpoint_kinds(kind: str) -> None:
    assert entry_from_dict({"type": "checkpoint", "kind": kind}).kind == kind  # type: ignore[union-attr]
