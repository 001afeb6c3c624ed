"""Every folder soba writes into is its own, and only a transcript is adopted (SPEC §16).

Found by review (issue 40):
- with `%soba --session logs/mine.jsonl`, the session's stores `logs/files/` and
  `logs/artifacts/` were writable by the agent's file tools (`write_file logs/files/abc`);
- a session folder that is a link out (`analysis.soba -> elsewhere`) received the transcript
  and its side-cars, and a `.soba/memory` that is a link out received mirrored capsules;
- an empty existing file was adopted as a transcript (`--session empty.jsonl`, its 0644 mode
  kept);
- a latest transcript skipped because it is a link started a new session without a word.
"""

from __future__ import annotations

import os

import pytest
from conftest import SMALL_LIMITS, write_soba_json
from IPython.core.error import UsageError
from llm_server import text, tool_calls

from soba_nb.transcript.entries import ToolResultEntry


def agent_of(ip):
    return ip.magics_manager.registry["SobaMagics"].agent


def test_the_stores_of_a_session_elsewhere_are_refused_to_the_file_tools(ip, nb_dir, scripted):
    (nb_dir / "logs" / "files").mkdir(parents=True)
    kept = nb_dir / "logs" / "files" / ("0" * 64)
    kept.write_text("version\n")
    scripted.script(text("Started."))
    ip.run_line_magic("soba", "--session logs/mine.jsonl --new hello")
    calls = [
        ("write_file", {"path": "logs/files/abc", "content": "x"}),
        ("write_file", {"path": "logs/artifacts/abc.png", "content": "x"}),
        ("edit_file", {"path": f"logs/files/{kept.name}", "old": "version", "new": "forged"}),
        ("write_file", {"path": ".soba/memory/evil.capsule.md", "content": "x"}),
        ("write_file", {"path": "logs/notes.txt", "content": "x"}),
        ("write_file", {"path": "notes.txt", "content": "the agent's own work is fine"}),
    ]
    scripted.script(tool_calls(*calls), text("Done."))
    ip.run_line_magic("soba", "tidy up logs/")
    assert not (nb_dir / "logs" / "files" / "abc").exists()
    assert not (nb_dir / "logs" / "artifacts").exists()
    assert kept.read_text() == "version\n"
    assert not (nb_dir / ".soba").exists()
    assert not (nb_dir / "logs" / "notes.txt").exists()
    assert (nb_dir / "notes.txt").read_text() == "the agent's own work is fine"
    outcomes = [e for e in agent_of(ip).transcript.path() if isinstance(e, ToolResultEntry)][-len(calls):]
    for outcome in outcomes[:-1]:
        assert outcome.is_error and "is one of soba's own files" in outcome.content, outcome.content
    assert not outcomes[-1].is_error


def test_a_session_in_the_project_folder_guards_its_own_files_and_stores_only(ip, nb_dir, scripted):
    scripted.script(text("Started."))
    ip.run_line_magic("soba", "--session mine.jsonl --new hello")
    calls = [
        ("write_file", {"path": "files/abc", "content": "x"}),
        ("write_file", {"path": "artifacts/abc.png", "content": "x"}),
        ("write_file", {"path": "mine.tokens", "content": "x"}),
        ("write_file", {"path": "notes.txt", "content": "the agent's own work is fine"}),
    ]
    scripted.script(tool_calls(*calls), text("Done."))
    ip.run_line_magic("soba", "write notes")
    assert not (nb_dir / "files" / "abc").exists() and not (nb_dir / "artifacts" / "abc.png").exists()
    assert (nb_dir / "notes.txt").read_text() == "the agent's own work is fine"
    outcomes = [e for e in agent_of(ip).transcript.path() if isinstance(e, ToolResultEntry)][-len(calls):]
    assert [o.is_error for o in outcomes] == [True, True, True, False], [o.content for o in outcomes]


def test_a_session_folder_that_is_a_link_is_refused_never_written_through(ip, nb_dir, scripted, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (nb_dir / "analysis.soba").symlink_to(outside)
    with pytest.raises(UsageError) as refused:
        ip.run_line_magic("soba", "hello")
    message = str(refused.value)
    assert "analysis.soba: the session folder is a link" in message and "\n" not in message
    with pytest.raises(UsageError, match="analysis.soba: the session folder is a link"):
        ip.run_line_magic("soba", "--new hello")
    (nb_dir / "logs").symlink_to(outside)
    with pytest.raises(UsageError) as named:
        ip.run_line_magic("soba", "--session logs/mine.jsonl --new hello")
    assert "logs: the session folder is a link" in str(named.value) and "\n" not in str(named.value)
    assert os.listdir(outside) == []
    assert not [r for r in scripted.server.requests if r.operation == "inference"]


def test_a_memory_folder_that_is_a_link_receives_no_capsule(ip, nb_dir, scripted, tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    (nb_dir / ".soba").mkdir()
    (nb_dir / ".soba" / "memory").symlink_to(outside)
    write_soba_json(nb_dir, scripted.server.url, SMALL_LIMITS)
    ip.run_line_magic("auto_compact", "off")
    for index in range(4):
        scripted.script(text(f"Answer {index}. " + "The dataframe has columns a, b and c. " * 40))
        ip.run_line_magic("soba", f"question {index}: describe the data")
    capsys.readouterr()
    ip.run_line_magic("compact", "")
    out = capsys.readouterr().out
    assert "Compacted (user)" in out
    assert "warning: not mirrored to project memory:" in out and ".soba/memory: is a link" in out
    assert os.listdir(outside) == []


def test_an_empty_existing_file_is_never_adopted(ip, nb_dir, scripted):
    empty = nb_dir / "empty.jsonl"
    empty.touch()
    empty.chmod(0o644)
    with pytest.raises(UsageError) as refused:
        ip.run_line_magic("soba", "--session empty.jsonl hello")
    message = str(refused.value)
    assert "empty.jsonl: not a soba transcript (an empty file); left untouched" in message and "\n" not in message
    assert empty.read_bytes() == b"" and empty.stat().st_mode & 0o777 == 0o644
    # a new session at a new path is still made, with its header, private
    scripted.script(text("Started."))
    ip.run_line_magic("soba", "--session fresh.jsonl --new hello")
    fresh = nb_dir / "fresh.jsonl"
    assert fresh.read_bytes().startswith(b'{"type":"session"') and fresh.stat().st_mode & 0o777 == 0o600


def test_an_empty_file_in_the_sessions_folder_is_not_resumed(ip, nb_dir, scripted):
    folder = nb_dir / "analysis.soba"
    folder.mkdir()
    (folder / "20990101T000000Z-0000.jsonl").touch()
    scripted.script(text("Started."))
    ip.run_line_magic("soba", "hello")
    assert agent_of(ip).file.name != "20990101T000000Z-0000.jsonl"
    assert (folder / "20990101T000000Z-0000.jsonl").read_bytes() == b""


def test_a_latest_transcript_skipped_because_it_is_a_link_is_named(ip, nb_dir, scripted, tmp_path, capsys):
    folder = nb_dir / "analysis.soba"
    folder.mkdir()
    planted = tmp_path / "planted.jsonl"
    planted.write_text('{"type":"session"}\n')
    (folder / "20990101T000000Z-0000.jsonl").symlink_to(planted)
    scripted.script(text("Started."))
    ip.run_line_magic("soba", "hello")
    agent = agent_of(ip)
    lines = [line for line in capsys.readouterr().out.splitlines() if "a link" in line]
    assert lines == [
        f"analysis.soba/20990101T000000Z-0000.jsonl: a link, so not resumed (soba never writes a transcript "
        f"through a link); new session {agent.session_id} (analysis.soba/{agent.file.name})"
    ]
    assert planted.read_text() == '{"type":"session"}\n'
