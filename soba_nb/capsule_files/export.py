"""Export a session's capsule to a file (SPEC §8): a `.capsule.md`, or a plain Markdown
handoff for another agent (`agents-md`, see `soba_nb.capsule_files.handoff`).

Export redacts secrets from the title and body, signs a `.capsule.md` with the team key when
there is one (`soba_nb.capsule_files.signing`), writes atomically with the user's umask
(the file is made to be shared), never overwrites
without `force`, and refuses a path outside the project unless the caller says the user
asked for it explicitly (`allow_outside`: the magic and the CLI pass it when the user gave
an absolute path). Loading a file into a session is `soba_nb.capsule_files.load`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import msgspec
from pydantic import ValidationError

from soba_nb.capsule_files.file import (
    FILE_SUFFIX,
    CapsuleFile,
    CapsuleMetadata,
    write_capsule_file,
    write_file_atomically,
)
from soba_nb.capsule_files.handoff import AGENTS_MD, HANDOFF_SUFFIX, render_handoff
from soba_nb.compaction.given_way import given_way_form
from soba_nb.printable import note_line
from soba_nb.redact import redact
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import CapsuleEntry, CheckpointEntry
from soba_nb.transcript.store import Transcript

ExportFormat = Literal["capsule", "agents-md"]
EXPORT_FORMATS: tuple[ExportFormat, ...] = ("capsule", "agents-md")
"""`capsule`: the `.capsule.md` file soba-nb loads back (front matter, hash); `agents-md`: a
plain Markdown handoff another coding agent reads (no front matter)."""
# The tokenizer for a capsule whose entry does not name its model (o200k_base, exact).
DEFAULT_COUNTING_MODEL = ("openai", "gpt-4o")


class CapsuleExportError(ValueError):
    """A capsule cannot be exported or loaded: unknown checkpoint, path outside the project."""


def default_title(entry: CapsuleEntry) -> str:
    return entry.title or f"Capsule {entry.checkpoint_id} ({entry.trigger})"


def capsule_counter(entry: CapsuleEntry) -> TokenCounter:
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
    counter = counter or capsule_counter(entry)
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
        # Say what the checkpoint is: the one `%capsule create` records names the file it wrote,
        # and "use %capsule create" alone read as a contradiction right after it.
        what = f"{found.kind}: {note_line(found.note)}" if found.note else found.kind
        raise CapsuleExportError(
            f"checkpoint {checkpoint_id} ({what}) has no capsule, only a compaction puts one on the path; "
            "%capsule create writes one of the session as it is"
        )
    raise CapsuleExportError(f"no checkpoint {checkpoint_id} in {transcript.file}")


def _target(
    out_path: str | os.PathLike[str], default_name: str, project_root: Path, *, allow_outside: bool
) -> Path:
    target = Path(out_path).expanduser().resolve()
    if target.is_dir():
        target = target / default_name
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
    export_format: ExportFormat = "capsule",
    environ: Mapping[str, str] = os.environ,
    entry: CapsuleEntry | None = None,
) -> Path:
    """Write the capsule of `checkpoint_id` to `out_path`; returns the file written.

    A relative `out_path` is taken from the working folder; an existing folder receives
    `<checkpoint>.capsule.md` (`AGENTS.md` for the `agents-md` format). Raises
    `CapsuleExportError` (unknown checkpoint, outside the project) or `CapsuleFileError`
    (file exists without `force`, cannot write).
    """
    if export_format not in EXPORT_FORMATS:
        raise CapsuleExportError(f"unknown format {export_format!r}; expected {' or '.join(EXPORT_FORMATS)}")
    if entry is None:  # given: a capsule `%capsule create` wrote, read back from its file
        entry = find_capsule(transcript, checkpoint_id)
    if (form := given_way_form(entry.content)) is not None:
        what = "is one line" if form == "one line" else "is no capsule"
        raise CapsuleExportError(
            f"capsule {entry.checkpoint_id} cannot be exported: it {what}, the model's window having been too small "
            "for its sections; %capsule create writes one of the session as it is"
        )
    default_name = AGENTS_MD if export_format == "agents-md" else f"{entry.checkpoint_id}{FILE_SUFFIX}"
    target = _target(out_path, default_name, Path(project_root), allow_outside=allow_outside)
    header = transcript.header
    notebook = header.notebook if header is not None else None
    if export_format == "agents-md":
        entry = msgspec.structs.replace(entry, title=title if title is not None else default_title(entry))
        text = render_handoff(
            entry, notebook=notebook, session_id=transcript.file.stem, base=target.parent, environ=environ
        )
        return write_file_atomically(target, text.encode("utf-8"), force=force, suffix=HANDOFF_SUFFIX)
    cf = capsule_file_from_entry(
        entry,
        notebook=notebook,
        session_id=transcript.file.stem,
        title=title,
        environ=environ,
    )
    return write_capsule_file(target, cf, force=force, environ=environ)
