"""What a capsule replaced and what it leaves out (SPEC §14, `soba_nb.compaction.capsule_diff`)."""

from __future__ import annotations

import json

from compaction_support import good_summary

from soba_nb.compaction.capsule_diff import capsule_diff, replaced_span, request_mentioned
from soba_nb.transcript.entries import (
    CapsuleEntry,
    Entry,
    FileChange,
    MessageEntry,
    SessionEntry,
    ToolCallEntry,
    ToolResultEntry,
)

SHA = "0" * 64


def capsule(content: str, first_kept: str | None, *, checkpoint: str = "ck_00000001", amends: str | None = None) -> CapsuleEntry:
    return CapsuleEntry(
        operation_id="op", checkpoint_id=checkpoint, trigger="user", quality="full", tokens_before=100,
        tokens_after=10, first_kept_entry_id=first_kept, content=content, amends=amends,
    )


def call(call_id: str, name: str, **arguments: str) -> ToolCallEntry:
    return ToolCallEntry(call_id=call_id, name=name, arguments=json.dumps(arguments))


def result(call_id: str, name: str, *, files: list[str] | None = None) -> ToolResultEntry:
    changes = [FileChange(path=p, before=None, after=SHA) for p in files] if files else None
    return ToolResultEntry(call_id=call_id, name=name, content="ok", **({"files": changes} if changes else {}))


def session() -> list[Entry]:
    """A fix typed as `/fix`, a read, a python write, an edit, then a kept request."""
    return [
        SessionEntry(),
        MessageEntry(role="user", content="Find the cause of this error…\nKeyError: 'region'", typed="/fix use the region column"),
        call("c1", "read_file", path="data.csv"),
        result("c1", "read_file"),
        call("c2", "python", code="clean = df.dropna()\nclean.to_csv('clean.csv')"),
        result("c2", "python"),
        MessageEntry(role="user", content="keep refunds out of revenue, finance books them separately"),
        call("c3", "edit_file", path="report.py", old="a", new="b"),
        result("c3", "edit_file", files=["report.py"]),
        MessageEntry(role="assistant", content="Done."),
        MessageEntry(role="user", content="now plot revenue by month"),  # the kept tail starts here
        MessageEntry(role="assistant", content="Plotted."),
    ]


def with_capsule(entries: list[Entry], text: str) -> list[Entry]:
    return [*entries, capsule(text, entries[10].id)]


def items(text: str) -> dict[str, bool]:
    path = with_capsule(session(), text)
    diff = capsule_diff(path, len(path) - 1)
    return {f"{item.kind}: {item.text}": item.mentioned for item in diff.items}


def test_lists_requests_as_typed_calls_and_files_of_the_replaced_span():
    listed = items(good_summary())
    assert list(listed) == [
        "request: /fix use the region column",
        "tool call: read_file data.csv",
        "tool call: python clean = df.dropna()",
        "request: keep refunds out of revenue, finance books them separately",
        "tool call: edit_file report.py",
        "file read: data.csv",
        "file written: report.py",
        "file written: clean.csv",
    ]
    # good_summary says "- loaded data.csv": the file and the read call are mentioned, nothing else.
    assert [name for name, mentioned in listed.items() if mentioned] == ["tool call: read_file data.csv", "file read: data.csv"]


def test_what_the_capsule_mentions_is_not_marked():
    text = good_summary(
        "The user typed `/fix use the region column`. Decided: keep refunds out of revenue, "
        "as finance books them separately."
    ) + "\n- ran `clean = df.dropna()`; wrote clean.csv and edited report.py\n"
    assert all(items(text).values())


def test_the_kept_tail_and_what_follows_the_capsule_are_not_listed():
    path = with_capsule(session(), good_summary())
    path.append(MessageEntry(role="user", content="after the capsule"))
    diff = capsule_diff(path, len(path) - 2)
    assert not any("plot revenue" in item.text or "after the capsule" in item.text for item in diff.items)
    assert diff.replaced == 9  # the model-visible entries before the kept tail (not the header)


def test_a_repeated_compaction_lists_from_the_previous_capsules_kept_tail():
    first = session()
    path = [*first, capsule(good_summary(), first[6].id, checkpoint="ck_00000001")]
    path += [MessageEntry(role="user", content="third request of the day"), MessageEntry(role="assistant", content="ok")]
    path.append(capsule(good_summary(), path[-2].id, checkpoint="ck_00000002"))
    span = replaced_span(path, len(path) - 1)
    assert span[0] is first[6]  # the previous capsule's first kept entry
    assert span[-1].id == path[-4].id  # up to the new capsule's first kept entry
    texts = [item.text for item in capsule_diff(path, len(path) - 1).of_kind("request")]
    assert texts == ["keep refunds out of revenue, finance books them separately", "now plot revenue by month"]


def test_an_amendment_replaced_what_the_capsule_it_corrects_replaced():
    path = with_capsule(session(), good_summary())
    path.append(MessageEntry(role="user", content="a turn after the compaction"))
    amended = capsule(good_summary() + "\nwrote clean.csv\n", path[10].id, checkpoint="ck_00000002", amends="ck_00000001")
    path.append(amended)
    diff = capsule_diff(path, len(path) - 1)
    assert diff.capsule is amended
    assert replaced_span(path, len(path) - 1) == replaced_span(path, len(path) - 3)
    assert {item.text: item.mentioned for item in diff.of_kind("file written")} == {"report.py": False, "clean.csv": True}


def test_a_capsule_that_keeps_nothing_replaced_everything_before_it():
    path = [*session(), capsule(good_summary(), None)]
    assert len(capsule_diff(path, len(path) - 1).of_kind("request")) == 3


def test_a_request_counts_as_quoted_by_a_clear_part_of_it():
    request = "Please keep refunds out of revenue, finance books them separately, and re-run the totals"
    assert request_mentioned(request, f"> {request}")
    assert request_mentioned(request, "Decided: **keep refunds OUT of revenue** (finance books them separately).")
    assert not request_mentioned(request, "Refunds are handled; revenue is re-run.")  # words, but no run of them
    assert request_mentioned("/fix", "the user typed /fix")
    assert not request_mentioned("/fix", "fixed the KeyError")  # a short request only when quoted as typed
    assert not request_mentioned("go on", "go to the next step, on")
    assert request_mentioned("plot by region", "plot by region")
    assert not request_mentioned("plot the outliers by region", "plot by region, the outliers")


def test_a_call_without_json_arguments_is_listed_by_name():
    entries = session()
    entries[2] = ToolCallEntry(call_id="c1", name="read_file", arguments="{not json")
    listed = items(good_summary())
    assert "tool call: read_file data.csv" in listed
    path = with_capsule(entries, "read_file was called")
    diff = capsule_diff(path, len(path) - 1)
    assert [(i.text, i.mentioned) for i in diff.of_kind("tool call")][0] == ("read_file", True)
