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
        ("write_file", {"path": "logs/notes.txt", "content": "the agent's own work is fine"}),
    ]
    scripted.script(tool_calls(*calls), text("Done."))
    ip.run_line_magic("soba", "tidy up logs/")
    assert not (nb_dir / "logs" / "files" / "abc").exists()
    assert not (nb_dir / "logs" / "artifacts").exists()
    assert kept.read_text() == "version\n"
    assert not (nb_dir / ".soba").exists()
    assert (nb_dir / "logs" / "notes.txt").read_text() == "the agent's own work is fine"
    outcomes = [e for e in agent_of(ip).transcript.path() if isinstance(e, ToolResultEntry)][-len(calls):]
    for outcome in outcomes[:-1]:
        assert outcome.is_error and "is one of soba's own files" in outcome.content, outcome.content
    assert not outcomes[-1].is_error
