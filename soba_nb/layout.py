"""Where everything soba keeps lives, named once (SPEC §7, §8, §11).

A notebook's sessions live next to it in `<notebook-stem>.soba/`: one transcript per session
(`<session-id>.jsonl`), the caches beside each transcript (`<session-id>.tokens`,
`.budget`, `.extract`) and the folder's flight records (`flight.jsonl`). The project keeps
`.soba/` (memory, skills) and `soba.json`; the user keeps `~/.soba/config.json`; an admin
keeps `/etc/soba/config.json` (SPEC §13; `SOBA_SYSTEM_CONFIG` names another file); derived
data goes to the user's cache folder (`~/.cache/soba-nb`). Every module that needs one of
these paths asks this one; nothing else spells them.

This module imports nothing of soba's: every layer may use it.
"""

from __future__ import annotations

import os
import stat
from datetime import datetime, timezone
from pathlib import Path

from msgspec import Struct

SESSIONS_FOLDER_SUFFIX = ".soba"
"""`<notebook-stem>.soba/`: a notebook's sessions."""
TRANSCRIPT_SUFFIX = ".jsonl"
"""A session transcript is created only at a path ending in this."""
TOKENS_SUFFIX = ".tokens"
"""Token counts of the transcript's entries (`transcript.token_index`)."""
BUDGET_SUFFIX = ".budget"
"""The budget tracker's state (`compaction.budget_state`)."""
EXTRACT_SUFFIX = ".extract"
"""Snapshots of the deterministic extract (`compaction.extract_snapshots`)."""
SIDECAR_SUFFIXES = (TOKENS_SUFFIX, BUDGET_SUFFIX, EXTRACT_SUFFIX)
FLIGHT_FILE = "flight.jsonl"
"""The folder's flight records (`compaction.flight`): not a transcript, though it ends so."""
FILE_VERSIONS_FOLDER = "files"
"""`<notebook-stem>.soba/files/<sha256>`: bytes of files the agent wrote, before and after."""
ARTIFACTS_FOLDER = "artifacts"
"""`<notebook-stem>.soba/artifacts/<sha256>.png`: images the agent's calls displayed."""
INBOX_FOLDER = "inbox"
"""`<notebook-stem>.soba/inbox/<time_ns:020d>-<8 hex>.json`: messages from the sidebar to a
running turn (steer, edit decisions), written by the Jupyter server, taken by the kernel
(`soba_nb.inbox`)."""
QUEUE_FILE = "queue.json"
"""`<notebook-stem>.soba/queue.json`: the sidebar's queued requests (`soba_nb.server.queue`)."""
REPAIRED_SUFFIX = ".repaired.jsonl"
"""`soba-nb verify --repair` writes the repaired copy beside the transcript."""
PROJECT_FOLDER = Path(".soba")
"""The project's own folder: memory and skills."""
MEMORY_FOLDER = PROJECT_FOLDER / "memory"
SKILLS_FOLDER = PROJECT_FOLDER / "skills"
PROJECT_CONFIG_NAME = "soba.json"
USER_FOLDER = Path("~/.soba")
USER_CONFIG_PATH = USER_FOLDER / "config.json"
CACHE_HOME_ENV = "XDG_CACHE_HOME"
CACHE_FOLDER_NAME = "soba-nb"
"""Derived data kept between processes (a tokenizer's ranks: `soba_nb.tokenizer_cache`) lives in
`$XDG_CACHE_HOME/soba-nb`, else `~/.cache/soba-nb`: never beside a user's files."""
SYSTEM_CONFIG_PATH = Path("/etc/soba/config.json")
"""The admin's layer of configuration, below the user's (SPEC §13)."""
SYSTEM_CONFIG_ENV = "SOBA_SYSTEM_CONFIG"
"""Names another file for the admin's layer (empty: none)."""
UNTITLED_NOTEBOOK = "untitled.ipynb"
"""The notebook name assumed when the kernel does not know its notebook."""


def user_cache_folder() -> Path:
    """`$XDG_CACHE_HOME/soba-nb`, else `~/.cache/soba-nb` (a relative XDG_CACHE_HOME is ignored)."""
    base = os.environ.get(CACHE_HOME_ENV, "")
    return (Path(base) if Path(base).is_absolute() else Path("~/.cache").expanduser()) / CACHE_FOLDER_NAME


PROJECT_MARKERS = (PROJECT_CONFIG_NAME, ".git")
"""What makes a folder the project's: the nearest holding one of these (SPEC §8, §19)."""


def project_root_for(notebook_dir: str | os.PathLike[str]) -> Path:
    """The nearest of `notebook_dir` and its parents holding `soba.json` or `.git`; the
    notebook's folder itself when none does."""
    start = Path(notebook_dir).expanduser().resolve()
    for folder in (start, *start.parents):
        if any((folder / marker).exists() for marker in PROJECT_MARKERS):
            return folder
    return start


def sessions_folder_for(notebook: Path) -> Path:
    """`<notebook-stem>.soba/` next to the notebook."""
    return notebook.parent / f"{notebook.stem}{SESSIONS_FOLDER_SUFFIX}"


def new_session_id() -> str:
    """Sortable by creation time: `20261202T143700Z-1a2b`."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{os.urandom(2).hex()}"


def session_transcripts(folder: Path) -> list[Path]:
    """Session transcripts in a folder, oldest first (flight records excluded). A link is no
    transcript of ours (one planted there must not be resumed, nor written through); nor is an
    empty file (a header never written: it is never adopted, `transcript.opening`)."""
    return [path for path, info in named_like_transcripts(folder) if stat.S_ISREG(info.st_mode) and info.st_size]


def named_like_transcripts(folder: Path) -> list[tuple[Path, os.stat_result]]:
    """Everything in `folder` named like a session transcript (flight records and repaired
    copies excluded), with what `lstat` says of it (links not followed), oldest first."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.glob(f"*{TRANSCRIPT_SUFFIX}"):
        try:
            info = path.lstat()
        except OSError:
            continue
        if path.name != FLIGHT_FILE and not path.name.endswith(REPAIRED_SUFFIX):
            found.append((info.st_mtime, path.name, path, info))
    return [(path, info) for _, _, path, info in sorted(found, key=lambda item: item[:2])]


class SessionLayout(Struct, frozen=True):
    """Every path of one session: its transcript and what lies beside it."""

    transcript: Path

    @property
    def folder(self) -> Path:
        """The sessions folder (`<notebook-stem>.soba/`, or the folder `--session` named)."""
        return self.transcript.parent

    @property
    def session_id(self) -> str:
        return self.transcript.stem

    @property
    def tokens(self) -> Path:
        return self.transcript.with_suffix(TOKENS_SUFFIX)

    @property
    def budget(self) -> Path:
        return self.transcript.with_suffix(BUDGET_SUFFIX)

    @property
    def extract(self) -> Path:
        return self.transcript.with_suffix(EXTRACT_SUFFIX)

    @property
    def flight(self) -> Path:
        return self.folder / FLIGHT_FILE

    @property
    def file_versions(self) -> Path:
        """The folder's kept file versions (`<sha256>`), shared by its sessions."""
        return self.folder / FILE_VERSIONS_FOLDER

    @property
    def artifacts(self) -> Path:
        """The folder's images (`<sha256>.png` / `.jpg`), shared by its sessions."""
        return self.folder / ARTIFACTS_FOLDER

    @property
    def inbox(self) -> Path:
        """The folder's mailbox (`soba_nb.inbox`): what the sidebar sends a running turn."""
        return self.folder / INBOX_FOLDER

    @property
    def repaired(self) -> Path:
        return self.transcript.with_name(self.transcript.name.removesuffix(TRANSCRIPT_SUFFIX) + REPAIRED_SUFFIX)

    def files(self) -> frozenset[Path]:
        """The files this session writes, its folder and the folders of its stores (`files/`,
        `artifacts/`), resolved (the agent's file tools never write them, nor anything in
        those folders: `soba_nb.own_files`)."""
        transcript = Path(os.path.realpath(self.transcript))
        resolved = SessionLayout(transcript)
        stores = (Path(os.path.realpath(self.file_versions)), Path(os.path.realpath(self.artifacts)))
        own = (transcript, transcript.parent, resolved.tokens, resolved.budget, resolved.extract, resolved.flight)
        return frozenset({*own, *stores})

    @classmethod
    def new(cls, folder: Path) -> SessionLayout:
        """A new session in `folder`."""
        return cls(folder / f"{new_session_id()}{TRANSCRIPT_SUFFIX}")

    @classmethod
    def latest(cls, folder: Path) -> SessionLayout | None:
        """The folder's most recent session, if any."""
        found = session_transcripts(folder)
        return cls(found[-1]) if found else None
