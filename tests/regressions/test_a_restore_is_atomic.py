"""A restore is atomic (SPEC §16).

Found on a full disk: `%rewind CK --files` truncated the user's `big.txt` and wrote what fitted
(303,104 bytes: neither version), and once space was back the same command refused it as
"changed since the agent last wrote it". Now each file is written to a temporary file beside it
and renamed into place: on a full disk the file is exactly as it was, one line says which file
and why, no temporary file is left, and the same command succeeds once there is space.

The disk is a real one: an 8 MB tmpfs (root, as in CI).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from conftest import new_shell, shut_down
from disk_support import project_on, small_disk
from IPython.utils.capture import capture_output
from llm_server import text, tool_calls

from soba_nb.transcript.entries import CheckpointEntry, RestoreEntry

BIG = 600_000
ORIGINAL = ("the user's version\n" * (BIG // 19 + 1))[:BIG]
AGENTS = "the agent's short version\n"
DISK_BYTES = 8 * 1024 * 1024


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sha_of(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


def test_a_restore_on_a_full_disk_leaves_the_file_as_it_was(tmp_path, llm_server, scripted, monkeypatch):
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        project = project_on(disk, tmp_path, llm_server.url, monkeypatch)
        big = project / "big.txt"
        big.write_text(ORIGINAL)
        ip = new_shell(project)
        try:
            ip.run_line_magic("auto_compact", "off")
            scripted.script(text("Ready."))
            ip.run_line_magic("soba", "start")
            agent = ip.magics_manager.registry["SobaMagics"].agent
            [checkpoint] = [
                e.checkpoint_id for e in agent.transcript.path() if isinstance(e, CheckpointEntry) and e.kind == "turn"
            ]
            scripted.script(tool_calls(("write_file", {"path": "big.txt", "content": AGENTS})), text("Rewritten."))
            ip.run_line_magic("soba", "rewrite big.txt")
            assert big.read_text() == AGENTS
            filler = disk / "filler.bin"
            free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
            with filler.open("wb") as handle:  # room for the restore entry, not for the original big.txt
                handle.write(b"\0" * max(free - 64 * 1024, 0))

            with capture_output() as out:
                ip.run_line_magic("rewind", f"{checkpoint} --files")
            assert big.read_text() == AGENTS  # exactly as it was
            failed = [line for line in out.stdout.splitlines() if "big.txt" in line]
            assert len(failed) == 1 and failed[0].startswith("could not restore big.txt:"), out.stdout
            assert "space" in failed[0] and "as it was" in failed[0]
            assert sorted(p.name for p in project.iterdir() if p.name.startswith(".")) == [], "temporary file left"
            assert "Traceback" not in out.stdout + out.stderr

            filler.unlink()  # the space comes back: the same command restores it
            with capture_output() as out:
                ip.run_line_magic("rewind", f"{checkpoint} --files")
            assert f"restored big.txt as it was at {checkpoint}" in out.stdout, out.stdout
            assert sha(big) == sha_of(ORIGINAL)
            assert isinstance(agent.transcript.path()[-1], RestoreEntry)
        finally:
            shut_down(ip)
