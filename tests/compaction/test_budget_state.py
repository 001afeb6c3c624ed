"""The budget tracker's state saved beside the transcript (`.budget`): a resumed session that
starts from it measures and assembles exactly what one that rebuilds from every count does,
reads no count it does not need, and a state that no longer describes the path or the
settings is never used."""

from __future__ import annotations

import json
import os
import tempfile
import zlib
from pathlib import Path

import pytest
from compaction_support import make_compactor, open_transcript, thresholds, words
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_budget_tracker import STEP, play, state

from soba_nb.compaction.budget_state import BudgetStateFile, state_path
from soba_nb.compaction.compactor import Compactor
from soba_nb.transcript.entries import (
    CapsuleEntry,
    MessageEntry,
    ToolCallEntry,
    ToolResultEntry,
    UsageEntry,
)
from soba_nb.transcript.store import Transcript


def resumed(t: Transcript, *, backfill: list[int] | None = None) -> Compactor:
    """A compactor as a restarted kernel makes it; `backfill` records reads of every count."""
    engine = make_compactor(t)
    if backfill is not None:
        engine.counter.backfill = lambda: backfill.append(1) or {}
    return engine


def saved_data(t: Transcript) -> dict:
    """The JSON of the saved state (after its checksum)."""
    return json.loads(state_path(t.file).read_bytes().split(b"\n")[0].partition(b" ")[2])


def write_data(t: Transcript, data: dict) -> None:
    """A state file holding `data`, with a good checksum."""
    body = json.dumps(data).encode()
    state_path(t.file).write_bytes(b"%08x %s\n" % (zlib.crc32(body), body))


def rebuilt(t: Transcript) -> Compactor:
    """A compactor that finds no saved state (it counts the whole path)."""
    state_path(t.file).unlink(missing_ok=True)
    return make_compactor(t)


@settings(max_examples=150, deadline=None)
@example([("user", 1), ("call", 2), ("measure", 0), ("result", 0), ("assistant", 3)])
@example([("user", 1), ("call", 2), ("measure", 0), ("user", 3)])
@example([("intent", 0), ("skill b", 2), ("measure", 0), ("user", 1)])
@example([("skill a", 1), ("intent", 0), ("user", 2), ("measure", 0), ("soft compaction", 1), ("user", 3)])
@example([("user", 1), ("capsule keeping", 2), ("user", 3), ("measure", 0), ("call", 4)])
@example([("user", 1), ("measure", 0), ("capsule", 2), ("user", 3)])
@example([("user", 1), ("assistant", 2), ("measure", 0), ("rewind", 1), ("user", 3)])
@given(st.lists(st.tuples(STEP, st.integers(0, 1000)), max_size=40))
def test_a_resumed_tracker_agrees_with_one_that_rebuilds(steps: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        t, engine = play(Path(folder), steps)
        path = t.path()
        saved = engine.budget_file.load()
        reads: list[int] = []
        again = resumed(t, backfill=reads)
        after = state(again.tracker, path)
        assert after == state(rebuilt(t).tracker, path)
        # Taken whenever the saved point is still on the path and no capsule came after it.
        usable = (
            saved is not None
            and saved.seen <= len(path)
            and path[saved.seen - 1].id == saved.last_id
            and not any(e.type == "capsule" for e in path[saved.seen :])
        )
        assert again.tracker.restores == (1 if usable else 0)
        if usable:
            assert again.tracker.rebuilds == 0 and reads == []  # no count of the path read


def test_a_resumed_session_builds_the_same_input_without_reading_the_counts(tmp_path: Path) -> None:
    t = open_transcript(tmp_path)
    engine = make_compactor(t)
    for n in range(30):
        t.append(MessageEntry(role="user", content=words(5 + n)))
        t.append(ToolCallEntry(call_id=f"c{n}", name="python", arguments='{"code": "1"}'))
        t.append(ToolResultEntry(call_id=f"c{n}", name="python", content=words(40 + n)))
        t.append(MessageEntry(role="assistant", content=words(3 + n)))
        t.append(UsageEntry(input_tokens=1000 + 90 * n))
        engine.measure()
    expected = engine.model_input()
    t.append(MessageEntry(role="user", content="and now plot it"))  # after the last save
    t.close()

    reopened = Transcript.open(t.file)
    reads: list[int] = []
    again = resumed(reopened, backfill=reads)
    built = again.model_input()
    assert again.tracker.restores == 1 and reads == []
    fresh = rebuilt(reopened).model_input()
    assert built.tokens == fresh.tokens == expected.tokens + again.counter.count_message("user", "and now plot it")
    assert built.messages == fresh.messages
    reopened.close()


def test_clipping_on_a_resumed_session_reads_the_counts_it_needs(tmp_path: Path) -> None:
    t = open_transcript(tmp_path)
    engine = make_compactor(t)
    for n in range(6):
        t.append(ToolCallEntry(call_id=f"c{n}", name="python", arguments="{}"))
        t.append(ToolResultEntry(call_id=f"c{n}", name="python", content=words(3000)))
        engine.measure()
    counts = dict(engine.counter._cache)
    t.close()
    reopened = Transcript.open(t.file)
    again = make_compactor(reopened, thresholds(hard=5000))
    reads: list[int] = []
    again.counter.backfill = lambda: reads.append(1) or counts
    built = again.model_input()
    assert again.tracker.restores == 1 and reads == [1]  # the results' counts, to clip them
    assert any("clipped" in note for note in built.notes) and built.tokens <= 5000
    assert built.tokens == make_compactor(reopened, thresholds(hard=5000)).model_input().tokens
    reopened.close()


@pytest.mark.parametrize(
    "spoil",
    [
        lambda data: data.update(lastId="deadbeef"),
        lambda data: data.update(seen=data["seen"] + 5),
        lambda data: data.update(seen=0),
        lambda data: data.update(rootId="other"),
        lambda data: data.update(counter="cl100k_base x1"),
        lambda data: data.update(fixed=data["fixed"] + 1),
        lambda data: data.update(capsuleAt=1, capsuleId="nope"),
        lambda data: data.update(intents=[[1, "not-an-intent"]]),
        lambda data: data.update(skills=[[-1, "x"]]),
        lambda data: data.update(version=99),
        lambda data: data.update(estimated="many"),
    ],
)
def test_a_state_that_does_not_describe_the_path_is_not_used(tmp_path: Path, spoil) -> None:
    t = open_transcript(tmp_path)
    engine = make_compactor(t)
    for n in range(5):
        t.append(MessageEntry(role="user", content=words(4 + n)))
    engine.measure()
    data = saved_data(t)
    spoil(data)
    write_data(t, data)
    again = resumed(t)
    assert again.tracker.restores == 0
    assert state(again.tracker, t.path()) == state(rebuilt(t).tracker, t.path())


def test_a_write_cut_short_or_a_longer_old_state_behind_it_is_never_taken_as_a_mix(tmp_path: Path) -> None:
    t = open_transcript(tmp_path)
    engine = make_compactor(t)
    for n in range(40):
        t.append(ToolCallEntry(call_id=f"call_{n:04d}_waiting_for_its_result", name="python", arguments="{}"))
    engine.measure()
    longer = state_path(t.file).read_bytes()
    for n in range(40):  # every call answered: a much shorter state, written over the longer one
        t.append(ToolResultEntry(call_id=f"call_{n:04d}_waiting_for_its_result", name="python", content="ok"))
    engine.measure()
    shorter = state_path(t.file).read_bytes()
    assert len(shorter) < len(longer)
    # A crash after the write and before the truncation: the old state's end follows the line.
    state_path(t.file).write_bytes(shorter + longer[len(shorter) :])
    again = resumed(t)
    assert again.tracker.measure(t.path()) == engine.measure() and again.tracker.restores == 1
    # A crash in the middle of the write: the new state's start, the old state's end.
    for cut in (10, len(shorter) // 2, len(shorter) - 2):
        state_path(t.file).write_bytes(shorter[:cut] + longer[cut:])
        again = resumed(t)
        assert again.tracker.measure(t.path()) == engine.measure() and again.tracker.restores == 0


@pytest.mark.parametrize("content", [b"", b"{", b"\xff\xfe", b"[]", b"null", b"x" * (2 << 20), b"00000000 {}\n"])
def test_a_malformed_state_file_costs_a_rebuild_only(tmp_path: Path, content: bytes) -> None:
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="hello"))
    state_path(t.file).write_bytes(content)
    engine = make_compactor(t)
    engine.measure()
    assert engine.tracker.restores == 0 and engine.tracker.rebuilds == 1
    assert saved_data(t)["seen"] == 2  # replaced by a good one


def test_the_state_file_is_never_followed_through_a_link_or_waited_on(tmp_path: Path) -> None:
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="hello"))
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("keep me\n")
    os.symlink(outside, state_path(t.file))
    engine = make_compactor(t)
    engine.measure()
    assert outside.read_text() == "keep me\n" and engine.tracker.restores == 0
    assert not state_path(t.file).is_symlink()  # replaced by a file of its own
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(state_path(fifo))
    assert BudgetStateFile(fifo).load() is None  # returns at once


def test_a_state_that_would_need_redacting_is_not_written(tmp_path: Path, monkeypatch) -> None:
    t = open_transcript(tmp_path)
    engine = make_compactor(t)
    call_id = "call_Zq81LmX04vTr"
    t.append(ToolCallEntry(call_id=call_id, name="python", arguments="{}"))  # waits for its result
    engine.measure()
    assert call_id in saved_data(t)["openCalls"]
    # The same text is now the value of a secret in the environment (redaction reads it): the
    # state would carry it, and a redacted call id would be a wrong one: no state is kept.
    monkeypatch.setenv("SOBA_TEST_API_KEY", call_id)
    t.append(MessageEntry(role="user", content="go on"))
    engine.measure()
    assert not state_path(t.file).exists()
    monkeypatch.delenv("SOBA_TEST_API_KEY")
    t.append(MessageEntry(role="user", content="and again"))
    engine.measure()  # not a secret any more: written again
    assert call_id in saved_data(t)["openCalls"]
    assert resumed(t).tracker.measure(t.path()) == engine.measure()


def test_a_folder_it_cannot_write_costs_nothing_but_the_state(tmp_path: Path) -> None:
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="hello"))
    state_path(t.file).mkdir()  # a directory where the file should be: replacing it fails
    engine = make_compactor(t)
    first = engine.measure()
    t.append(MessageEntry(role="user", content="again"))
    assert engine.measure().estimated > first.estimated and engine.budget_file.failed


# -- the state a turn checkpoint carries in the transcript ----------------------------------


def a_finished_turn(t: Transcript, engine: Compactor, rounds: int = 6) -> None:
    """Rounds of request, call, result, answer and the provider's figure; the turn ends as the
    loop ends it (`record_turn_complete`)."""
    for n in range(rounds):
        t.append(MessageEntry(role="user", content=words(6 + n)))
        t.append(ToolCallEntry(call_id=f"call_{n}", name="python", arguments='{"code": "df.head()"}'))
        t.append(ToolResultEntry(call_id=f"call_{n}", name="python", content=words(40 + n)))
        t.append(MessageEntry(role="assistant", content=words(12 + n)))
        t.append(UsageEntry(input_tokens=500 + 90 * n, output_tokens=12))
        engine.measure()
    engine.record_turn_complete()


def copied_alone(t: Transcript, folder: Path, edit=None) -> Transcript:
    """The transcript's file alone in `folder` (nothing kept beside it); `edit` changes the
    JSON of its last line (the turn checkpoint) on the way."""
    folder.mkdir()
    lines = t.file.read_bytes().splitlines(keepends=True)
    if edit is not None:
        last = json.loads(lines[-1])
        edit(last)
        lines[-1] = json.dumps(last).encode() + b"\n"
    (folder / t.file.name).write_bytes(b"".join(lines))
    return Transcript.open(folder / t.file.name)


def test_a_transcript_copied_alone_after_a_turn_opens_from_its_last_checkpoint(tmp_path: Path, forbid_tokenizer) -> None:
    t = open_transcript(tmp_path)
    engine = make_compactor(t)
    a_finished_turn(t, engine)
    checkpoint = json.loads(t.file.read_bytes().splitlines()[-1])
    assert checkpoint["type"] == "checkpoint" and checkpoint["kind"] == "turn"
    assert checkpoint["budget"]["lastId"] == t.path()[-2].id  # the state up to the entry before it
    expected = engine.measure()
    truth = state(rebuilt(t).tracker, t.path())

    copy = copied_alone(t, tmp_path / "copy")
    forbid_tokenizer()
    again = make_compactor(copy)
    assert again.measure() == expected and again.tracker.restores == 1
    assert state(again.tracker, copy.path()) == truth


@pytest.mark.parametrize(
    "spoil",
    [
        lambda budget: budget.update(lastId="not-on-the-path"),
        lambda budget: budget.update(seen=budget["seen"] + 1),
        lambda budget: budget.update(rootId="other"),
        lambda budget: budget.update(counter="cl100k_base x1"),
        lambda budget: budget.update(fixed=budget["fixed"] + 1),
        lambda budget: budget.update(version=99),
    ],
)
def test_a_recorded_state_that_does_not_describe_the_path_is_not_used(tmp_path: Path, spoil) -> None:
    t = open_transcript(tmp_path)
    engine = make_compactor(t)
    a_finished_turn(t, engine)
    copy = copied_alone(t, tmp_path / "copy", lambda checkpoint: spoil(checkpoint["budget"]))
    again = make_compactor(copy)
    assert again.measure() == engine.measure() and again.tracker.restores == 0
    assert state(again.tracker, copy.path()) == state(rebuilt(t).tracker, t.path())


@pytest.mark.parametrize(
    "recorded",
    [
        {"estimated": "many"},  # a field of the wrong type
        {"version": 2, "counter": ["a later shape"], "entries": {"seen": 12}},  # a later soba-nb's
        "not an object",
        None,
    ],
)
def test_a_recorded_state_this_version_cannot_read_is_ignored_never_an_error(tmp_path: Path, recorded) -> None:
    """A cache in the transcript: the line stays a good entry (a later writer's state must not
    make the file unreadable), the state is not used, and the path is counted."""
    t = open_transcript(tmp_path)
    engine = make_compactor(t)
    a_finished_turn(t, engine)

    def spoil(checkpoint: dict) -> None:
        if isinstance(recorded, dict) and "estimated" in recorded:
            checkpoint["budget"].update(recorded)
        else:
            checkpoint["budget"] = recorded

    copy = copied_alone(t, tmp_path / "copy", spoil)
    again = make_compactor(copy)
    assert again.measure() == engine.measure() and again.tracker.restores == 0
    assert state(again.tracker, copy.path()) == state(rebuilt(t).tracker, t.path())


def test_what_came_after_the_checkpoint_is_counted_and_a_capsule_since_makes_it_useless(tmp_path: Path) -> None:
    from soba_nb.compaction.budget_state import recorded_state

    t = open_transcript(tmp_path)
    engine = make_compactor(t)
    a_finished_turn(t, engine)
    t.append(MessageEntry(role="user", content=words(9)))
    copy = copied_alone(t, tmp_path / "copy")
    again = make_compactor(copy)
    assert again.measure() == engine.measure() and again.tracker.restores == 1
    assert recorded_state(copy.path()) is not None
    capsule = CapsuleEntry(operation_id="op", checkpoint_id="ck_00000001", trigger="user", quality="full",
                           tokens_before=900, tokens_after=300, estimated_before=800, first_kept_entry_id=None,
                           content="## Goal")  # fmt: skip
    assert recorded_state([*copy.path(), capsule]) is None


def test_a_turn_whose_state_would_need_redacting_records_none(tmp_path: Path, monkeypatch) -> None:
    t = open_transcript(tmp_path)
    engine = make_compactor(t)
    call_id = "call_Zq81LmX04vTr"
    t.append(ToolCallEntry(call_id=call_id, name="python", arguments="{}"))  # waits for its result
    monkeypatch.setenv("SOBA_TEST_API_KEY", call_id)
    engine.record_turn_complete()
    assert "budget" not in json.loads(t.file.read_bytes().splitlines()[-1])
    monkeypatch.delenv("SOBA_TEST_API_KEY")
    engine.record_turn_complete()
    assert json.loads(t.file.read_bytes().splitlines()[-1])["budget"]["openCalls"] == [call_id]


def test_whether_a_transcript_has_a_saved_state_is_told_from_its_end_alone(tmp_path: Path) -> None:
    from soba_nb.compaction.budget_state import has_saved_state

    t = open_transcript(tmp_path)
    engine = make_compactor(t)
    a_finished_turn(t, engine)
    state_path(t.file).unlink()
    assert has_saved_state(t.file)
    t.append(MessageEntry(role="user", content="more"))
    assert not has_saved_state(t.file)
    engine.record_turn_complete()
    state_path(t.file).unlink()
    with t.file.open("ab") as file:
        file.write(b'{"type": "message", "id": "torn')  # a crash mid-write
    assert not has_saved_state(t.file)
    link = tmp_path / "link.jsonl"
    os.symlink(t.file, link)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    assert not has_saved_state(link) and not has_saved_state(fifo)  # returns at once
    state_path(fifo).write_text("a state beside it")
    assert has_saved_state(fifo)
