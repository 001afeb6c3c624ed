"""Project memory: `<project>/.soba/memory/` (SPEC §8).

A capsule is session working state. Only a deliberate, validated summary is worth keeping
for the project: a capsule from an explicit `%compact` (trigger `user`, made in this
session rather than loaded from a file) whose quality is `full`. Capsules from automatic
triggers (auto_threshold, turn_complete, milestone, plan_pivot, hard_limit,
context_overflow) and degraded ones stay in their session.

The memory of a team's project is shared (SPEC §13): the kernels of several users may mirror
into one folder at the same moment. Each capsule is added whole under a name of its own —
never over another file, never half-written (`soba_nb.capsule_files.disk.publish_new`) — and
is made like any file of its user's: their umask, and the folder's group when the folder is
setgid (`chmod g+s`), which is how a team folder is set up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from soba_nb.capsule_files.disk import publish_new
from soba_nb.capsule_files.export import capsule_file_from_entry
from soba_nb.capsule_files.file import (
    FILE_SUFFIX,
    CapsuleFileError,
    CapsuleMetadata,
    CapsuleSignatureError,
    capsule_file_bytes,
    read_capsule_file,
)
from soba_nb.capsule_files.signing import SIGNED, UNSIGNED, CapsuleKeyError, capsule_key
from soba_nb.compaction.capsule import CapsuleFormatError, parse_capsule
from soba_nb.layout import MEMORY_FOLDER, PROJECT_FOLDER
from soba_nb.layout import PROJECT_MARKERS as PROJECT_MARKERS  # re-exported
from soba_nb.layout import project_root_for as project_root_for  # re-exported
from soba_nb.transcript.entries import CapsuleEntry


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
    """Add `<checkpoint>.capsule.md` (redacted, signed with the team key if there is one)
    to project memory; returns its path.

    Callers decide with `should_mirror` first. The file is never written over another one:
    when the name is taken by another writer's capsule, the next free name
    (`<checkpoint>-2.capsule.md`, …) is used. Only this session's own file of the same
    checkpoint, by the same author, is replaced (the same capsule mirrored again). A `.soba/`
    or `.soba/memory/` that is a link is refused, never written through.
    """
    for folder in (Path(project_root) / PROJECT_FOLDER, memory_dir(project_root)):
        if folder.is_symlink():  # the capsule would go wherever the link points
            raise CapsuleFileError(folder, "is a link; project memory is written only into a real folder, never through a link")
    cf = capsule_file_from_entry(entry, notebook=notebook, session_id=session_id, environ=environ)
    target = memory_dir(project_root) / f"{entry.checkpoint_id}{FILE_SUFFIX}"
    try:
        data = capsule_file_bytes(cf, environ=environ)
    except CapsuleKeyError as exc:
        raise CapsuleFileError(target, f"not written: {exc}") from None

    def own(existing: Path) -> bool:
        try:
            found = read_capsule_file(existing).metadata
        except CapsuleFileError:
            return False
        mine = cf.metadata
        return (found.checkpoint, found.source_session, found.author) == (mine.checkpoint, mine.source_session, mine.author)

    return publish_new(target, data, suffix=FILE_SUFFIX, replaces=own)


@dataclass(frozen=True)
class MemoryCapsule:
    """One file in project memory: its metadata, or why it could not be read."""

    path: Path
    metadata: CapsuleMetadata | None
    error: str | None = None
    signature: str = UNSIGNED
    """`signed` (its hmac holds under the team key), `unsigned` (no team key to check it
    with), or why the signature does not hold."""


def list_memory(project_root: str | os.PathLike[str], *, environ: Mapping[str, str] = os.environ) -> list[MemoryCapsule]:
    """The capsules in project memory, oldest first; damaged files are listed with their
    error instead of hiding them or failing the whole listing."""
    folder = memory_dir(project_root)
    if not folder.is_dir():
        return []
    try:
        key = capsule_key(environ)
    except CapsuleKeyError as exc:
        raise CapsuleFileError(folder, str(exc)) from None
    found: list[MemoryCapsule] = []
    for path in sorted(folder.glob(f"*{FILE_SUFFIX}")):
        try:
            found.append(MemoryCapsule(path, read_capsule_file(path, key=key).metadata, signature=SIGNED if key else UNSIGNED))
        except CapsuleSignatureError as refused:
            try:  # listed all the same, with what is wrong with its signature
                found.append(MemoryCapsule(path, read_capsule_file(path).metadata, signature=refused.problem))
            except CapsuleFileError as exc:
                found.append(MemoryCapsule(path, None, exc.problem))
        except CapsuleFileError as exc:
            found.append(MemoryCapsule(path, None, exc.problem))
    return sorted(
        found, key=lambda item: (item.metadata.created if item.metadata else "", item.path.name)
    )
