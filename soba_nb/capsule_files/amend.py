"""A capsule the user corrected (SPEC §14, `%%capsule amend CHECKPOINT`).

An amendment appends one new `capsule` entry at the leaf, never edits the old one (the
transcript is append-only): a new `checkpointId`, `amends` naming the capsule it corrects,
the same `firstKeptEntryId`, `trigger`, `quality`, `rollsUp`, before-figures and title/source
as that capsule, `author` the user (`user@host`, as `.capsule.md` files name theirs), and the
user's Markdown, validated (all 13 headings) and rendered the way capsules are.

Why this is all it takes for the next request to carry it: model input uses the latest
capsule on the path and the entries from its `firstKeptEntryId` on (`visible_context`), and
capsule entries are never model-visible themselves; so the amendment, appended after the
kept tail with the same `firstKeptEntryId`, is sent in place of the capsule it corrects (now
a capsule entry inside the tail, skipped), with the same kept tail and whatever came after.
The next compaction rolls up the latest capsule — the amendment. The provider's native item
of the corrected capsule is not carried over: it holds the old summary, and the user's text
must be what is sent.

Only the latest capsule on the current path can be amended (it is the one the next request
carries; an older one no longer reaches the model). Every error is one line (`AmendError`),
and nothing is appended then. The text is redacted with this machine's environment before it
reaches the transcript (the store redacts every entry again on the way to disk).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping

import msgspec

from soba_nb.capsule_files.file import current_author
from soba_nb.compaction.capsule import CapsuleFormatError, parse_capsule, render_capsule
from soba_nb.compaction.model_input import capsule_text, latest_capsule_index
from soba_nb.redact import redact
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import CapsuleEntry, CheckpointEntry, new_checkpoint_id
from soba_nb.transcript.store import Transcript

AMEND_OPERATION_PREFIX = "op_amend_"
OPERATION_ID_BYTES = 6


class AmendError(ValueError):
    """An amendment refused (the message is one line naming what is wrong); nothing appended."""


def amendable(transcript: Transcript, checkpoint_id: str | None) -> CapsuleEntry:
    """The capsule `checkpoint_id` names (None: the latest on the path), if it may be amended:
    it is the latest capsule on the current path. Raises `AmendError`."""
    path = transcript.path_view()
    latest_at = latest_capsule_index(path)
    latest = path[latest_at] if latest_at is not None else None
    assert latest is None or isinstance(latest, CapsuleEntry)
    if checkpoint_id is None:
        if latest is None:
            raise AmendError("no capsule on the current path yet: %compact makes one")
        return latest
    found = transcript.find_checkpoint(checkpoint_id)
    if found is None:
        raise AmendError(f"no checkpoint {checkpoint_id} in this session")
    if isinstance(found, CheckpointEntry):
        raise AmendError(f"{checkpoint_id} is a {found.kind} checkpoint, not a capsule: only a capsule can be amended")
    if latest is None or found.id != latest.id:
        newest = f" ({latest.checkpoint_id} is)" if latest is not None else ""
        raise AmendError(
            f"{checkpoint_id} is not the latest capsule on the current path{newest}: only the capsule the next "
            "request carries can be amended"
        )
    return found


def amended_entry(
    original: CapsuleEntry,
    text: str,
    *,
    counter: TokenCounter | None = None,
    author: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> CapsuleEntry:
    """The capsule entry that corrects `original` with the Markdown `text` (not appended).
    Raises `AmendError` for an empty text, missing headings, or no change."""
    if not text.strip():
        raise AmendError(f"the cell is empty: put the capsule's Markdown under %%capsule amend {original.checkpoint_id}")
    try:
        capsule = parse_capsule(text)
    except CapsuleFormatError as exc:
        raise AmendError(f"not amended: {exc}") from None
    content = redact(render_capsule(capsule), environ)
    if content == original.content:
        raise AmendError(f"not amended: the text is {original.checkpoint_id}'s as it is (nothing changed)")
    entry = CapsuleEntry(
        operation_id=f"{AMEND_OPERATION_PREFIX}{secrets.token_hex(OPERATION_ID_BYTES)}",
        checkpoint_id=new_checkpoint_id(),
        trigger=original.trigger,
        quality=original.quality,
        tokens_before=original.tokens_before,
        tokens_after=original.tokens_after,
        estimated_before=original.estimated_before,
        first_kept_entry_id=original.first_kept_entry_id,
        rolls_up=original.rolls_up,
        content=content,
        source=original.source,
        title=original.title,
        amends=original.checkpoint_id,
        author=author or current_author(),
    )
    if counter is not None:
        # The continuation changes by what the capsule text does (the tail is the same).
        change = counter.count_message("user", capsule_text(entry)) - counter.count_message("user", capsule_text(original))
        entry = msgspec.structs.replace(entry, tokens_after=max(original.tokens_after + change, 0))
    return entry


def amend_capsule(
    transcript: Transcript,
    checkpoint_id: str,
    text: str,
    *,
    counter: TokenCounter | None = None,
    author: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> CapsuleEntry:
    """Validate `text` as a correction of the capsule `checkpoint_id` and append it (one
    capsule entry). Raises `AmendError`; nothing is appended then."""
    original = amendable(transcript, checkpoint_id)
    entry = amended_entry(original, text, counter=counter, author=author, environ=environ)
    written = transcript.append(entry)
    assert isinstance(written, CapsuleEntry)
    return written
