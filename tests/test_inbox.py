"""The session folder's mailbox (`soba_nb.inbox`): written whole, taken in order, a bad file
set aside in one line, never read or written through a link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from disk_support import small_disk

from soba_nb.inbox import Edit, MessageError, Steer, parse, pending, post, take


def test_messages_are_taken_in_sending_order_and_removed(tmp_path: Path):
    inbox = tmp_path / "analysis.soba" / "inbox"
    sent = [Steer(text="steer 0"), Edit(call="call_1", execution_count=4, decision="accepted"), Steer(text="steer 1"), Steer(text="steer 2")]
    names = [post(inbox, message) for message in sent]
    assert pending(inbox) == names == sorted(names)
    taken = take(inbox)
    assert [getattr(m, "text", None) or m.decision for m in taken.messages] == ["steer 0", "accepted", "steer 1", "steer 2"]
    assert taken.problems == [] and os.listdir(inbox) == []
    assert take(inbox).messages == []


def test_the_wire_format_is_the_design_s():
    edit = parse(b'{"kind": "edit", "call": "c1", "executionCount": 4, "decision": "rejected", "sent": "t"}')
    assert edit == Edit(call="c1", execution_count=4, decision="rejected", sent="t")
    assert parse('{"kind": "steer", "text": "hi", "sent": "t"}') == Steer(text="hi", sent="t")
    for bad, says in [
        ('{"kind": "steer", "text": ""}', "text"),
        ('{"kind": "edit", "call": "c", "executionCount": 4, "decision": "maybe"}', "decision"),
        ('{"kind": "shout", "text": "x"}', "kind"),
        ('{"kind": "steer", "text": "x", "extra": 1}', "extra"),
        ("[1]", "not a soba message"),
    ]:
        with pytest.raises(MessageError) as caught:
            parse(bad)
        assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_file_that_is_no_message_is_set_aside_and_said_in_one_line(tmp_path: Path):
    inbox = tmp_path / "inbox"
    post(inbox, Steer(text="first"))
    (inbox / "00000000000000000000-00000000.json").write_bytes(b"\xff\xfe not json")
    outside = tmp_path / "secret.json"
    outside.write_text('{"kind": "steer", "text": "planted"}')
    (inbox / "00000000000000000001-00000000.json").symlink_to(outside)
    (inbox / ".tmp-00000000000000000002-00000000.json").write_text("half")  # being written: left alone
    taken = take(inbox)
    assert [m.text for m in taken.messages if isinstance(m, Steer)] == ["first"]
    assert len(taken.problems) == 2 and all("\n" not in p for p in taken.problems)
    assert taken.problems[0].startswith("inbox: 00000000000000000000-00000000.json is not a message (")
    assert sorted(os.listdir(inbox)) == [
        ".tmp-00000000000000000002-00000000.json",
        "00000000000000000000-00000000.json.bad",
        "00000000000000000001-00000000.json.bad",
    ]
    assert outside.read_text().endswith('"planted"}')  # the link was not followed


def test_an_inbox_that_is_a_link_is_neither_read_nor_written(tmp_path: Path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder = tmp_path / "analysis.soba"
    folder.mkdir()
    (folder / "inbox").symlink_to(elsewhere)
    with pytest.raises(OSError, match="is a link"):
        post(folder / "inbox", Steer(text="x"))
    (elsewhere / "00000000000000000000-00000000.json").write_text('{"kind": "steer", "text": "x"}')
    taken = take(folder / "inbox")
    assert taken.messages == [] and taken.problems == [f"inbox: {folder / 'inbox'} is a link; not read"]
    assert os.listdir(elsewhere) == ["00000000000000000000-00000000.json"]


def test_a_full_disk_leaves_no_half_written_message(tmp_path: Path):
    with small_disk(tmp_path / "disk", 64 * 1024) as disk:
        inbox = disk / "analysis.soba" / "inbox"
        post(inbox, Steer(text="fits"))
        filler = disk / "filler"
        with pytest.raises(OSError), open(filler, "wb") as out:  # noqa: PT012 - fill the disk, then fail
            while True:
                out.write(b"x" * 4096)
        with pytest.raises(OSError):
            post(inbox, Steer(text="y" * 90_000))
        assert [n for n in os.listdir(inbox)] == pending(inbox) and len(pending(inbox)) == 1
        assert [m.text for m in take(inbox).messages if isinstance(m, Steer)] == ["fits"]


def test_a_message_whose_entry_could_not_be_written_stays_for_next_time(tmp_path: Path):
    inbox = tmp_path / "inbox"
    post(inbox, Steer(text="first"))
    post(inbox, Steer(text="second"))
    accepted: list[str] = []

    def full_disk(message: object) -> None:
        if accepted:
            raise OSError(28, "No space left on device")
        accepted.append(getattr(message, "text", ""))

    with pytest.raises(OSError):
        take(inbox, full_disk)
    assert accepted == ["first"] and len(pending(inbox)) == 1
    assert [m.text for m in take(inbox).messages if isinstance(m, Steer)] == ["second"]
