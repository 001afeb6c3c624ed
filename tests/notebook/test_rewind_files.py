"""Rewind restores files (SPEC §11), through the magics of a real InteractiveShell against real
files: the agent's writes and edits keep the previous bytes (by sha256, 0600); `%rewind T`
lists what the agent changed after T, `%rewind T --files` puts each back (a file the agent
created is deleted), leaves alone a file someone else changed since unless `--force`, and
records a `restore` entry."""

from __future__ import annotations

import hashlib
import os
import stat

from IPython.utils.capture import capture_output
from llm_server import text, tool_calls

from soba_nb.transcript.entries import CheckpointEntry, RestoreEntry, ToolResultEntry

ORIGINAL = "def total(xs):\n    return sum(xs)\n"


def magics(ip):
    return ip.magics_manager.registry["SobaMagics"]


def turn_checkpoints(ip) -> list[str]:
    return [e.checkpoint_id for e in magics(ip).agent.transcript.path() if isinstance(e, CheckpointEntry) and e.kind == "turn"]


def run(ip, magic: str, line: str) -> str:
    with capture_output() as out:
        ip.run_line_magic(magic, line)
    return out.stdout


def agent_changes_two_files(ip, nb_dir, scripted) -> str:
    """A first turn (its checkpoint returned), then a turn that edits analysis.py and creates report.md."""
    (nb_dir / "analysis.py").write_text(ORIGINAL)
    scripted.script(text("Ready."))
    ip.run_line_magic("soba", "hello")
    [before] = turn_checkpoints(ip)
    scripted.script(
        tool_calls(
            ("edit_file", {"path": "analysis.py", "old": "sum(xs)", "new": "sum(xs) / len(xs)"}),
            ("write_file", {"path": "out/report.md", "content": "# Report\n"}),
        ),
        text("Changed the function and wrote a report."),
    )
    ip.run_line_magic("soba", "make total an average and write a report")
    return before


def test_rewind_lists_then_restores_the_agents_files(ip, nb_dir, scripted):
    before = agent_changes_two_files(ip, nb_dir, scripted)
    agent = magics(ip).agent
    [edit, write] = [e for e in agent.transcript.path() if isinstance(e, ToolResultEntry)]
    [change] = edit.files
    assert change.path == "analysis.py" and change.before == hashlib.sha256(ORIGINAL.encode()).hexdigest()
    kept = nb_dir / "analysis.soba" / "files" / change.before
    assert kept.read_text() == ORIGINAL and stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert write.files[0].path == "out/report.md" and write.files[0].before is None

    history = run(ip, "capsule", "list").splitlines()
    assert "changed 2 file(s): analysis.py, out/report.md" in history[-1] and "changed" not in history[0]

    listed = run(ip, "rewind", before)
    assert f"rewound to {before}" in listed
    assert "analysis.py (changed by the agent)" in listed and "out/report.md (created by the agent)" in listed
    assert f"%rewind {before} --files restores them" in listed
    assert (nb_dir / "analysis.py").read_text() != ORIGINAL  # nothing restored yet

    restored = run(ip, "rewind", f"{before} --files")  # right after: no second move, the same files
    assert "already at" in restored
    assert f"restored analysis.py as it was at {before}" in restored
    assert f"deleted out/report.md (the agent created it after {before})" in restored
    assert (nb_dir / "analysis.py").read_text() == ORIGINAL and not (nb_dir / "out" / "report.md").exists()
    entry = agent.transcript.path()[-1]
    assert isinstance(entry, RestoreEntry) and entry.target_id == agent.resolve_target(before)
    assert [(f.path, f.action) for f in entry.files] == [("analysis.py", "restored"), ("out/report.md", "deleted")]
    assert run(ip, "rewind", f"{before} --files").strip().endswith(f"nothing to restore: the files are as they were at {before}")


def test_a_file_someone_else_changed_is_left_alone_unless_forced(ip, nb_dir, scripted):
    before = agent_changes_two_files(ip, nb_dir, scripted)
    (nb_dir / "analysis.py").write_text("# the user's own edit\n")
    restored = run(ip, "rewind", f"{before} --files")
    assert "left alone analysis.py: changed since the agent last wrote it" in restored
    assert "--force restores those too" in restored
    assert (nb_dir / "analysis.py").read_text() == "# the user's own edit\n"
    assert not (nb_dir / "out" / "report.md").exists()
    forced = run(ip, "rewind", f"{before} --files --force")
    assert f"restored analysis.py as it was at {before}" in forced
    assert (nb_dir / "analysis.py").read_text() == ORIGINAL


def test_a_rewind_to_the_other_branch_brings_its_files_back(ip, nb_dir, scripted):
    before = agent_changes_two_files(ip, nb_dir, scripted)
    after = turn_checkpoints(ip)[-1]
    run(ip, "rewind", f"{before} --files")
    back = run(ip, "rewind", f"{after} --files")
    assert f"restored analysis.py as it was at {after}" in back and f"restored out/report.md as it was at {after}" in back
    assert "sum(xs) / len(xs)" in (nb_dir / "analysis.py").read_text()
    assert (nb_dir / "out" / "report.md").read_text() == "# Report\n"


def test_no_write_without_a_way_back(ip, nb_dir, scripted, tmp_path):
    (nb_dir / "analysis.py").write_text(ORIGINAL)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (nb_dir / "analysis.soba").mkdir()
    os.symlink(outside, nb_dir / "analysis.soba" / "files")  # a link planted for the versions folder
    scripted.script(tool_calls(("write_file", {"path": "analysis.py", "content": "x = 1\n"})), text("Tried."))
    ip.run_line_magic("soba", "overwrite it")
    [result] = [e for e in magics(ip).agent.transcript.path() if isinstance(e, ToolResultEntry)]
    assert result.is_error and "not written: its previous version could not be kept" in result.content
    assert (nb_dir / "analysis.py").read_text() == ORIGINAL and list(outside.iterdir()) == []


def test_force_needs_files(ip, nb_dir, scripted):
    from IPython.core.error import UsageError

    scripted.script(text("Hi."))
    ip.run_line_magic("soba", "hello")
    [checkpoint] = turn_checkpoints(ip)
    try:
        ip.run_line_magic("rewind", f"{checkpoint} --force")
    except UsageError as error:
        assert "--force goes with --files" in str(error)
    else:
        raise AssertionError("--force alone was accepted")
