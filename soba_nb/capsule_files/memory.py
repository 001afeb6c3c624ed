"""Project memory: `<project>/.soba/memory/` (SPEC §8).

A capsule is session working state. Only a deliberate, validated summary is worth keeping
for the project: a capsule from an explicit `%compact` (trigger `user`, made in this
session rather than loaded from a file) whose quality is `full`. Capsules from automatic
triggers (auto_threshold, turn_complete, milestone, plan_pivot, hard_limit,
context_overflow) and degraded ones stay in their session.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from soba_nb.capsule_files.export import capsule_file_from_entry
from soba_nb.capsule_files.file import (
    FILE_SUFFIX,
    CapsuleFileError,
    CapsuleMetadata,
    read_capsule_file,
    write_capsule_file,
)
from soba_nb.compaction.capsule import CapsuleFormatError, parse_capsule
from soba_nb.layout import MEMORY_FOLDER, PROJECT_CONFIG_NAME
from soba_nb.transcript.entries import CapsuleEntry

PROJECT_MARKERS = (PROJECT_CONFIG_NAME, ".git")
"""A folder holding one of these is a project root."""


def project_root_for(notebook_dir: str | os.PathLike[str]) -> Path:
    """The nearest of `notebook_dir` and its parents holding `soba.json` or `.git`; the
    notebook's folder itself when none does."""
    start = Path(notebook_dir).expanduser().resolve()
    for folder in (start, *start.parents):
        if any((folder / marker).exists() for marker in PROJECT_MARKERS):
            return folder
    return start


def memory_dir(project_root: str | os.PathLike[str]) -> Path:
    return Path(project_root) / MEMORY_FOLDER


def should_mirror(entry: CapsuleEntry, *, explicit_compact: bool) -> bool:
    """Whether a committed capsule belongs in project memory: made by an explicit
    `%compact` (not `%capsule create`, not loaded from a file), `full` quality, and a
    complete capsule (all 13 sections)."""
    if not explicit_compact or entry.trigger != "user" or entry.source is not None:
        return False
    if entry.quality != "full":
        return False
    try:
        parse_capsule(entry.content)
    except CapsuleFormatError:
        return False
    return True


def mirror(
    entry: CapsuleEntry,
    project_root: str | os.PathLike[str],
    *,
    notebook: str | None,
    session_id: str | None,
    environ: Mapping[str, str] = os.environ,
) -> Path:
    """Write `<checkpoint>.capsule.md` (redacted) into project memory; returns its path.

    Callers decide with `should_mirror` first. Mirroring the same checkpoint again replaces
    its file (same capsule, same name).
    """
    cf = capsule_file_from_entry(entry, notebook=notebook, session_id=session_id, environ=environ)
    target = memory_dir(project_root) / f"{entry.checkpoint_id}{FILE_SUFFIX}"
    return write_capsule_file(target, cf, force=True)


@dataclass(frozen=True)
class MemoryCapsule:
    """One file in project memory: its metadata, or why it could not be read."""

    path: Path
    metadata: CapsuleMetadata | None
    error: str | None = None


def list_memory(project_root: str | os.PathLike[str]) -> list[MemoryCapsule]:
    """The capsules in project memory, oldest first; damaged files are listed with their
    error instead of hiding them or failing the whole listing."""
    folder = memory_dir(project_root)
    if not folder.is_dir():
        return []
    found: list[MemoryCapsule] = []
    for path in sorted(folder.glob(f"*{FILE_SUFFIX}")):
        try:
            found.append(MemoryCapsule(path, read_capsule_file(path).metadata))
        except CapsuleFileError as exc:
            found.append(MemoryCapsule(path, None, exc.problem))
    return sorted(
        found, key=lambda item: (item.metadata.created if item.metadata else "", item.path.name)
    )
