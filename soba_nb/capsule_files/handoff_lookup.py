"""The capsule `%capsule create` wrote, found by its checkpoint id.

A handoff capsule is not on the session's path (nothing was compacted): the session holds a
`user` checkpoint carrying the capsule's own checkpoint id and naming the file, and the
file's front matter carries the same id. `%capsule show` and `%capsule export` read it there.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from soba_nb.capsule_files.export import CapsuleExportError
from soba_nb.capsule_files.file import CapsuleFile, CapsuleFileError, read_capsule_file
from soba_nb.transcript.entries import CapsuleEntry, CheckpointEntry
from soba_nb.transcript.store import Transcript

_WRITTEN = re.compile(r"^capsule .* written to (?P<path>.+)$", re.DOTALL)


def handoff_note(title: str, shown_path: str) -> str:
    """The checkpoint's note: `%capsule list` shows it, `handoff_file` reads the path back."""
    return f"capsule {title!r} written to {shown_path}"


class HandoffFileError(CapsuleExportError):
    """A handoff checkpoint whose file is gone or is no longer the capsule it names."""


def handoff_file(transcript: Transcript, checkpoint_id: str, project_root: Path) -> tuple[Path, CapsuleFile] | None:
    """The file and capsule of the handoff checkpoint `checkpoint_id`; None when the id names
    no such checkpoint. Raises `HandoffFileError` (one line) when its file cannot be read back."""
    found = transcript.find_checkpoint(checkpoint_id)
    if not isinstance(found, CheckpointEntry) or found.kind != "user":
        return None
    match = _WRITTEN.match(found.note)
    if match is None:
        return None
    named = Path(match.group("path")).expanduser()
    # Shown relative to the kernel's folder: the notebook's (next to its `<stem>.soba/`), which
    # a command run elsewhere finds from the transcript's own place.
    notebook_folder = transcript.file.parent.parent
    places = [named] if named.is_absolute() else [Path(os.getcwd()) / named, notebook_folder / named, project_root / named]
    path = next((place for place in places if place.is_file()), None)
    if path is None:
        raise HandoffFileError(
            f"{checkpoint_id} is the capsule %capsule create wrote to {named}, which is no longer there"
        )
    try:
        capsule_file = read_capsule_file(path)
    except (CapsuleFileError, OSError, ValueError) as exc:
        raise HandoffFileError(f"{checkpoint_id}: the capsule file {path} cannot be read: {exc}") from None
    if capsule_file.metadata.checkpoint != checkpoint_id:
        raise HandoffFileError(
            f"{checkpoint_id}: {path} now holds capsule {capsule_file.metadata.checkpoint}, not this one"
        )
    return path, capsule_file


def handoff_entry(checkpoint_id: str, path: Path, capsule_file: CapsuleFile) -> CapsuleEntry:
    """The handoff capsule as an entry (never appended), for `export_capsule`."""
    meta = capsule_file.metadata
    return CapsuleEntry(
        operation_id=f"handoff_{checkpoint_id}", checkpoint_id=checkpoint_id, trigger=meta.trigger,
        quality=meta.quality, tokens_before=meta.tokens, tokens_after=meta.tokens, first_kept_entry_id=None,
        content=capsule_file.body, source=str(path), title=meta.title,
    )
