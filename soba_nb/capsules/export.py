"""Export a session's capsule to a `.capsule.md` file, and load one into a session (SPEC §8).

Export redacts secrets from the title and body, writes atomically, never overwrites
without `force`, and refuses a path outside the project unless the caller says the user
asked for it explicitly (`allow_outside`: the magic and the CLI pass it when the user gave
an absolute path). Load validates the whole file before it appends anything, then appends
exactly one capsule entry with trigger `user`.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from soba_nb.capsules.file import (
    FILE_SUFFIX,
    CapsuleFile,
    CapsuleMetadata,
    read_capsule_file,
    write_capsule_file,
)
from soba_nb.redact import redact
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import CapsuleEntry, CheckpointEntry, new_checkpoint_id
from soba_nb.transcript.store import Transcript

LOAD_OPERATION_PREFIX = "op_load_"
OPERATION_ID_BYTES = 6
# The tokenizer for a capsule whose entry does not name its model (o200k_base, exact).
DEFAULT_COUNTING_MODEL = ("openai", "gpt-4o")


class CapsuleExportError(ValueError):
    """A capsule cannot be exported or loaded: unknown checkpoint, path outside the project."""


def default_title(entry: CapsuleEntry) -> str:
    return entry.title or f"Capsule {entry.checkpoint_id} ({entry.trigger})"


def counter_for(entry: CapsuleEntry) -> TokenCounter:
    """The token counter of the model that wrote the capsule, or the default one."""
    if entry.provider and entry.model:
        return TokenCounter.for_model(entry.provider, entry.model)
    return TokenCounter.for_model(*DEFAULT_COUNTING_MODEL)


def capsule_file_from_entry(
    entry: CapsuleEntry,
    *,
    notebook: str | None,
    session_id: str | None,
    title: str | None = None,
    counter: TokenCounter | None = None,
    environ: Mapping[str, str] = os.environ,
) -> CapsuleFile:
    """A portable capsule from a capsule entry, with secrets redacted from title and body."""
    body = redact(entry.content, environ)
    counter = counter or counter_for(entry)
    try:
        return CapsuleFile(
            metadata=CapsuleMetadata(
                title=redact(title if title is not None else default_title(entry), environ),
                checkpoint=entry.checkpoint_id,
                source_notebook=notebook,
                source_session=session_id,
                quality=entry.quality,
                tokens=counter.count_text(body),
                trigger=entry.trigger,
            ),
            body=body,
        )
    except ValidationError as exc:
        problem = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        raise CapsuleExportError(
            f"capsule {entry.checkpoint_id} cannot be exported: {problem}"
        ) from None


def find_capsule(transcript: Transcript, checkpoint_id: str) -> CapsuleEntry:
    """The capsule entry with this checkpoint id, or a clear `CapsuleExportError`."""
    found = transcript.find_checkpoint(checkpoint_id)
    if isinstance(found, CapsuleEntry):
        return found
    if isinstance(found, CheckpointEntry):
        raise CapsuleExportError(f"checkpoint {checkpoint_id} has no capsule; use %capsule create")
    raise CapsuleExportError(f"no checkpoint {checkpoint_id} in {transcript.file}")


def _target(
    out_path: str | os.PathLike[str], checkpoint_id: str, project_root: Path, *, allow_outside: bool
) -> Path:
    target = Path(out_path).expanduser().resolve()
    if target.is_dir():
        target = target / f"{checkpoint_id}{FILE_SUFFIX}"
    root = project_root.resolve()
    if not allow_outside and not target.is_relative_to(root):
        raise CapsuleExportError(
            f"{target}: outside the project folder {root}; give an absolute path to export there on purpose"
        )
    return target


def export_capsule(
    transcript: Transcript,
    checkpoint_id: str,
    out_path: str | os.PathLike[str],
    *,
    project_root: Path,
    force: bool = False,
    allow_outside: bool = False,
    title: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Path:
    """Write the capsule of `checkpoint_id` to `out_path`; returns the file written.

    A relative `out_path` is taken from the working folder; an existing folder receives
    `<checkpoint>.capsule.md`. Raises `CapsuleExportError` (unknown checkpoint, outside
    the project) or `CapsuleFileError` (file exists without `force`, cannot write).
    """
    entry = find_capsule(transcript, checkpoint_id)
    target = _target(out_path, entry.checkpoint_id, Path(project_root), allow_outside=allow_outside)
    header = transcript.header
    cf = capsule_file_from_entry(
        entry,
        notebook=header.notebook if header is not None else None,
        session_id=transcript.file.stem,
        title=title,
        environ=environ,
    )
    return write_capsule_file(target, cf, force=force)


def load_capsule(
    path: str | os.PathLike[str],
    transcript: Transcript,
    *,
    session_notebook: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] = os.environ,
    counter: TokenCounter | None = None,
) -> CapsuleEntry:
    """Start the session from a `.capsule.md` file: one capsule entry, trigger `user`.

    A relative `path` is taken from the notebook's folder (the working folder without a
    notebook). The file is read and validated whole first, so on any error
    (`CapsuleFileError`) nothing is appended. The loaded capsule gets a fresh checkpoint id
    in this session; `source` records the file it came from. The body is redacted again with
    this machine's environment, so a hand-made file cannot carry a secret into the transcript.
    """
    path = Path(path).expanduser()
    if not path.is_absolute() and session_notebook is not None:
        path = Path(session_notebook).expanduser().parent / path
    path = path.resolve()
    cf = read_capsule_file(path)
    body = redact(cf.body, environ)
    # Never a figure from the file: its `tokens` is recounted with this session's tokenizer.
    tokens = (counter or TokenCounter.for_model(*DEFAULT_COUNTING_MODEL)).count_text(body)
    entry = CapsuleEntry(
        operation_id=f"{LOAD_OPERATION_PREFIX}{secrets.token_hex(OPERATION_ID_BYTES)}",
        checkpoint_id=new_checkpoint_id(),
        trigger="user",
        quality=cf.metadata.quality,
        tokens_before=tokens,
        tokens_after=tokens,
        first_kept_entry_id=None,
        content=body,
        source=str(path),
        title=redact(cf.metadata.title, environ),
    )
    written = transcript.append(entry)
    assert isinstance(written, CapsuleEntry)
    return written
