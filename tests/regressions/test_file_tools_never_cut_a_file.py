"""The agent's file tools never leave a file cut (SPEC §11, §12, §16: the files are the user's).

Found by the long randomized session with the attacks of SPEC §16: after a full disk, a notes
file held text the model never wrote. `write_file` and `edit_file` truncated the file and then
wrote the new content; on a full disk the write stopped part way — the user's file was neither
version, and no receipt recorded a change. Now the new content is written to a temporary file
beside it and renamed into place: all of it, or the file exactly as it was (and a new file is
not left behind), with one line saying why.

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

from soba_nb.transcript.entries import ToolResultEntry

BIG = 60_000
ORIGINAL = "# the user's readings\n" + ("the user's version\n" * (BIG // 19 + 1))[:BIG]
AGENTS = ("the agent's version\n" * (BIG // 20 + 1))[:BIG]
DISK_BYTES = 8 * 1024 * 1024


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leave_free(disk: Path, room: int) -> Path:
    """About `room` bytes left on the disk: enough for the transcript's entries of the next
    call (its arguments included), not for the file it writes."""
    filler = disk / "filler.bin"
    filler.unlink(missing_ok=True)
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    filler.write_bytes(b"\0" * max(free - room, 0))
    return filler


def turn(ip, scripted, call, prompt: str) -> str:
    scripted.inference.clear()
    scripted.script(tool_calls(call), text("Done."))
    with capture_output() as out:
        ip.run_line_magic("soba", prompt)
    return out.stdout + out.stderr


def test_a_full_disk_never_cuts_a_file_the_tools_write(tmp_path, llm_server, scripted, monkeypatch):
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        project = project_on(disk, tmp_path, llm_server.url, monkeypatch)
        soba_json = project / "soba.json"  # room for a call that writes a 60 KB file
        soba_json.write_text(soba_json.read_text().replace('"maxOutputTokens": 500', '"maxOutputTokens": 24000').replace(
            '"contextWindow": 6000', '"contextWindow": 200000'))
        big = project / "big.txt"
        big.write_text(ORIGINAL)
        ip = new_shell(project)
        try:
            ip.run_line_magic("auto_compact", "off")
            # Both versions written once, so the rewind store already keeps both of them: on the
            # full disk below, only the file itself is written.
            turn(ip, scripted, ("write_file", {"path": "big.txt", "content": AGENTS}), "rewrite big.txt")
            turn(ip, scripted, ("write_file", {"path": "big.txt", "content": ORIGINAL}), "put it back")
            before = sha(big)
            edit = {"path": "big.txt", "old": "# the user's readings\n", "new": "a longer first line\n" * 1000}  # 20 KB more
            leave_free(disk, 96 * 1024)  # the call's 60 KB fit in the transcript; the file's do not, beside it
            shown = turn(ip, scripted, ("write_file", {"path": "big.txt", "content": AGENTS}), "rewrite it again")
            assert sha(big) == before  # exactly as it was, not cut
            leave_free(disk, 40 * 1024)
            shown += turn(ip, scripted, ("edit_file", edit), "edit it")
            assert sha(big) == before
            leave_free(disk, 96 * 1024)
            shown += turn(ip, scripted, ("write_file", {"path": "new.txt", "content": AGENTS}), "write a new file")
            assert not (project / "new.txt").exists()  # a new file is not left behind, empty or cut
            assert [p.name for p in project.iterdir() if "soba-write" in p.name] == []  # no temporary file
            agent = ip.magics_manager.registry["SobaMagics"].agent
            results = [e for e in agent.transcript.entries if isinstance(e, ToolResultEntry)][-3:]
            assert all(r.is_error and "No space left on device" in r.content for r in results), [r.content for r in results]
            assert "Traceback" not in shown

            (disk / "filler.bin").unlink()  # the space comes back: the same call works
            turn(ip, scripted, ("write_file", {"path": "big.txt", "content": AGENTS}), "rewrite it again")
            assert big.read_text() == AGENTS
        finally:
            shut_down(ip)
