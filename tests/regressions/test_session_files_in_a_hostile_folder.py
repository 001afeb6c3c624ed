"""Soba's own files in a hostile folder (SPEC §12): only its transcripts are opened, never
through a link, and a transcript deleted under a writer is noticed.

Found under attack:
- `%soba --session notes.md` warned about "torn lines" and appended the session to the user's
  Markdown; run as root, it appended JSON lines to a system file the same way;
- a symlink named like a transcript (or `flight.jsonl`) pointing outside the project received
  27 KB of session (1.5 KB of flight records);
- after `rm` of the open transcript the kernel kept appending to the deleted inode: 3 of 3
  acknowledged entries gone, no error;
- `--session` with a 5,000-character name ended in a raw `OSError [Errno 36]`.
"""

from __future__ import annotations

import os
import warnings

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from llm_server import text

from soba_nb.compaction.flight import FlightRecordWarning
from soba_nb.transcript.entries import MessageEntry
from soba_nb.transcript.store import Transcript

NOTES = "# My notes\n\nThe revenue column is in cents.\n"


def agent_of(ip):
    return ip.magics_manager.registry["SobaMagics"].agent


def usage_error(ip, line: str) -> str:
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("soba", line)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_session_opens_only_a_transcript(ip, nb_dir, scripted):
    notes = nb_dir / "notes.md"
    notes.write_text(NOTES)
    system = nb_dir / "passwd"
    system.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n")
    jsonl = nb_dir / "data.jsonl"
    jsonl.write_text('{"user": "ada", "score": 3}\n{"user": "bob", "score": 5}\n')
    for target in (notes, system, jsonl):
        before = target.read_bytes()
        for line in (f"--session {target.name} hello", f"--session {target.name} --new hello", f"--session {target} hello"):
            assert "not a soba transcript" in usage_error(ip, line)
        assert target.read_bytes() == before  # untouched
    assert "must end in .jsonl" in usage_error(ip, "--session new-notes.md --new hello")
    assert not (nb_dir / "new-notes.md").exists()
    assert scripted.server.requests == []
    # A new transcript where one was asked for, and an existing one, both work.
    scripted.script(text("New session."), text("Resumed."))
    ip.run_line_magic("soba", "--session work.jsonl --new hello")
    ip.run_line_magic("soba", "--session work.jsonl and again")
    assert len([e for e in Transcript.load(nb_dir / "work.jsonl").path() if isinstance(e, MessageEntry)]) == 4


def test_a_sessions_folder_given_as_the_session_is_one_line_naming_its_latest(ip, nb_dir, scripted):
    """`%soba --session analysis.soba` was "[Errno 21] Is a directory: '…/analysis.soba'"."""
    folder = nb_dir / "analysis.soba"
    folder.mkdir(exist_ok=True)
    for line in (f"--session {folder} hello", f"--session {folder} --new hello"):
        assert usage_error(ip, line) == f"%soba --session: {folder} is a folder, not a session transcript (.jsonl)"
    assert scripted.server.requests == []
    scripted.script(text("Started."))
    ip.run_line_magic("soba", f"--session {folder / 'work.jsonl'} --new hello")
    sent = len(scripted.server.requests)
    assert usage_error(ip, f"--session {folder} again") == (
        f"%soba --session: {folder} is a folder, not a session transcript (.jsonl); "
        f"its latest session is {folder / 'work.jsonl'}"
    )
    assert len(scripted.server.requests) == sent  # nothing sent for it


def test_a_name_too_long_is_one_line(ip, nb_dir):
    message = usage_error(ip, f"--session {'n' * 5000}.jsonl --new hello")
    assert "5,006 bytes long" in message and "at most 255" in message


def test_links_planted_in_the_session_folder_are_never_written_through(ip, nb_dir, scripted, tmp_path):
    scripted.script(text("Started."))
    ip.run_line_magic("soba", "hello")
    agent = agent_of(ip)
    folder = agent.file.parent
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.jsonl"
    victim.write_bytes(agent.file.read_bytes())  # a transcript, so only the link gives it away
    flight_victim = outside / "flight-victim.txt"
    flight_victim.write_text("keep me\n")
    planted = folder / "29991231T235959Z-ffff.jsonl"  # sorts and dates as the newest session
    planted.symlink_to(victim)
    os.utime(victim, (2**33, 2**33))
    (folder / "flight.jsonl").unlink(missing_ok=True)
    (folder / "flight.jsonl").symlink_to(flight_victim)
    victim_before = victim.read_bytes()

    magics = ip.magics_manager.registry["SobaMagics"]
    magics.close()  # as after a kernel restart: the folder's latest session is looked for again
    scripted.script(text("Resumed, not through the link."))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ip.run_line_magic("soba", "continue")
        with capture_output():
            ip.run_line_magic("compact", "")
    assert agent_of(ip).file != planted
    assert "is a link" in usage_error(ip, f"--session {planted} hello")
    assert victim.read_bytes() == victim_before
    assert flight_victim.read_text() == "keep me\n"
    assert any(issubclass(w.category, FlightRecordWarning) for w in caught)


def test_a_transcript_deleted_under_the_writer_is_noticed(ip, nb_dir, scripted, capsys):
    scripted.script(text("First."))
    ip.run_line_magic("soba", "hello")
    file = agent_of(ip).file
    file.unlink()
    scripted.script(text("Into the void?"))
    ip.run_line_magic("soba", "are you writing somewhere?")
    out = capsys.readouterr().out
    assert "the transcript was deleted" in out and "%soba --new" in out
    assert "Traceback" not in out
    assert not file.exists()
    scripted.inference.clear()
    scripted.script(text("A new session."))
    ip.run_line_magic("soba", "--new start over")
    assert "A new session." in capsys.readouterr().out


def test_a_transcript_replaced_under_the_writer_is_noticed(ip, nb_dir, scripted, capsys):
    scripted.script(text("First."))
    ip.run_line_magic("soba", "hello")
    file = agent_of(ip).file
    replacement = file.with_name("copy.tmp")
    replacement.write_bytes(file.read_bytes())
    replacement.replace(file)  # e.g. a sync tool or `git checkout` putting another file there
    before = file.read_bytes()
    ip.run_line_magic("soba", "still there?")
    out = capsys.readouterr().out
    assert "replaced by another file" in out
    assert file.read_bytes() == before


def test_a_files_refusal_by_the_system_is_its_path_and_reason():
    """What a magic shows for an `OSError` on a file: the file and the system's reason, the
    way a shell tool says it, never Python's `[Errno N]` and the repr of the path."""
    from soba_nb.notebook.arguments import error_line

    for exc, shown in (
        (IsADirectoryError(21, "Is a directory", "/nb/analysis.soba"), "/nb/analysis.soba: Is a directory"),
        (PermissionError(13, "Permission denied", "/nb/s.jsonl"), "/nb/s.jsonl: Permission denied"),
        (OSError(28, "No space left on device"), "No space left on device"),
        (ValueError("first line\nsecond"), "first line"),
    ):
        assert error_line(exc) == shown
