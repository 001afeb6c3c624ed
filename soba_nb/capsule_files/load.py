"""Load a capsule file into a session (SPEC §8; issue 13, items 3 and 6).

A load appends exactly one capsule entry, trigger `user`, with `source` (the file) and
`title`. Model input frames every capsule with a `source` as handoff data, not instructions
(`capsule_text` in `soba_nb.compaction.model_input`). The file is read and validated whole
first; on any error nothing is appended. `%capsule load PATH` reads a `.capsule.md` (front
matter, hash checked); with `untrusted=True` (`--untrusted`) it reads any Markdown handoff
tolerantly instead (`soba_nb.capsule_files.handoff`), as a `degraded` capsule.

**Signed capsules** (SPEC §13): with the team key in the environment (`SOBA_CAPSULE_KEY`), a
`.capsule.md` loads only when its `hmac` holds; an unsigned, wrongly signed or version-1 file
is refused in one line (`--untrusted` reads it as unverified data). Without a key nothing is
authenticated, and the result line says `unsigned` (`signature_note`).

**A session with history keeps it.** Only the latest capsule on the path reaches the model,
and everything before its `firstKeptEntryId` does not, so a loaded capsule with
`firstKeptEntryId: null` would silently drop the session's earlier work. Instead:

- its `firstKeptEntryId` is the first entry the model saw before the load (the session's
  first message, or the kept tail of its latest capsule): every entry the model saw before
  the load it still sees, whole, after the loaded capsule;
- when the path already has a capsule, that capsule cannot reach the model any more (only
  the latest one does), so its sections are rolled into the loaded one, each part labelled
  with where it came from, and `rollsUp` names it.

The loaded capsule is added as data next to the current tail, not merged into a summary of
it: a load summarizes nothing, so nothing is lost or paraphrased, and the size is handled by
the usual path — the next compaction (the hard limit forces one before a request that would
not fit) summarizes from that `firstKeptEntryId` with the loaded capsule as the previous
capsule, exactly as after any compaction. `%rewind` to the entry before the load (the cell
names it, `LoadSummary.before`) gives back the session as it was. A session with nothing the
model sees starts from the loaded capsule alone, as before.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from soba_nb.capsule_files.export import DEFAULT_COUNTING_MODEL
from soba_nb.capsule_files.file import CapsuleFileError, NoFrontMatterError, read_capsule_file
from soba_nb.capsule_files.handoff import handoff_body, read_handoff
from soba_nb.capsule_files.signing import SIGNED, UNSIGNED, CapsuleKeyError, capsule_key
from soba_nb.compaction.capsule import SECTION_FIELDS, Capsule, parse_capsule, render_capsule
from soba_nb.compaction.model_input import visible_context
from soba_nb.redact import redact
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    Quality,
    new_checkpoint_id,
)
from soba_nb.transcript.store import Transcript

LOAD_OPERATION_PREFIX = "op_load_"
OPERATION_ID_BYTES = 6
MAX_SHARE_OF_HARD_LIMIT = 0.5
"""A loaded capsule may take at most this share of the session's hard limit: the session
must still have room to work (and to compact) after it."""
UNTRUSTED_HINT = "for a plain Markdown handoff (an AGENTS.md, another agent's notes) add --untrusted"


@dataclass(frozen=True)
class LoadedFile:
    """What a file gives a load: title, capsule Markdown (redacted), quality."""

    title: str
    body: str
    quality: Quality


def _resolve(path: str | os.PathLike[str], session_notebook: str | os.PathLike[str] | None) -> Path:
    """An absolute path, not resolved: a relative one is taken from the notebook's folder."""
    given = Path(path).expanduser()
    if not given.is_absolute() and session_notebook is not None:
        given = Path(session_notebook).expanduser().parent / given
    return Path(os.path.abspath(given))


def _refuse_link_out(given: Path, project_root: Path) -> None:
    """An untrusted file named inside the project must not be a link to a file outside it
    (SPEC §9's rule for file tools): its text would land in the transcript and the model."""
    root = project_root.resolve()
    inside = given.is_relative_to(root) or given.is_relative_to(Path(os.path.abspath(project_root)))
    real = given.resolve()
    if inside and not real.is_relative_to(root):
        raise CapsuleFileError(
            given, f"is a link to {real}, outside the project folder; give that path itself to load it"
        )


def read_for_load(path: Path, *, untrusted: bool, environ: Mapping[str, str] = os.environ) -> LoadedFile:
    """Read and validate a file to load, whole. Raises `CapsuleFileError`."""
    if untrusted:
        handoff = read_handoff(path)
        return LoadedFile(redact(handoff.title, environ), redact(handoff_body(handoff), environ), "degraded")
    try:
        key = capsule_key(environ)
    except CapsuleKeyError as exc:
        raise CapsuleFileError(path, f"not loaded: {exc}") from None
    try:
        cf = read_capsule_file(path, key=key)
    except NoFrontMatterError as exc:
        raise CapsuleFileError(exc.source, f"{exc.problem}; {UNTRUSTED_HINT}") from None
    # Redacted again with this machine's environment: a hand-made file cannot carry a secret
    # into the transcript.
    return LoadedFile(redact(cf.metadata.title, environ), redact(cf.body, environ), cf.metadata.quality)


def signature_note(*, untrusted: bool, environ: Mapping[str, str] = os.environ) -> str:
    """What a load's result line says of the file's authenticity: `signed` (its hmac held
    under the team key: a load with the key refuses anything else), `unsigned` (no key to
    check it with), or `not verified` (`--untrusted`: nothing was checked)."""
    try:
        key = capsule_key(environ)
    except CapsuleKeyError:
        key = None
    if untrusted:
        return "not verified" if key else UNSIGNED
    return SIGNED if key else UNSIGNED


def roll_into(previous: CapsuleEntry, loaded: str, loaded_name: str) -> str:
    """The capsule Markdown of `previous` (the session's latest capsule) and `loaded` (the
    file's), section by section, each part under a line saying where it came from."""
    if previous.source is None:
        own = f"From this session before the load (capsule {previous.checkpoint_id}):"
    else:
        earlier = previous.title or Path(previous.source).name
        own = f"From {earlier!r}, loaded into this session earlier ({previous.checkpoint_id}):"
    new = f"From the loaded handoff ({loaded_name}):"
    session = parse_capsule(previous.content, require_all=False)
    handed = parse_capsule(loaded, require_all=False)
    sections: dict[str, str] = {}
    for field in SECTION_FIELDS:
        parts = [(own, str(getattr(session, field))), (new, str(getattr(handed, field)))]
        sections[field] = "\n\n".join(f"{label}\n\n{body}" for label, body in parts if body)
    extras = [*session.extra_sections, *handed.extra_sections]
    return render_capsule(Capsule(**sections, extra_sections=extras))


def load_capsule(
    path: str | os.PathLike[str],
    transcript: Transcript,
    *,
    session_notebook: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] = os.environ,
    counter: TokenCounter | None = None,
    untrusted: bool = False,
    project_root: Path | None = None,
    hard_limit: int | None = None,
) -> CapsuleEntry:
    """Load a capsule file into the session: one capsule entry, trigger `user`.

    A relative `path` is taken from the notebook's folder (the working folder without a
    notebook). The loaded capsule gets a fresh checkpoint id in this session; `source`
    records the file it came from. `untrusted`: read a plain Markdown handoff (a link out of
    `project_root` is refused). `hard_limit`: refuse a capsule above `MAX_SHARE_OF_HARD_LIMIT`
    of it. Raises `CapsuleFileError`; nothing is appended then.
    """
    given = _resolve(path, session_notebook)
    if untrusted:
        root = project_root or (Path(session_notebook).parent if session_notebook is not None else None)
        if root is not None:
            _refuse_link_out(given, Path(root).expanduser())
    resolved = given.resolve()
    loaded = read_for_load(resolved, untrusted=untrusted, environ=environ)
    counter = counter or TokenCounter.for_model(*DEFAULT_COUNTING_MODEL)
    # Never a figure from the file: the size is counted with this session's tokenizer.
    tokens = counter.count_text(loaded.body)
    if hard_limit is not None and tokens > (most := int(hard_limit * MAX_SHARE_OF_HARD_LIMIT)):
        raise CapsuleFileError(
            resolved,
            f"is {tokens:,} tokens; a capsule loaded into this session may take at most {most:,} "
            f"(half of its hard limit, {hard_limit:,})",
        )
    context = visible_context(transcript.path_view())
    previous = context.capsule
    content = loaded.body if previous is None else roll_into(previous, loaded.body, resolved.name)
    if previous is not None:
        tokens = counter.count_text(content)
    entry = CapsuleEntry(
        operation_id=f"{LOAD_OPERATION_PREFIX}{secrets.token_hex(OPERATION_ID_BYTES)}",
        checkpoint_id=new_checkpoint_id(),
        trigger="user",
        quality=loaded.quality,
        tokens_before=tokens,
        tokens_after=tokens,
        first_kept_entry_id=context.entries[0].id if context.entries else None,
        rolls_up=previous.id if previous is not None else None,
        content=content,
        source=str(resolved),
        title=loaded.title,
    )
    written = transcript.append(entry)
    assert isinstance(written, CapsuleEntry)
    return written


@dataclass(frozen=True)
class LoadSummary:
    """What a load did to the session, for the cell's message."""

    kept_entries: int
    """Entries of the session the model still sees, after the loaded capsule."""
    rolled_up: str | None
    """Checkpoint id of the session's capsule rolled into the loaded one."""
    before: str
    """Where `%rewind` goes back to before the load: a checkpoint id, else an entry id."""

    @property
    def had_history(self) -> bool:
        return bool(self.kept_entries) or self.rolled_up is not None


def summarize_load(transcript: Transcript, entry: CapsuleEntry) -> LoadSummary:
    """Read back from the transcript what loading `entry` kept, rolled up and replaced."""
    path = transcript.path_view()
    index = next(i for i in range(len(path) - 1, -1, -1) if path[i].id == entry.id)
    kept = visible_context(path[: index + 1], capsule_at=index).entries
    rolled = transcript.get(entry.rolls_up) if entry.rolls_up else None
    parent = transcript.get(entry.parent_id) if entry.parent_id else None
    before = parent.checkpoint_id if isinstance(parent, CheckpointEntry | CapsuleEntry) else (entry.parent_id or "")
    return LoadSummary(
        kept_entries=len(kept),
        rolled_up=rolled.checkpoint_id if isinstance(rolled, CapsuleEntry) else None,
        before=before,
    )
