"""SPEC §13, shared project memory and shared capsule files.

Capsules are added to `.soba/memory/` atomically — never over another file, never
half-written — so the kernels of several users mirroring at once lose and mix nothing; files
take the folder's group (a setgid folder) and the user's umask. Exported and created
`.capsule.md` files honour the umask too, while transcripts and side-cars stay 0600.

The writers are real processes, started together on a signal (as root they run as two
different users, members of the team's group); a reader reads every file it sees while
they write."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.utils.capture import capture_output
from llm_server import text

from soba_nb.capsule_files.export import export_capsule
from soba_nb.capsule_files.file import CapsuleFileError, read_capsule_file
from soba_nb.capsule_files.memory import memory_dir, mirror
from soba_nb.compaction.capsule import Capsule, render_capsule
from soba_nb.transcript.entries import CapsuleEntry, MessageEntry, SessionEntry
from soba_nb.transcript.store import Transcript

TEAM_KEY = "team-capsule-key-" + "3e2d1c0b9a8f7e6d5c4b3a2918f7e6d5"
TEAM_GID = 4242
"""A group no account needs to exist for: the kernel only compares numbers."""
CAPSULES_PER_WRITER = 40
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0

WRITER = r"""
import os, sys, time
from pathlib import Path
from soba_nb.capsule_files.memory import mirror
from soba_nb.compaction.capsule import Capsule, render_capsule
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import CapsuleEntry

root, go, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
count, uid, umask, group = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6], 8), int(sys.argv[7])
TokenCounter.for_model("openai", "gpt-4o").count_text("loaded while the interpreter's files are readable")
entries = [
    CapsuleEntry(
        operation_id=f"op_{i}", checkpoint_id=f"ck_{i:08x}", trigger="user", quality="full",
        tokens_before=100, tokens_after=50, first_kept_entry_id=None,
        content=render_capsule(Capsule(goal_and_constraints=f"{name} capsule {i}", work_done=f"- {name} work {i}. " * 300)),
    )
    for i in range(count)
]
if uid:
    os.setgroups([group])
    os.setgid(uid)
    os.setuid(uid)
os.umask(umask)
print("ready", flush=True)
while not go.exists():
    time.sleep(0.0005)
for entry in entries:
    mirror(entry, root, notebook=f"/home/{name}/churn.ipynb", session_id=f"session-{name}")
"""


def author_of(uid: int) -> str:
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = f"uid{uid}"
    return f"{user}@{socket.gethostname()}"


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder other users can reach (pytest's own are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="soba-team-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start_writer(root: Path, go: Path, name: str, uid: int, umask: int) -> subprocess.Popen[str]:
    args = [str(root), str(go), name, str(CAPSULES_PER_WRITER), str(uid), oct(umask), str(TEAM_GID)]
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, *args], cwd="/", env={**os.environ, "SOBA_CAPSULE_KEY": TEAM_KEY},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert writer.stdout is not None and writer.stdout.readline() == "ready\n", writer.communicate()
    return writer


@pytest.mark.parametrize(
    "writers",
    [
        pytest.param(
            {"ana": (20001, 0o027), "ben": (20002, 0o002)}, id="two users",
            marks=pytest.mark.skipif(not IS_ROOT, reason="needs root to run the writers as two users"),
        ),
        pytest.param({"kernel-1": (0, 0o027), "kernel-2": (0, 0o027)}, id="one user, two kernels"),
    ],
)
def test_two_kernels_mirroring_at_the_same_moment_lose_and_mix_nothing(shared: Path, writers: dict[str, tuple[int, int]]) -> None:
    project = shared / "churn"
    project.mkdir()
    group = TEAM_GID if IS_ROOT else os.getgid()
    os.chown(project, os.getuid(), group)
    project.chmod(0o2775)  # the team's folder: setgid, group-writable
    go = shared / "go"
    running = {name: start_writer(project, go, name, uid, umask) for name, (uid, umask) in writers.items()}

    go.touch()  # both start at once, on the same checkpoint ids
    folder = memory_dir(project)
    seen = 0
    while any(writer.poll() is None for writer in running.values()):
        for path in folder.glob("*.capsule.md") if folder.is_dir() else ():
            try:
                read_capsule_file(path, key=TEAM_KEY.encode())  # whole and signed, whenever it is seen
            except CapsuleFileError as error:
                pytest.fail(f"a reader saw a bad file while they wrote: {error}")
            seen += 1
    for name, writer in running.items():
        _, errors = writer.communicate()
        assert writer.returncode == 0, f"{name}: {errors}"

    names = sorted(path.name for path in folder.iterdir())
    expected = sorted(f"ck_{i:08x}{suffix}.capsule.md" for i in range(CAPSULES_PER_WRITER) for suffix in ("", "-2"))
    assert names == expected  # every capsule under a name of its own; no temporary left behind
    found: dict[str, set[str]] = {name: set() for name in writers}
    for path in folder.iterdir():
        cf = read_capsule_file(path, key=TEAM_KEY.encode())
        name = cf.metadata.source_session.removeprefix("session-")  # type: ignore[union-attr]
        uid, umask = writers[name]
        goal = cf.capsule().goal_and_constraints
        assert goal.startswith(f"{name} capsule ") and f"- {name} work {goal.split()[-1]}." in cf.body  # not mixed
        assert cf.metadata.author == author_of(uid or os.getuid())
        info = path.stat()
        assert stat.S_IMODE(info.st_mode) == 0o666 & ~umask and info.st_gid == group
        found[name].add(goal)
    assert found == {name: {f"{name} capsule {i}" for i in range(CAPSULES_PER_WRITER)} for name in writers}
    for made in (project / ".soba", folder):  # made by whichever kernel came first, whatever its umask
        info = made.stat()
        assert info.st_gid == group and info.st_mode & stat.S_ISGID and info.st_mode & stat.S_IRWXG == stat.S_IRWXG
    assert seen > 0


# --- one kernel: modes and groups ---------------------------------------------------------


@pytest.fixture
def umask_027() -> Iterator[None]:
    previous = os.umask(0o027)
    yield
    os.umask(previous)


def _session(folder: Path) -> Transcript:
    notebook = folder / "churn.ipynb"
    notebook.touch()
    transcript = Transcript.open(
        folder / "churn.soba" / "20261202T143700Z-1a2b.jsonl",
        create_header=SessionEntry(notebook=str(notebook), model="openai/gpt-4o"),
    )
    transcript.append(MessageEntry(role="user", content="fit the churn model"))
    transcript.append(
        CapsuleEntry(
            operation_id="op_1", checkpoint_id="ck_1a2b3c4d", trigger="user", quality="full", tokens_before=9,
            tokens_after=9, first_kept_entry_id=None, content=render_capsule(Capsule(goal_and_constraints="Churn.")),
        )
    )
    return transcript


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_exported_and_mirrored_files_honour_the_umask_and_transcripts_stay_private(umask_027: None, tmp_path: Path) -> None:
    transcript = _session(tmp_path)
    capsule = export_capsule(transcript, "ck_1a2b3c4d", tmp_path / "handoff.capsule.md", project_root=tmp_path)
    agents = export_capsule(transcript, "ck_1a2b3c4d", tmp_path / "AGENTS.md", project_root=tmp_path, export_format="agents-md")
    [entry] = [e for e in transcript.path() if isinstance(e, CapsuleEntry)]
    memory = mirror(entry, tmp_path, notebook=None, session_id="s1")
    assert {path.name: _mode(path) for path in (capsule, agents, memory)} == {
        "handoff.capsule.md": 0o640, "AGENTS.md": 0o640, "ck_1a2b3c4d.capsule.md": 0o640,
    }
    assert _mode(transcript.file) == 0o600


def test_in_the_notebook_created_capsules_are_shared_and_the_session_files_are_not(umask_027: None, ip, nb_dir: Path, scripted) -> None:
    scripted.script(text("Done."))
    ip.run_line_magic("soba", "train a baseline")
    with capture_output():
        ip.run_line_magic("capsule", 'create "Churn handoff"')
    assert _mode(nb_dir / "churn-handoff.capsule.md") == 0o640
    session_files = [path for path in (nb_dir / "analysis.soba").iterdir() if path.is_file()]
    assert any(path.suffix == ".jsonl" for path in session_files)
    assert {path.name: _mode(path) for path in session_files} == {path.name: 0o600 for path in session_files}


@pytest.mark.skipif(not IS_ROOT, reason="needs root to give a folder another group")
def test_a_capsule_written_into_a_setgid_folder_takes_its_group(tmp_path: Path) -> None:
    handoffs = tmp_path / "handoffs"
    handoffs.mkdir()
    os.chown(handoffs, 0, TEAM_GID)
    handoffs.chmod(0o2770)
    assert os.getgid() != TEAM_GID
    transcript = _session(tmp_path)
    written = export_capsule(transcript, "ck_1a2b3c4d", handoffs / "churn.capsule.md", project_root=tmp_path)
    assert written.stat().st_gid == TEAM_GID
    assert transcript.file.stat().st_gid == os.getgid()
