"""One checkpoint id per capsule `%capsule create` writes: the line it prints, the file's front
matter, `%capsule list`, `%capsule show` and `%capsule export` all name the same one."""

from __future__ import annotations

import re

import pytest
from IPython.core.error import UsageError
from llm_server import text

from soba_nb.capsule_files.file import read_capsule_file
from soba_nb.cli import main
from soba_nb.transcript.entries import CapsuleEntry, CheckpointEntry
from soba_nb.transcript.store import Transcript


def transcript(ip) -> Transcript:
    return Transcript.load(ip.magics_manager.registry["SobaMagics"].agent.file)


def test_a_created_capsule_has_one_checkpoint_id_everywhere(ip, nb_dir, scripted, capsys, tmp_path, monkeypatch):
    scripted.script(text("The sales table has 1,722 rows."))
    ip.run_line_magic("soba", "describe the sales table")
    capsys.readouterr()

    ip.run_line_magic("capsule", 'create "Sales handoff"')
    printed = capsys.readouterr().out
    [ck] = re.findall(r"ck_[0-9a-f]{8,}", printed)
    created = nb_dir / "sales-handoff.capsule.md"
    assert read_capsule_file(created).metadata.checkpoint == ck  # the file says the same id
    [mark] = [e for e in transcript(ip).path() if isinstance(e, CheckpointEntry) and e.checkpoint_id == ck]
    assert mark.kind == "user" and "sales-handoff.capsule.md" in mark.note
    assert not any(isinstance(e, CapsuleEntry) for e in transcript(ip).path())  # nothing compacted

    ip.run_line_magic("capsule", "list")
    assert ck in capsys.readouterr().out
    ip.run_line_magic("capsule", f"show {ck}")
    shown = capsys.readouterr().out
    assert f"'Sales handoff' · {ck} · written by %capsule create to sales-handoff.capsule.md" in shown
    assert "## Goal and constraints" in shown

    ip.run_line_magic("capsule", f"export {ck} exported.capsule.md")
    assert f"exported {ck} to exported.capsule.md" in capsys.readouterr().out
    exported = read_capsule_file(nb_dir / "exported.capsule.md")
    assert exported.metadata.checkpoint == ck and exported.metadata.title == "Sales handoff"
    assert exported.body == read_capsule_file(created).body
    ip.run_line_magic("capsule", f"export {ck} {nb_dir} --format agents-md")
    assert "- Title: Sales handoff" in (nb_dir / "AGENTS.md").read_text()

    # the same id from the command line, run from another folder (the path the note names is
    # the notebook folder's: the command finds it from the transcript's own place)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    session = str(ip.magics_manager.registry["SobaMagics"].agent.file)
    assert main(["capsule", "export", session, ck, str(elsewhere / "from-cli.capsule.md")]) == 0
    assert f"exported {ck} to " in capsys.readouterr().out
    from_cli = read_capsule_file(elsewhere / "from-cli.capsule.md")
    assert from_cli.metadata.checkpoint == ck and from_cli.body == read_capsule_file(created).body
    monkeypatch.chdir(nb_dir)

    # the file gone: one line naming the checkpoint and where it was
    created.unlink()
    with pytest.raises(UsageError, match=f"{ck} is the capsule %capsule create wrote to sales-handoff.capsule.md, which is no longer there"):
        ip.run_line_magic("capsule", f"show {ck}")
