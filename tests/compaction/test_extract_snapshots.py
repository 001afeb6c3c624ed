"""Snapshots of the extract's scan: a summary that starts from one builds the very extract a
scan from the first entry would, and the file beside the transcript is only ever a cache."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soba_nb.compaction import deterministic, extract_snapshots
from soba_nb.compaction.capsule import Capsule
from soba_nb.compaction.deterministic import build_deterministic_capsule, capsule_from_scan
from soba_nb.compaction.extract import Scan, fresh_start
from soba_nb.compaction.extract_snapshots import (
    ExtractSnapshots,
    Snapshot,
    scan_of,
    snapshots_path,
    state_of,
    trim,
)
from soba_nb.compaction.summary_prompt import build_summary_prompt
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import (
    CheckpointEntry,
    Entry,
    MessageEntry,
    SkillEntry,
    ToolCallEntry,
    ToolResultEntry,
)
from soba_nb.transcript.store import Transcript

COUNTER = TokenCounter.for_model("openai", "gpt-4o")
SPACING = 8

WORDS = st.sampled_from(
    [
        "must", "never", "only", "because", "decided", "instead of", "blocked", "waiting on", "next",
        "- then", "plot", "df", "sales", ".", "!", "\n", "1.", "keep it under", "ok", "x",
    ]
)  # fmt: skip
TEXT = st.lists(WORDS, max_size=8).map(" ".join)
CODE = st.sampled_from(
    ["df = load()", "df.to_csv('out.csv')", "x, y = 1, 2", "plt.savefig('fig.png')", "print(df)", "1/0"]
)
COMMAND = st.sampled_from(["pytest -q", "ls > files.txt", "cp a.csv b.csv", "make"])


@st.composite
def steps(draw: st.DrawFn) -> list[Entry]:
    """A random stretch of session: messages, tool calls (some never answered, some failing),
    checkpoints and skills."""
    entries: list[Entry] = []
    for index in range(draw(st.integers(0, 120))):  # long enough to pass every cap a snapshot trims to
        kind = draw(
            st.sampled_from(["user", "assistant", "assistant", "assistant", "python", "shell", "read", "write", "checkpoint", "skill"])
        )
        call_id = f"c{index}"
        if kind in ("user", "assistant"):
            entries.append(MessageEntry(role=kind, content=draw(TEXT)))
        elif kind == "checkpoint":
            note = draw(TEXT)
            entries.append(CheckpointEntry(kind=draw(st.sampled_from(["milestone", "plan_pivot", "user"])), note=note))
        elif kind == "skill":
            entries.append(SkillEntry(name=draw(st.sampled_from(["eda", "plots"])), path="skills/x.md", content="use it"))
        else:
            name, arguments = {
                "python": ("python", {"code": draw(CODE)}),
                "shell": ("shell", {"command": draw(COMMAND)}),
                "read": ("read_file", {"path": draw(st.sampled_from(["a.csv", "b.py"]))}),
                "write": ("write_file", {"path": draw(st.sampled_from(["out.csv", "report.md"])), "content": "x"}),
            }[kind]
            entries.append(ToolCallEntry(call_id=call_id, name=name, arguments=json.dumps(arguments)))
            answer = draw(st.sampled_from(["now", "now", "later", "never"]))
            result = ToolResultEntry(
                call_id=call_id, name=name, content=draw(st.sampled_from(["ok", "exit status: 1", "Traceback\nZeroDivisionError: x"])),
                is_error=draw(st.booleans()),
            )  # fmt: skip
            if answer == "now":
                entries.append(result)
            elif answer == "later":
                entries.insert(len(entries) + draw(st.integers(0, 3)), result)
    return entries


def full_capsule(entries: list[Entry], whole: bool, previous: Capsule | None) -> Capsule:
    scan = fresh_start(entries).scan
    scan.run(entries)
    return capsule_from_scan(scan, previous=previous)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps(), st.data())
def test_a_trimmed_snapshot_scanned_on_gives_the_extract_of_a_whole_scan(entries: list[Entry], data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(entries)), max_size=4)))
    previous = data.draw(st.sampled_from([None, Capsule(goal_and_constraints="Never upload data.", work_done="- a")]))
    # Lists of runs, files and names capped low, so trimming drops the older ones.
    limit = data.draw(st.sampled_from([1, 2, 3, deterministic.LIST_ITEMS_MAX]))
    items_max = data.draw(st.sampled_from([None, 1, 2]))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(deterministic, "LIST_ITEMS_MAX", limit)
        scan = fresh_start(entries).scan
        done = 0
        for cut in cuts:
            scan.run(entries[done:cut])
            trim(scan)
            # Through the file's encoding and back, with the results of what follows only.
            line = Snapshot("r", None, max(cut, 1), "x", [], state_of(scan))
            decoded = extract_snapshots._decode(extract_snapshots._encode(line))
            later = {e.call_id: e for e in entries[cut:] if isinstance(e, ToolResultEntry)}
            scan = scan_of(decoded.scan, {**scan.results, **later})
            done = cut
        scan.run(entries[done:])
        got = capsule_from_scan(scan, previous=previous, items_max=items_max)
        whole_scan = fresh_start(entries).scan
        whole_scan.run(entries)
        assert got == capsule_from_scan(whole_scan, previous=previous, items_max=items_max)


def test_a_step_taken_back_after_a_snapshot_leaves_the_work_a_whole_scan_shows() -> None:
    """The newest Work done item at a snapshot can be a step's narration that the next tool
    call takes back; the item before it must still be there (hypothesis found a 133-entry
    session where the trimmed scan said "… and 3 more" and the whole one "… and 4 more")."""
    answers = [MessageEntry(role="assistant", content=f"Answer number {n}.") for n in range(deterministic.WORK_DONE_NEW_LINES + 3)]
    entries: list[Entry] = [MessageEntry(role="user", content="Go on."), *answers]
    after = [
        ToolCallEntry(call_id="c1", name="python", arguments='{"code": "df = load()"}'),
        ToolResultEntry(call_id="c1", name="python", content="ok"),
    ]
    scan = fresh_start(entries).scan
    scan.run(entries)
    trim(scan)
    decoded = extract_snapshots._decode(extract_snapshots._encode(Snapshot("r", None, len(entries), "x", [], state_of(scan))))
    scan = scan_of(decoded.scan, {**scan.results, "c1": after[1]})
    scan.run(after)
    whole = fresh_start([*entries, *after]).scan
    whole.run([*entries, *after])
    got, expected = capsule_from_scan(scan), capsule_from_scan(whole)
    assert got.work_done == expected.work_done
    assert "Answer number 2." in got.work_done and f"Answer number {len(answers) - 1}." not in got.work_done


def test_every_field_of_a_scan_but_its_results_is_in_a_snapshot() -> None:
    fields = set(vars(Scan({})))
    assert fields - {"results"} == set(extract_snapshots.ScanState.__struct_fields__)


# --- the file, following a real transcript ------------------------------------------------


@pytest.fixture
def small_spacing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extract_snapshots, "SPACING", SPACING)
    monkeypatch.setattr(extract_snapshots, "BYTES_PER_ENTRY", 1 << 40)  # spacing not stretched by size


def work(transcript: Transcript, rounds: int, start: int = 0) -> None:
    for index in range(start, start + rounds):
        transcript.append(MessageEntry(role="user", content=f"request {index}: you must keep it under {index} rows"))
        transcript.append(MessageEntry(role="assistant", content=f"Decided to look at segment {index} because of it."))
        transcript.append(ToolCallEntry(call_id=f"c{index}", name="python", arguments=json.dumps({"code": f"df{index} = f()"})))
        transcript.append(ToolResultEntry(call_id=f"c{index}", name="python", content="ok"))


def opened(tmp_path: Path) -> Transcript:
    return Transcript.open(tmp_path / "s.jsonl")


def extract_text(entries: list[Entry], snapshots: ExtractSnapshots | None, upto: int) -> str:
    begun = snapshots.start(entries, upto, capsule_id=None) if snapshots else fresh_start(entries)
    begun.scan.run(entries[begun.covered : upto])
    return repr(capsule_from_scan(begun.scan))


def test_following_a_session_leaves_snapshots_a_summary_starts_from(tmp_path: Path, small_spacing: None) -> None:
    transcript = opened(tmp_path)
    snapshots = ExtractSnapshots(transcript.file)
    for chunk in range(10):
        work(transcript, 5, chunk * 5)
        snapshots.follow(transcript.path_view(), None)
    assert snapshots.written >= 4
    path = list(transcript.path_view())
    for upto in (1, 9, 30, len(path) - 7, len(path)):
        # A new reader (a resumed kernel) starts from the newest snapshot at or before `upto`.
        reader = ExtractSnapshots(transcript.file)
        begun = reader.start(path, upto, capsule_id=None)
        assert begun.covered == max((line.covers for line in reader.lines() if line.covers <= upto), default=0)
        if upto >= len(path) - 7:  # near the leaf, where a summary's boundary lies: a short way back
            assert upto - begun.covered < 2 * snapshots.spacing
        assert extract_text(path, reader, upto) == extract_text(path, None, upto)
    # Another capsule's region, or none at all: not used.
    assert ExtractSnapshots(transcript.file).start(path, len(path), capsule_id="other").covered == 0
    transcript.close()


def test_a_summary_request_is_the_same_with_snapshots_as_without(tmp_path: Path, small_spacing: None) -> None:
    transcript = opened(tmp_path)
    work(transcript, 60)
    snapshots = ExtractSnapshots(transcript.file)
    snapshots.follow(transcript.path_view(), None)
    path = list(transcript.path_view())
    args = dict(previous=None, focus=None, max_input_tokens=2_500, count=COUNTER.count_text)
    plain = build_summary_prompt(path, **args)  # type: ignore[arg-type]
    reader = ExtractSnapshots(transcript.file)
    started = build_summary_prompt(path, **args, scans=lambda e, upto: reader.start(e, upto, capsule_id=None))  # type: ignore[arg-type]
    assert plain.dropped > SPACING
    assert started == plain
    capsule = build_deterministic_capsule(path[:-4], kept=path[-4:], scans=lambda e, upto: reader.start(e, upto, capsule_id=None))
    assert capsule == build_deterministic_capsule(path[:-4], kept=path[-4:])
    transcript.close()


def test_after_a_rewind_only_snapshots_on_the_path_are_used(tmp_path: Path, small_spacing: None) -> None:
    transcript = opened(tmp_path)
    work(transcript, 10)
    back_to = transcript.path_view()[13].id
    work(transcript, 10, 10)
    snapshots = ExtractSnapshots(transcript.file)
    snapshots.follow(transcript.path_view(), None)
    transcript.rewind(back_to)
    work(transcript, 10, 100)  # another branch from entry 13 on
    path = list(transcript.path_view())
    reader = ExtractSnapshots(transcript.file)
    assert reader.start(path, len(path), capsule_id=None).covered <= 14
    assert extract_text(path, reader, len(path)) == extract_text(path, None, len(path))
    # Following the new branch replaces what belongs to the old one.
    snapshots.follow(path, None)
    assert all(line.covers <= 14 or path[line.covers - 1].id == line.last for line in ExtractSnapshots(transcript.file).lines())
    transcript.close()


def test_a_call_read_unanswered_voids_the_snapshot_once_its_result_arrives(tmp_path: Path, small_spacing: None) -> None:
    transcript = opened(tmp_path)
    transcript.append(MessageEntry(role="user", content="run it"))
    transcript.append(ToolCallEntry(call_id="slow", name="shell", arguments=json.dumps({"command": "make"})))
    for index in range(20):  # long enough for the call to count as never answered
        transcript.append(MessageEntry(role="assistant", content=f"still going {index}"))
    work(transcript, 20)
    snapshots = ExtractSnapshots(transcript.file)
    snapshots.follow(transcript.path_view(), None)
    assert snapshots.written and all("slow" in line.unanswered for line in snapshots.lines())
    transcript.append(ToolResultEntry(call_id="slow", name="shell", content="exit status: 2", is_error=True))
    path = list(transcript.path_view())
    assert ExtractSnapshots(transcript.file).start(path, len(path), capsule_id=None).covered == 0
    text = extract_text(path, ExtractSnapshots(transcript.file), len(path))
    assert "shell `make` → exit status 2" in text
    transcript.close()


def test_a_recent_call_without_its_result_stops_the_scan_before_it(tmp_path: Path, small_spacing: None) -> None:
    transcript = opened(tmp_path)
    work(transcript, 20)
    transcript.append(ToolCallEntry(call_id="running", name="shell", arguments=json.dumps({"command": "make"})))
    before = len(transcript.path_view()) - 1
    snapshots = ExtractSnapshots(transcript.file)
    snapshots.follow(transcript.path_view(), None)
    assert snapshots.lines() and max(line.covers for line in snapshots.lines()) <= before
    assert all(not line.unanswered for line in snapshots.lines())
    transcript.close()


# --- a cache, never the truth --------------------------------------------------------------


def test_a_torn_or_foreign_line_is_skipped_and_the_next_writer_starts_a_clean_line(tmp_path: Path, small_spacing: None) -> None:
    transcript = opened(tmp_path)
    work(transcript, 10)
    snapshots = ExtractSnapshots(transcript.file)
    snapshots.follow(transcript.path_view(), None)
    count = len(snapshots.lines())
    file = snapshots_path(transcript.file)
    with file.open("ab") as handle:
        handle.write(b'{"region": "x", "covers": 3, "scan": {"user_mess')  # killed mid-write
    assert len(ExtractSnapshots(transcript.file).lines()) == count
    work(transcript, 40, 10)
    again = ExtractSnapshots(transcript.file)
    again.follow(transcript.path_view(), None)
    assert again.written and len(ExtractSnapshots(transcript.file).lines()) == len(again.lines())
    file.write_bytes(b'{"extractSnapshots": 0}\n' + b"garbage\n")  # other rules: ignored, then replaced
    assert ExtractSnapshots(transcript.file).lines() == []
    path = list(transcript.path_view())
    assert extract_text(path, ExtractSnapshots(transcript.file), len(path)) == extract_text(path, None, len(path))
    transcript.close()


def test_a_symlink_or_fifo_in_its_place_is_not_followed(tmp_path: Path, small_spacing: None) -> None:
    transcript = opened(tmp_path)
    work(transcript, 10)
    file = snapshots_path(transcript.file)
    target = tmp_path / "elsewhere.txt"
    target.write_text("not ours\n")
    file.symlink_to(target)
    snapshots = ExtractSnapshots(transcript.file)
    assert snapshots.lines() == []
    snapshots.follow(transcript.path_view(), None)
    assert target.read_text() == "not ours\n"
    file.unlink()
    os.mkfifo(file)
    reader = ExtractSnapshots(transcript.file)
    assert reader.lines() == []  # returns at once: a FIFO is not opened for reading
    transcript.close()


def test_no_secret_reaches_the_file(tmp_path: Path, small_spacing: None) -> None:
    # Entries straight from memory (not through the transcript, which redacts on its own).
    key = "sk-proj-" + "a1B2" * 10
    entries: list[Entry] = []
    for index in range(12):
        entries.append(MessageEntry(role="user", content=f"use {key} and never print it ({index})"))
        entries.append(ToolCallEntry(call_id=f"c{index}", name="shell", arguments=json.dumps({"command": f"curl -H 'Authorization: Bearer {key}' x"})))
        entries.append(ToolResultEntry(call_id=f"c{index}", name="shell", content="exit status: 0"))
    snapshots = ExtractSnapshots(tmp_path / "s.jsonl")
    snapshots.follow(entries, None)
    assert snapshots.written
    text = snapshots_path(tmp_path / "s.jsonl").read_text()
    assert key not in text and "a1B2a1B2" not in text
    assert "[redacted]" in text


def test_the_file_keeps_few_snapshots_however_long_the_region(tmp_path: Path, small_spacing: None) -> None:
    transcript = opened(tmp_path)
    snapshots = ExtractSnapshots(transcript.file)
    for chunk in range(60):
        work(transcript, 4, chunk * 4)
        snapshots.follow(transcript.path_view(), None)
    lines = ExtractSnapshots(transcript.file).lines()
    assert snapshots.written >= 50
    assert len(lines) <= extract_snapshots.MAX_LINES
    covers = [line.covers for line in lines]
    assert covers == sorted(covers) and covers[-1] >= len(transcript.path_view()) - 2 * SPACING
    transcript.close()


def test_a_big_snapshot_waits_longer_for_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extract_snapshots, "SPACING", SPACING)
    transcript = opened(tmp_path)
    for index in range(40):  # 40 distinct runs of long code: a scan of some kilobytes
        transcript.append(ToolCallEntry(call_id=f"k{index}", name="shell", arguments=json.dumps({"command": f"echo {index} " + "x" * 250})))
        transcript.append(ToolResultEntry(call_id=f"k{index}", name="shell", content="exit status: 0"))
    snapshots = ExtractSnapshots(transcript.file)
    snapshots.follow(transcript.path_view(), None)
    size = len(snapshots_path(transcript.file).read_bytes().splitlines()[-1])
    assert snapshots.spacing == max(SPACING, (size + 1) // extract_snapshots.BYTES_PER_ENTRY) > SPACING
    covers = [line.covers for line in snapshots.lines()]
    assert all(later - earlier >= SPACING for earlier, later in zip(covers, covers[1:], strict=False))
    transcript.close()


def spy_on_starts(patch: pytest.MonkeyPatch, started: list[int]) -> None:
    """Record how many entries each `ExtractSnapshots.start` had covered already."""
    original = ExtractSnapshots.start

    def spying(self: ExtractSnapshots, entries: list[Entry], upto: int, *, capsule_id: str | None) -> object:
        begun = original(self, entries, upto, capsule_id=capsule_id)
        started.append(begun.covered)
        return begun

    patch.setattr(ExtractSnapshots, "start", spying)


def test_preflights_keep_the_snapshots_and_a_compaction_starts_from_them(tmp_path: Path, small_spacing: None) -> None:
    from compaction_support import FakeSummarizer, add_exchange, make_compactor, thresholds

    from soba_nb.compaction.triggers import TurnState

    transcript = opened(tmp_path)
    summarizer = FakeSummarizer()
    compactor = make_compactor(transcript, thresholds(hard=200_000, auto=False), summarizer=summarizer)
    for index in range(60):
        add_exchange(transcript, 40, tool_tokens=30, index=index)
        assert compactor.preflight(TurnState()) is None
    assert compactor.snapshots.written >= 10
    assert snapshots_path(transcript.file).exists()

    started: list[int] = []
    compactor.update_settings(replace(compactor.settings, thresholds=thresholds(hard=3_000, auto=False)))
    with pytest.MonkeyPatch.context() as patch:
        spy_on_starts(patch, started)
        with_snapshots = compactor.make_capsule()
        compactor.snapshots = ExtractSnapshots(tmp_path / "none.jsonl")  # no snapshots: scans from the first entry
        without = compactor.make_capsule()
    assert started[0] > 0 and started[-1] == 0  # the first capsule started from a snapshot
    assert with_snapshots is not None and without is not None
    assert summarizer.calls[0]["user"] == summarizer.calls[1]["user"]
    assert "<extract_of_older_history" in str(summarizer.calls[0]["user"])
    assert with_snapshots.content == without.content
    transcript.close()


def test_after_a_compaction_the_region_from_the_capsules_kept_tail_is_followed(tmp_path: Path, small_spacing: None) -> None:
    from compaction_support import FakeSummarizer, add_exchange, make_compactor, thresholds

    from soba_nb.compaction.outcomes import Outcome
    from soba_nb.compaction.triggers import TurnState

    transcript = opened(tmp_path)
    summarizer = FakeSummarizer()
    compactor = make_compactor(transcript, thresholds(hard=200_000, auto=False, keep=300), summarizer=summarizer)
    for index in range(20):
        add_exchange(transcript, 40, tool_tokens=30, index=index)
    assert compactor.compact().outcome is Outcome.COMPLETED
    compactor.measure()
    path = transcript.path_view()
    capsule_at = compactor.tracker.capsule_index
    assert capsule_at is not None and path[capsule_at].first_kept_entry_id is not None  # a kept tail before it
    for index in range(20, 70):
        add_exchange(transcript, 40, tool_tokens=30, index=index)
        assert compactor.preflight(TurnState()) is None
    lines = ExtractSnapshots(transcript.file).lines()
    assert lines and {line.capsule for line in lines} == {path[capsule_at].id}

    compactor.update_settings(replace(compactor.settings, thresholds=thresholds(hard=3_000, auto=False, keep=300)))
    calls = len(summarizer.calls)
    started: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        spy_on_starts(patch, started)
        compactor.make_capsule()
        compactor.snapshots = ExtractSnapshots(tmp_path / "none.jsonl")
        compactor.make_capsule()
    assert started[0] > 0 and started[-1] == 0
    first, second = summarizer.calls[calls:]
    assert first["user"] == second["user"]
    transcript.close()


def test_a_try_that_takes_nothing_is_not_repeated_at_every_preflight(tmp_path: Path, small_spacing: None) -> None:
    transcript = opened(tmp_path)
    work(transcript, 20)
    snapshots = ExtractSnapshots(transcript.file)
    snapshots.follow(transcript.path_view(), None)
    transcript.append(ToolCallEntry(call_id="running", name="shell", arguments=json.dumps({"command": "make"})))
    for index in range(SPACING - 1):  # the region grows, but a call waits among its newest entries
        transcript.append(MessageEntry(role="assistant", content=f"waiting {index}"))
    tries: list[int] = []
    original = ExtractSnapshots._advance

    def counting(self: ExtractSnapshots, entries: list[Entry], capsule_id: str | None) -> None:
        tries.append(len(entries))
        original(self, entries, capsule_id)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ExtractSnapshots, "_advance", counting)
        for _ in range(5):
            snapshots.follow(transcript.path_view(), None)
        assert len(tries) == 1
        work(transcript, SPACING, 100)  # a spacing later it is tried again
        transcript.append(ToolResultEntry(call_id="running", name="shell", content="exit status: 0"))
        snapshots.follow(transcript.path_view(), None)
        assert len(tries) == 2
    transcript.close()


def test_a_capsule_takes_the_newest_runs_and_files_and_says_the_older_are_left_out() -> None:
    entries: list[Entry] = []
    for index in range(deterministic.LIST_ITEMS_MAX + 5):
        entries.append(ToolCallEntry(call_id=f"c{index}", name="shell", arguments=json.dumps({"command": f"echo {index} > out{index}.csv"})))
        entries.append(ToolResultEntry(call_id=f"c{index}", name="shell", content="exit status: 0"))
    capsule = build_deterministic_capsule(entries)
    verification = capsule.verification.splitlines()
    assert verification[0] == f"- {deterministic.OLDER_LEFT_OUT}"
    assert len(verification) == deterministic.LIST_ITEMS_MAX + 1
    assert "echo 4 >" not in capsule.verification and f"echo {deterministic.LIST_ITEMS_MAX + 4} >" in capsule.verification
    assert capsule.files_modified.splitlines()[0] == f"- {deterministic.OLDER_LEFT_OUT}"
    extract = build_summary_prompt(entries, previous=None, focus=None, max_input_tokens=6_000, count=COUNTER.count_text)
    assert extract.dropped > 0 and extract.user.count("→ exit status 0") <= deterministic.EXTRACT_ITEMS_MAX + 20


def test_a_failure_keeping_the_snapshots_never_fails_the_request(tmp_path: Path) -> None:
    from compaction_support import add_exchange, make_compactor, thresholds

    from soba_nb.compaction.triggers import TurnState

    transcript = opened(tmp_path)
    compactor = make_compactor(transcript, thresholds(hard=200_000, auto=False))
    add_exchange(transcript, 40, tool_tokens=30)

    def broken(path: object, capsule_at: object) -> None:
        raise OSError("disk on fire")

    assert compactor.snapshots is not None
    compactor.snapshots.follow = broken  # type: ignore[method-assign]
    with pytest.warns(RuntimeWarning, match="extract snapshots given up for this session .OSError: disk on fire"):
        assert compactor.preflight(TurnState()) is None
    assert compactor.snapshots is None
    assert compactor.preflight(TurnState()) is None  # and the next request does not try again
    transcript.close()


def test_a_long_region_opened_cold_is_left_to_its_summary_and_a_lagging_one_catches_up_in_steps(
    tmp_path: Path, small_spacing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28: a transcript copied without its `.extract` is not scanned whole at its first
    preflight; snapshots that lag are carried forward a bounded stretch per preflight."""
    monkeypatch.setattr(extract_snapshots, "CATCH_UP_ENTRIES", 4 * SPACING)
    transcript = opened(tmp_path)
    work(transcript, 30)  # 120 entries, no snapshot yet
    cold = ExtractSnapshots(transcript.file)
    cold.follow(transcript.path_view(), None)
    assert cold.written == 0 and not snapshots_path(transcript.file).exists()
    path = list(transcript.path_view())
    assert extract_text(path, cold, len(path)) == extract_text(path, None, len(path))

    (tmp_path / "live").mkdir()
    fresh = opened(tmp_path / "live")
    work(fresh, 6)  # a live session: snapshots from the start
    following = ExtractSnapshots(fresh.file)
    following.follow(fresh.path_view(), None)
    assert following.written >= 1
    work(fresh, 30, 6)  # then a long stretch with no preflight
    following.follow(fresh.path_view(), None)
    covers = [line.covers for line in ExtractSnapshots(fresh.file).lines()]
    assert covers[-1] - covers[-2] <= 4 * SPACING + SPACING and covers[-1] < len(fresh.path_view()) - SPACING
    for _ in range(10):
        following.follow(fresh.path_view(), None)
    assert ExtractSnapshots(fresh.file).lines()[-1].covers >= len(fresh.path_view()) - 2 * SPACING
    path = list(fresh.path_view())
    assert extract_text(path, ExtractSnapshots(fresh.file), len(path)) == extract_text(path, None, len(path))
    transcript.close()
    fresh.close()
