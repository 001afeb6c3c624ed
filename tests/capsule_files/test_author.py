"""SPEC §13, who wrote a capsule: every `.capsule.md` carries `author` (`user@host`, from the
OS) in its front matter, covered by the hash; `%capsule list --memory` shows it."""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from IPython.utils.capture import capture_output

from soba_nb.capsule_files.file import (
    CapsuleFile,
    CapsuleFileError,
    CapsuleMetadata,
    current_author,
    parse_capsule_file,
    read_capsule_file,
    render_capsule_file,
    write_capsule_file,
)
from soba_nb.capsule_files.memory import list_memory, memory_dir, mirror
from soba_nb.compaction.capsule import Capsule, render_capsule
from soba_nb.transcript.entries import CapsuleEntry

BODY = render_capsule(Capsule(goal_and_constraints="Audit the features.", work_done="- dropped 3 leaky columns"))
ME = f"{pwd.getpwuid(os.getuid()).pw_name}@{socket.gethostname()}"


def metadata(**overrides: object) -> CapsuleMetadata:
    values: dict[str, object] = {"title": "Feature audit", "checkpoint": "ck_0f0e0d0c", "quality": "full", "tokens": 9, "trigger": "user"}
    values.update(overrides)
    return CapsuleMetadata(**values)  # type: ignore[arg-type]


def test_the_author_is_this_user_at_this_host() -> None:
    assert current_author() == ME
    assert metadata().author == ME


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as a user id with no account")
def test_a_user_id_with_no_account_is_named_by_its_number() -> None:
    uid = next(n for n in range(54321, 65000) if not _has_account(n))
    # Imported first: the interpreter's files may be readable by root only.
    code = f"import os; from soba_nb.capsule_files.file import current_author; os.setgid({uid}); os.setuid({uid}); print(current_author())"
    env = {**os.environ, "USER": "someone-else", "LOGNAME": "someone-else"}  # not the OS's word
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=60)
    assert out.stdout.strip() == f"uid{uid}@{socket.gethostname()}"


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def test_author_is_in_the_front_matter_right_before_the_hash_and_covered_by_it() -> None:
    text = render_capsule_file(CapsuleFile(metadata=metadata(author="ana@jupyter-ana"), body=BODY))
    lines = text.split("\n")
    assert lines[lines.index('author: "ana@jupyter-ana"') + 1].startswith("sha256: ")
    edited = text.replace('author: "ana@jupyter-ana"', 'author: "ben@jupyter-ben"')
    with pytest.raises(CapsuleFileError, match="content hash mismatch"):
        parse_capsule_file(edited, source="audit.capsule.md")
    assert parse_capsule_file(text, source="audit.capsule.md").metadata.author == "ana@jupyter-ana"


def test_a_version_3_file_without_author_is_refused() -> None:
    text = render_capsule_file(CapsuleFile(metadata=metadata(), body=BODY))
    without = re.sub(r"^author: .*\n", "", text, flags=re.MULTILINE)
    with pytest.raises(CapsuleFileError, match="front matter is missing key.s.: author"):
        parse_capsule_file(without, source="audit.capsule.md")
    null = text.replace(f'author: "{ME}"', "author: null")
    with pytest.raises(CapsuleFileError, match="'author': must name who wrote the file"):
        parse_capsule_file(null, source="audit.capsule.md")


def _version_2(text: str) -> str:
    """The same capsule as soba-nb 0.2 wrote it: no author, hash over the rest."""
    text = re.sub(r"^author: .*\n", "", text.replace("soba-capsule: 3", "soba-capsule: 2"), flags=re.MULTILINE)
    hash_line = re.search(r"^sha256: .*\n", text, flags=re.MULTILINE)
    assert hash_line is not None
    digest = hashlib.sha256(text.replace(hash_line.group(0), "", 1).encode()).hexdigest()
    return text.replace(hash_line.group(0), f'sha256: "{digest}"\n', 1)


def test_a_version_2_file_reads_with_no_author(tmp_path: Path) -> None:
    old = tmp_path / "old.capsule.md"
    old.write_text(_version_2(render_capsule_file(CapsuleFile(metadata=metadata(), body=BODY))), encoding="utf-8")
    cf = read_capsule_file(old)
    assert cf.metadata.author is None and cf.metadata.quality == "full" and cf.body == BODY


def test_the_memory_listing_names_who_wrote_each_capsule(ip, nb_dir: Path) -> None:
    agent = ip.magics_manager.registry["SobaMagics"].get_session()
    entry = CapsuleEntry(
        operation_id="op_1", checkpoint_id="ck_1a2b3c4d", trigger="user", quality="full", tokens_before=50000,
        tokens_after=12000, first_kept_entry_id=None, content=BODY,
    )
    mirror(entry, agent.project_root, notebook=agent.notebook, session_id=agent.session_id)
    folder = memory_dir(agent.project_root)
    theirs = CapsuleFile(metadata=metadata(checkpoint="ck_5e6f7a8b", title="Their audit", author="ben@jupyter-ben"), body=BODY)
    write_capsule_file(folder / "ck_5e6f7a8b.capsule.md", theirs)
    (folder / "ck_99999999.capsule.md").write_text(_version_2(render_capsule_file(CapsuleFile(metadata=metadata(checkpoint="ck_99999999"), body=BODY))), encoding="utf-8")
    with capture_output() as out:
        ip.run_line_magic("capsule", "list --memory")
    lines = {line.split("  ", 1)[0]: line for line in out.stdout.splitlines()}
    assert f"· by {ME} · unsigned" in lines["ck_1a2b3c4d.capsule.md"]
    assert "Their audit · full · " in lines["ck_5e6f7a8b.capsule.md"] and "· by ben@jupyter-ben ·" in lines["ck_5e6f7a8b.capsule.md"]
    assert "author not recorded (an older file)" in lines["ck_99999999.capsule.md"]
    assert {item.metadata.author for item in list_memory(agent.project_root) if item.metadata} == {ME, "ben@jupyter-ben", None}


def test_an_author_with_control_characters_is_listed_escaped(ip, nb_dir: Path) -> None:
    agent = ip.magics_manager.registry["SobaMagics"].get_session()
    hostile = CapsuleFile(metadata=metadata(author="eve\x1b[2J@\x07host"), body=BODY)
    write_capsule_file(memory_dir(agent.project_root) / "ck_0f0e0d0c.capsule.md", hostile)
    with capture_output() as out:
        ip.run_line_magic("capsule", "list --memory")
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout and "by eve" in out.stdout
