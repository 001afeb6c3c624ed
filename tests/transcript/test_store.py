"""SPEC §7: the append-only JSONL store — tree, leaf, rewind, locking, torn lines, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    LeafEntry,
    MessageEntry,
    SessionEntry,
    ToolCallEntry,
    ToolResultEntry,
    UsageEntry,
    entry_to_json,
)
from soba_nb.transcript.store import (
    TORN_MARKER,
    TornLineWarning,
    Transcript,
    TranscriptError,
    TranscriptLockedError,
)


@pytest.fixture
def session_file(tmp_path: Path) -> Path:
    return tmp_path / "analysis.soba" / "s1.jsonl"


@pytest.fixture
def store(session_file: Path) -> Iterator[Transcript]:
    with Transcript.open(session_file, create_header=SessionEntry(model="openai/gpt-4o")) as opened:
        yield opened


def user(text: str) -> MessageEntry:
    return MessageEntry(role="user", content=text)


def assistant(text: str) -> MessageEntry:
    return MessageEntry(role="assistant", content=text)


def capsule(first_kept: str | None) -> CapsuleEntry:
    return CapsuleEntry(
        operation_id="op_1",
        checkpoint_id="ck_0123abcd",
        trigger="user",
        quality="full",
        tokens_before=50000,
        tokens_after=12000,
        first_kept_entry_id=first_kept,
        content="## Goal and constraints\nship it",
    )


def lines_of(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_bytes().split(b"\n") if line]


def write_lines(path: Path, *lines: str, end: str = "\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(("\n".join(lines) + end).encode("utf-8"))
    return path


def json_line(**fields: object) -> str:
    return json.dumps(fields, separators=(",", ":"))


HEADER = json_line(type="session", id="h", parentId=None, timestamp="2026-01-01T00:00:00Z")


# -- tree, leaf, path --------------------------------------------------------------------


def test_open_creates_the_folder_and_the_header(store: Transcript, session_file: Path) -> None:
    assert session_file.is_file()
    header = store.header
    assert header is not None
    assert header.parent_id is None
    assert header.model == "openai/gpt-4o"
    assert store.leaf == header.id
    assert len(store) == 1


def test_open_does_not_add_a_second_header(store: Transcript, session_file: Path) -> None:
    store.append(user("hi"))
    store.close()
    with Transcript.open(session_file, create_header=SessionEntry()) as again:
        assert len(again) == 2
        assert [entry.type for entry in again] == ["session", "message"]


def test_append_hangs_each_entry_from_the_leaf(store: Transcript) -> None:
    header = store.header
    assert header is not None
    first = store.append(user("load the data"))
    second = store.append(assistant("loading"))
    assert first.parent_id == header.id
    assert second.parent_id == first.id
    assert store.leaf == second.id
    assert [entry.id for entry in store.path()] == [header.id, first.id, second.id]


def test_append_replaces_the_callers_parent_id(store: Transcript) -> None:
    written = store.append(MessageEntry(role="user", content="x", parent_id="bogus"))
    assert written.parent_id == store.header.id  # type: ignore[union-attr]


def test_append_redraws_a_duplicate_id(store: Transcript) -> None:
    first = store.append(user("a"))
    again = store.append(MessageEntry(id=first.id, role="user", content="b"))
    assert again.id != first.id
    assert len({entry.id for entry in store}) == len(store)


def test_path_is_a_copy(store: Transcript) -> None:
    store.append(user("a"))
    path = store.path()
    path.clear()
    assert len(store.path()) == 2


def test_rewind_branches_from_the_target(store: Transcript, session_file: Path) -> None:
    question = store.append(user("plot revenue"))
    abandoned = store.append(assistant("here is a bar chart"))
    leaf_entry = store.rewind(question.id)
    assert isinstance(leaf_entry, LeafEntry)
    assert leaf_entry.target_id == question.id
    assert store.leaf == question.id
    retry = store.append(assistant("here is a line chart"))
    assert retry.parent_id == question.id
    path_ids = [entry.id for entry in store.path()]
    assert path_ids[-2:] == [question.id, retry.id]
    assert abandoned.id not in path_ids
    assert leaf_entry.id not in path_ids
    assert abandoned.id in store  # the transcript keeps every branch
    reloaded = Transcript.load(session_file)
    assert reloaded.leaf == retry.id
    assert [entry.id for entry in reloaded.path()] == path_ids


def test_rewind_without_a_new_entry_survives_reload(store: Transcript, session_file: Path) -> None:
    question = store.append(user("q"))
    store.append(assistant("a"))
    store.rewind(question.id)
    reloaded = Transcript.load(session_file)
    assert reloaded.leaf == question.id
    assert reloaded.path()[-1].id == question.id


def test_rewind_to_an_unknown_entry_is_refused(store: Transcript) -> None:
    with pytest.raises(KeyError):
        store.rewind("nope")
    leaf_entry = store.rewind(store.header.id)  # type: ignore[union-attr]
    with pytest.raises(KeyError):
        store.rewind(leaf_entry.id)


def test_find_checkpoint(store: Transcript) -> None:
    checkpoint = store.append(CheckpointEntry(kind="milestone", note="data loaded"))
    assert isinstance(checkpoint, CheckpointEntry)
    assert store.find_checkpoint(checkpoint.checkpoint_id) == checkpoint
    assert store.find_checkpoint("ck_ffffffff") is None


def test_line_numbers_match_the_file(store: Transcript, session_file: Path) -> None:
    entries = [store.append(user(str(index))) for index in range(3)]
    for entry in entries:
        line = session_file.read_bytes().split(b"\n")[store.line_of(entry.id) - 1]
        assert json.loads(line)["id"] == entry.id


# -- the line format -------------------------------------------------------------------------


def test_one_line_per_entry_type_first_camel_case(store: Transcript, session_file: Path) -> None:
    message = store.append(assistant("calling a tool"))
    store.append(ToolCallEntry(call_id="c1", name="read_file", arguments='{"path": "a.py"}'))
    store.append(ToolResultEntry(call_id="c1", name="read_file", content="x = 1\n", duration_ms=3))
    store.append(UsageEntry(input_tokens=1200, output_tokens=30))
    store.append(capsule(message.id))
    raw = session_file.read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.split(b"\n")[:-1]
    assert len(lines) == len(store) == 6
    for line, entry in zip(lines, store.entries, strict=True):
        data = json.loads(line)
        assert next(iter(data)) == "type"
        assert data["id"] == entry.id
        assert not any("_" in key for key in data if key != "type")
        assert line == json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    records = lines_of(session_file)
    assert records[2]["callId"] == "c1"
    assert records[3]["durationMs"] == 3
    assert records[4]["inputTokens"] == 1200
    assert records[5]["firstKeptEntryId"] == message.id
    assert records[5]["tokensBefore"] == 50000
    assert records[1]["parentId"] == records[0]["id"]


def test_utf8_is_written_as_is(store: Transcript, session_file: Path) -> None:
    store.append(user("données — 数据 ✓"))
    assert "données — 数据 ✓".encode() in session_file.read_bytes()
    assert Transcript.load(session_file).entries[-1].content == "données — 数据 ✓"  # type: ignore[union-attr]


def test_newlines_in_content_stay_inside_one_line(store: Transcript, session_file: Path) -> None:
    store.append(ToolResultEntry(call_id="c", name="shell", content="a\nb\r\nc\n"))
    assert session_file.read_bytes().count(b"\n") == 2


def test_lone_surrogates_do_not_break_the_file(store: Transcript, session_file: Path) -> None:
    written = store.append(ToolResultEntry(call_id="c", name="list_files", content="bad\udcffname"))
    reloaded = Transcript.load(session_file)
    assert reloaded.entries[-1] == written
    assert written.content == "bad?name"  # type: ignore[union-attr]


def test_one_write_per_entry(store: Transcript, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    writes: list[bytes] = []

    def counting_write(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counting_write)
    store.append(user("a"))
    store.append(CheckpointEntry(kind="turn"))
    assert len(writes) == 2
    assert all(chunk.endswith(b"\n") and chunk.count(b"\n") == 1 for chunk in writes)


def test_fsync_for_capsule_and_checkpoint(
    store: Transcript, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    message = store.append(user("a"))
    store.append(ToolCallEntry(call_id="c", name="python", arguments="{}"))
    store.append(ToolResultEntry(call_id="c", name="python", content="1"))
    store.append(UsageEntry(input_tokens=10))
    assert synced == []
    store.append(CheckpointEntry(kind="milestone", note="m"))
    assert len(synced) == 1
    store.append(capsule(message.id))
    assert len(synced) == 2


def test_the_file_is_never_rewritten(store: Transcript, session_file: Path) -> None:
    before = session_file.read_bytes()
    question = store.append(user("a"))
    for entry in (assistant("b"), CheckpointEntry(kind="turn"), capsule(question.id)):
        store.append(entry)
        after = session_file.read_bytes()
        assert after.startswith(before) and len(after) > len(before)
        before = after
    store.rewind(question.id)
    assert session_file.read_bytes().startswith(before)


# -- writers and readers ---------------------------------------------------------------------


def test_a_loaded_view_is_read_only(store: Transcript, session_file: Path) -> None:
    view = Transcript.load(session_file)
    with pytest.raises(TranscriptLockedError, match="read-only"):
        view.append(user("x"))


def test_second_writer_in_the_same_process(store: Transcript, session_file: Path) -> None:
    with pytest.raises(TranscriptLockedError, match="another writer"):
        Transcript.open(session_file)
    # Readers are never blocked.
    assert len(Transcript.load(session_file)) == 1


def test_the_lock_is_released_on_close(store: Transcript, session_file: Path) -> None:
    store.close()
    with Transcript.open(session_file) as again:
        again.append(user("after close"))
    store.close()  # closing twice is harmless


SECOND_WRITER = textwrap.dedent(
    """
    import sys
    from soba_nb.transcript.entries import MessageEntry
    from soba_nb.transcript.store import Transcript, TranscriptLockedError

    try:
        store = Transcript.open(sys.argv[1])
    except TranscriptLockedError as exc:
        print(exc)
        sys.exit(3)
    store.append(MessageEntry(role="user", content="from the second kernel"))
    store.close()
    """
)


def run_second_writer(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SECOND_WRITER, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_second_writer_in_another_process(store: Transcript, session_file: Path) -> None:
    before = session_file.read_bytes()
    result = run_second_writer(session_file)
    assert result.returncode == 3, result.stderr
    assert "another writer" in result.stdout
    assert session_file.read_bytes() == before
    store.close()
    result = run_second_writer(session_file)
    assert result.returncode == 0, result.stderr
    assert len(Transcript.load(session_file)) == 2


def test_the_lock_belongs_to_the_file_not_to_a_path(store: Transcript, session_file: Path, tmp_path: Path) -> None:
    """No lock file anyone could delete, and a hard link or another spelling of the path is
    the same file: the second writer is refused either way (a symlink is refused as a link)."""
    assert [p.name for p in session_file.parent.iterdir()] == [session_file.name]
    link = tmp_path / "elsewhere.jsonl"
    os.link(session_file, link)
    with pytest.raises(TranscriptLockedError):
        Transcript.open(link)
    with pytest.raises(TranscriptLockedError):
        Transcript.open(session_file.parent / ".." / session_file.parent.name / session_file.name)
    result = run_second_writer(link)
    assert result.returncode == 3, result.stderr


def test_a_transcript_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(TranscriptError, match="not a regular file"):
        Transcript.open(fifo)  # read-write on a FIFO does not block on Linux: it is refused


def test_a_failed_open_releases_the_lock(session_file: Path) -> None:
    write_lines(session_file, HEADER, "garbage", HEADER)
    with pytest.raises(TranscriptError):
        Transcript.open(session_file)
    # The lock is free again: a (fixed) file can be opened.
    write_lines(session_file, HEADER)
    with Transcript.open(session_file) as opened:
        assert len(opened) == 1


# -- torn lines --------------------------------------------------------------------------------


def tear(path: Path, partial: bytes = b'{"type":"message","id":"torn","par') -> bytes:
    with path.open("ab") as handle:
        handle.write(partial)
    return path.read_bytes()


def test_torn_last_line_is_ignored_with_a_warning(store: Transcript, session_file: Path) -> None:
    store.append(user("a"))
    store.close()
    tear(session_file)
    with pytest.warns(TornLineWarning, match=r":3: ignoring a torn last line"):
        view = Transcript.load(session_file)
    assert len(view) == 2
    assert view.torn_lines == [3]


def test_append_after_a_torn_line_starts_a_fresh_line(
    store: Transcript, session_file: Path
) -> None:
    question = store.append(user("a"))
    store.close()
    torn = tear(session_file)
    with pytest.warns(TornLineWarning), Transcript.open(session_file) as reopened:
        answer = reopened.append(assistant("b"))
        assert reopened.line_of(answer.id) == 4
        later = reopened.append(assistant("c"))
    after = session_file.read_bytes()
    assert after.startswith(torn)  # nothing rewritten, not even the torn bytes
    assert after[len(torn) : len(torn) + 1] == b"\n"
    lines = after.split(b"\n")
    assert json.loads(lines[3])[TORN_MARKER] is True
    assert TORN_MARKER not in json.loads(lines[4])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the torn line was reported once; a later load is quiet
        reloaded = Transcript.load(session_file)
    assert [entry.id for entry in reloaded.path()][-3:] == [question.id, answer.id, later.id]
    assert reloaded.torn_lines == [3]
    assert reloaded.line_of(later.id) == 5


def test_unterminated_but_complete_last_line(session_file: Path) -> None:
    message = json_line(type="message", id="m", parentId="h", timestamp="t", role="user")
    write_lines(session_file, HEADER, message, end="")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        view = Transcript.load(session_file)
    assert view.leaf == "m"
    with Transcript.open(session_file) as opened:
        opened.append(assistant("b"))
    assert len(Transcript.load(session_file)) == 3


def test_a_torn_header_is_recovered_on_open(session_file: Path) -> None:
    session_file.parent.mkdir(parents=True)
    session_file.write_bytes(b'{"type":"sess')
    with (
        pytest.warns(TornLineWarning),
        Transcript.open(session_file, create_header=SessionEntry()) as opened,
    ):
        assert opened.header is not None
    assert Transcript.load(session_file).header is not None


# -- malformed files: one clear error naming the line -------------------------------------------


def load_error(path: Path) -> TranscriptError:
    with pytest.raises(TranscriptError) as info:
        Transcript.load(path)
    assert str(path) in str(info.value)
    return info.value


def test_garbage_line_in_the_middle(session_file: Path) -> None:
    message = json_line(type="message", id="m", parentId="h", timestamp="t", role="user")
    write_lines(session_file, HEADER, "this is not json", message)
    error = load_error(session_file)
    assert error.line == 2
    assert f"{session_file}:2:" in str(error)
    assert "not valid JSON" in str(error)


def test_the_first_of_several_bad_lines_is_named(session_file: Path) -> None:
    write_lines(session_file, HEADER, "{broken", "{also broken", HEADER.replace('"h"', '"h2"'))
    assert load_error(session_file).line == 2


def test_a_terminated_torn_last_line_is_tolerated_and_marked_after(session_file: Path) -> None:
    """A crash can leave a torn line terminated: the append after it wrote only the "\n"
    that starts a fresh line before it was killed."""
    write_lines(session_file, HEADER, "{broken")
    with pytest.warns(TornLineWarning, match=":2: ignoring a torn last line"), Transcript.open(session_file) as opened:
        opened.append(user("after"))
    lines = session_file.read_bytes().split(b"\n")
    assert lines[1] == b"{broken" and json.loads(lines[2])[TORN_MARKER] is True
    assert Transcript.load(session_file).torn_lines == [2]


def test_two_crashes_in_a_row_leave_the_session_openable(store: Transcript, session_file: Path) -> None:
    """Killed twice while appending a large entry: the first torn line is now mid-file."""
    first = store.append(user("before the crashes"))
    store.close()
    big = entry_to_json(ToolResultEntry(call_id="c", name="shell", content="x" * 200_000)).encode()
    with session_file.open("ab") as raw:
        raw.write(big[: len(big) // 3])  # crash 1
    with pytest.warns(TornLineWarning), Transcript.open(session_file) as opened:
        opened._write(b"\n" + big[: len(big) // 2], durable=False, entry_id="torn")  # crash 2, during the next append
    with (
        pytest.warns(TornLineWarning, match=":3: ignoring 2 torn lines at the end"),
        Transcript.open(session_file) as reopened,
    ):
        assert reopened.leaf == first.id
        after = reopened.append(assistant("after the crashes"))
        assert reopened.line_of(after.id) == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reloaded = Transcript.load(session_file)
    assert reloaded.torn_lines == [3, 4]
    assert [e.id for e in reloaded.path()][-2:] == [first.id, after.id]


def test_a_torn_marker_does_not_excuse_a_valid_line(session_file: Path) -> None:
    # Only a line that is not JSON can be a torn line.
    after = json_line(
        type="message", id="m", parentId="h", timestamp="t", role="user", followsTornLine=True
    )
    write_lines(session_file, HEADER, "[1, 2]", after)
    error = load_error(session_file)
    assert error.line == 2
    assert "not a JSON object" in str(error)


def test_garbage_before_a_marked_line_needs_the_marker(session_file: Path) -> None:
    plain = json_line(type="message", id="m", parentId="h", timestamp="t", role="user")
    write_lines(session_file, HEADER, '{"type":"mess', plain)
    assert load_error(session_file).line == 2


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("[1, 2, 3]", "not a JSON object"),
        ('"text"', "not a JSON object"),
        (json_line(type="telepathy", id="x", parentId="h"), "bad entry"),
        (json_line(id="x", parentId="h"), "bad entry"),
        (json_line(type="message", id="x", parentId="h", role="robot"), "role"),
        (json_line(type="message", id=5, parentId="h", role="user"), "id"),
        (json_line(type="usage", id="x", parentId="h"), "inputTokens"),
    ],
)
def test_bad_entries_name_the_line_and_the_field(session_file: Path, line: str, words: str) -> None:
    write_lines(session_file, HEADER, line)
    error = load_error(session_file)
    assert error.line == 2
    assert words in str(error)


def test_duplicate_id(session_file: Path) -> None:
    first = json_line(type="message", id="m", parentId="h", timestamp="t", role="user")
    second = json_line(type="message", id="m", parentId="m", timestamp="t", role="assistant")
    write_lines(session_file, HEADER, first, second)
    error = load_error(session_file)
    assert error.line == 3
    assert "duplicate id 'm'" in str(error)
    assert "line 2" in str(error)


def test_missing_parent(session_file: Path) -> None:
    orphan = json_line(type="message", id="m", parentId="ghost", timestamp="t", role="user")
    write_lines(session_file, HEADER, orphan)
    error = load_error(session_file)
    assert error.line == 2
    assert "ghost" in str(error)


def test_parent_must_come_earlier(session_file: Path) -> None:
    early = json_line(type="message", id="a", parentId="b", timestamp="t", role="user")
    late = json_line(type="message", id="b", parentId="h", timestamp="t", role="user")
    write_lines(session_file, HEADER, early, late)
    assert load_error(session_file).line == 2


def test_leaf_pointing_nowhere(session_file: Path) -> None:
    leaf = json_line(type="leaf", id="l", parentId="h", timestamp="t", targetId="nowhere")
    write_lines(session_file, HEADER, leaf)
    error = load_error(session_file)
    assert error.line == 2
    assert "targetId 'nowhere'" in str(error)


def test_leaf_pointing_at_a_leaf(session_file: Path) -> None:
    first = json_line(type="leaf", id="l1", parentId="h", timestamp="t", targetId="h")
    second = json_line(type="leaf", id="l2", parentId="l1", timestamp="t", targetId="l1")
    write_lines(session_file, HEADER, first, second)
    assert load_error(session_file).line == 3


def test_an_empty_file_is_an_empty_session(session_file: Path) -> None:
    write_lines(session_file, end="")
    session_file.write_bytes(b"")
    view = Transcript.load(session_file)
    assert len(view) == 0
    assert view.leaf is None
    assert view.path() == []


def test_a_blank_line_is_an_error(session_file: Path) -> None:
    write_lines(session_file, HEADER, "", HEADER.replace('"h"', '"h2"'))
    assert load_error(session_file).line == 2


def test_deeply_nested_json_is_a_transcript_error(session_file: Path) -> None:
    write_lines(session_file, HEADER, "[" * 100_000, HEADER.replace('"h"', '"h2"'))
    assert load_error(session_file).line == 2


# -- the loader never crashes on garbage ---------------------------------------------------------

_fuzz_dir = tempfile.mkdtemp(prefix="soba-fuzz-")


def load_quietly(raw: bytes) -> Transcript | None:
    path = Path(_fuzz_dir) / "fuzz.jsonl"
    path.write_bytes(raw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornLineWarning)
        try:
            return Transcript.load(path)
        except TranscriptError as error:
            assert error.line is not None and error.line >= 1
            return None


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_loader_on_random_bytes(raw: bytes) -> None:
    load_quietly(raw)


VALID = (
    HEADER
    + "\n"
    + json_line(type="message", id="m", parentId="h", timestamp="t", role="user", content="hi")
    + "\n"
    + json_line(type="leaf", id="l", parentId="m", timestamp="t", targetId="h")
    + "\n"
)


@settings(max_examples=300)
@given(st.integers(0, len(VALID)), st.binary(max_size=30), st.integers(0, len(VALID)))
def test_loader_on_damaged_files(cut: int, noise: bytes, where: int) -> None:
    data = VALID.encode()
    load_quietly(data[:cut])
    load_quietly(data[:where] + noise + data[where:])


@settings(max_examples=200)
@given(
    st.lists(
        st.one_of(
            st.just(HEADER),
            st.builds(
                lambda i, p, t: json_line(
                    type=t, id=i, parentId=p, timestamp="t", role="user", targetId=p
                ),
                st.sampled_from(["h", "a", "b"]),
                st.sampled_from(["h", "a", "b", None]),
                st.sampled_from(["message", "leaf", "session", "checkpoint"]),
            ),
            st.text(max_size=20),
        ),
        max_size=6,
    ),
    st.booleans(),
)
def test_loader_on_plausible_lines(lines: list[str], terminated: bool) -> None:
    raw = "\n".join(lines) + ("\n" if terminated else "")
    view = load_quietly(raw.encode("utf-8", "surrogatepass"))
    if view is not None:
        ids = [entry.id for entry in view]
        assert len(ids) == len(set(ids))
        assert view.leaf is None or view.leaf in view


# -- loading in blocks ---------------------------------------------------------------------


def test_entries_across_decode_blocks_load_whole_and_in_order(store: Transcript, session_file: Path) -> None:
    # Lines longer than a block, and many lines whose blocks end mid-line: all come back equal.
    from soba_nb.transcript.reading import DECODE_BLOCK_BYTES

    written = [store.append(user("x" * (DECODE_BLOCK_BYTES + 17)))]
    written += [store.append(assistant(f"{i} " + "y" * (i % 5000))) for i in range(2500)]
    written.append(store.append(user("é" * (DECODE_BLOCK_BYTES // 2 + 3))))
    store.close()
    assert session_file.stat().st_size > 2 * DECODE_BLOCK_BYTES
    again = Transcript.load(session_file)
    assert again.entries[1:] == written
    assert again.line_of(written[-1].id) == len(written) + 1
    reopened = Transcript.open(session_file)
    try:
        assert reopened.path()[1:] == written
        reopened.append(user("after"))
    finally:
        reopened.close()
    assert Transcript.load(session_file).line_of(reopened.leaf or "") == len(written) + 2


def test_a_bad_line_after_several_blocks_is_named(store: Transcript, session_file: Path) -> None:
    from soba_nb.transcript.reading import DECODE_BLOCK_BYTES

    for _ in range(3):
        store.append(user("z" * DECODE_BLOCK_BYTES))
    store.close()
    with session_file.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"type": "message", "id": "bad", "parentId": None, "role": "robot"}) + "\n")
    with pytest.raises(TranscriptError, match=r"s1\.jsonl:5: bad entry \(role: "):
        Transcript.load(session_file)


def test_loading_a_fifo_is_refused_not_blocked(tmp_path: Path) -> None:
    fifo = tmp_path / "session.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(TranscriptError, match="not a regular file"):
        Transcript.load(fifo)
    with pytest.raises(TranscriptError, match="not a regular file"):
        Transcript.open(fifo)


def test_a_loaded_entry_shares_its_parents_id_string(store: Transcript, session_file: Path) -> None:
    first = store.append(user("a"))
    store.append(assistant("b"))
    store.close()
    loaded = Transcript.load(session_file)
    parent, child = loaded.entries[1], loaded.entries[2]
    assert child.parent_id == first.id and child.parent_id is parent.id
    assert loaded.own_id("".join(first.id)) is parent.id and loaded.own_id("nope") == "nope"
    own = loaded.own_ids(["nope", "".join(first.id), "".join(child.id), "nope@2"])
    assert own == ["nope", first.id, child.id, "nope@2"] and own[1] is parent.id and own[2] is child.id


def test_a_line_nested_absurdly_deep_is_a_bad_entry_not_a_crash(session_file: Path) -> None:
    header = json.loads(entry_to_json(SessionEntry()))
    nested = "[" * 200_000 + "]" * 200_000
    deep = '{"type":"config","id":"c1","parentId":' + json.dumps(header["id"]) + ',"config":{"a":' + nested + "}}"
    write_lines(session_file, json.dumps(header), deep)
    with pytest.raises(TranscriptError, match=r"s1\.jsonl:2: bad entry \(nested too deeply\)"):
        Transcript.load(session_file)
    write_lines(session_file, json.dumps(header), deep, end="")  # cut short at the end: a torn line
    with pytest.warns(TornLineWarning):
        assert len(Transcript.load(session_file)) == 1


# -- indexing a clean file in bulk --------------------------------------------------------


def _indexed_one_by_one(path: Path) -> Transcript:
    """The file indexed entry by entry (`_index`), as a file with torn lines is."""
    from soba_nb.transcript.reading import parse_lines as _parse_lines

    parsed = _parse_lines(path, path.read_bytes())
    assert parsed.numbers is not None  # a list of line numbers: the bulk path is not taken
    return Transcript(path, parsed, fd=None, lines=len(parsed.entries))


def _outcome(load: object) -> object:
    try:
        view = load() if callable(load) else load
    except TranscriptError as error:
        return ("error", str(error), error.line)
    assert isinstance(view, Transcript)
    by_id = {entry.id: entry for entry in view}
    for entry in view:  # one string per id: a parent id is its parent's own id string
        assert entry.parent_id is None or entry.parent_id is by_id[entry.parent_id].id
    return (
        [entry.id for entry in view],
        view.leaf,
        [entry.id for entry in view.path()],
        {key: view.setting(key) for key in ("compaction.auto",)},
        [entry.id for entry in view.windows],
        [view.line_of(entry.id) for entry in view],
    )


ID = st.sampled_from(["h", "a", "b", "c", "d", "e"])


def _pick(written: list[str], letter: str, index: int) -> str:
    """An earlier id chosen by `letter`, or with "e" the next entry's (not allowed)."""
    return f"n{index + 1}" if letter == "e" else written[-1 - "hdbca".index(letter) % len(written)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(ID, st.one_of(st.none(), ID), st.sampled_from(["message", "leaf", "setting", "window"]), ID),
        max_size=12,
    ),
    st.booleans(),
)
def test_bulk_indexing_gives_what_indexing_entry_by_entry_gives(
    rows: list[tuple[str, str | None, str, str]], chain: bool
) -> None:
    # `chain`: most entries hang from the one before them (the usual file), else parents are
    # drawn at random (branches, later or missing parents, leaves at leaves, duplicates).
    lines, previous, written = [HEADER], "h", ["h"]
    for index, (entry_id, parent, kind, target) in enumerate(rows):
        entry_id = f"n{index}" if chain else entry_id
        if chain:  # after the entry before, or (every third) a branch from an earlier one or a later one
            parent = previous if index % 3 or parent is None else _pick(written, parent, index)
        fields: dict[str, object] = {"type": kind, "id": entry_id, "parentId": parent, "timestamp": "t"}
        if kind == "message":
            fields.update(role="user", content="hi")
        elif kind == "leaf":
            fields["targetId"] = _pick(written, target, index) if chain else target
        elif kind == "setting":
            fields.update(key="compaction.auto", value=index % 2 == 0)
        else:
            fields.update(contextWindow=1000 + index, source="server")
        lines.append(json_line(**fields))
        previous = entry_id
        written.append(entry_id)
    with tempfile.TemporaryDirectory() as folder:
        path = write_lines(Path(folder) / "s.jsonl", *lines)
        assert _outcome(lambda: Transcript.load(path)) == _outcome(lambda: _indexed_one_by_one(path))


def test_a_long_clean_file_is_indexed_in_bulk(store: Transcript, session_file: Path) -> None:
    # The usual file (every entry after the one before it, a rewind and a branch) loads with
    # the same tree as entry by entry, and its path is cached from the load.
    first = store.append(user("one"))
    for index in range(300):
        store.append(assistant(f"a{index}"))
    store.rewind(first.id)
    for index in range(50):
        store.append(user(f"b{index}"))
    store.close()
    assert _outcome(lambda: Transcript.load(session_file)) == _outcome(lambda: _indexed_one_by_one(session_file))
    linear = session_file.with_name("linear.jsonl")
    with Transcript.open(linear, create_header=SessionEntry(model="m")) as other:
        for index in range(300):
            other.append(user(f"c{index}"))
    view = Transcript.load(linear)
    assert view._path is not None and len(view.path_view()) == 301
    assert _outcome(view) == _outcome(lambda: _indexed_one_by_one(linear))
