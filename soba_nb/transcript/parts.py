"""The structs transcript entries hold (SPEC §7, §10, §11): an image kept as an artifact, a
file a tool changed or a rewind restored, a notebook cell as the model is told of it and as
it ran. Kept apart from `entries` so each module stays small; `entries` re-exports them.

No `from __future__ import annotations` (see `entries`: the decoder reads every field's type).
"""

from typing import Annotated, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

NonEmpty = Annotated[str, Meta(min_length=1)]


ImageMime = Literal["image/png", "image/jpeg"]
Sha256 = Annotated[str, Meta(pattern="^[0-9a-f]{64}$")]


class Artifact(Struct, kw_only=True, frozen=True, rename="camel", gc=False):
    """An image a tool call displayed, kept in the session folder (SPEC §10)."""

    path: NonEmpty
    """`<notebook-stem>.soba/artifacts/<sha256>.png` (or `.jpg`), relative to the notebook's folder."""
    mime: ImageMime
    sha256: Sha256
    width: Annotated[int, Meta(ge=1)]
    height: Annotated[int, Meta(ge=1)]


class FileChange(Struct, kw_only=True, frozen=True, rename="camel", gc=False):
    """A file a tool call wrote or edited (SPEC §11): its bytes before and after, kept by
    sha256 in `<notebook-stem>.soba/files/`, so `%rewind --files` can put it back."""

    path: NonEmpty
    """Relative to the project folder, `/`-separated."""
    before: Sha256 | None
    """The bytes before the call; null: the file did not exist."""
    after: Sha256 | None
    """The bytes after the call; null: the file is gone (a restore deleted it)."""


RestoreAction = Literal["restored", "deleted", "left_alone", "failed"]


class RestoredFile(Struct, kw_only=True, frozen=True, rename="camel", gc=False):
    """One file `%rewind --files` looked at."""

    path: NonEmpty
    action: RestoreAction
    """`restored` to its bytes at the target, `deleted` (the agent created it after the
    target), `left_alone` (changed by someone else since; `--force` overrides), `failed`."""
    sha256: Sha256 | None
    """The bytes in place afterwards (null: no file)."""
    previous: Sha256 | None = None
    """The bytes in place before the restore (null: no file)."""


CellOutcome = Literal["ok", "error"]


class CellRecord(Struct, kw_only=True, frozen=True, rename="camel", gc=False):
    """One notebook cell the user ran, as the model is told of it (SPEC §10)."""

    execution_count: int | None = None
    """The `In [n]` of the cell; null when the kernel gave none."""
    source: str = ""
    outcome: CellOutcome = "ok"
    error: str | None = None
    """For an error: `Type: message`, then the traceback (clipped to its last lines)."""
    output: str | None = None
    """The repr of its result (`Out[n]`) and the kinds of the non-image rich outputs it
    displayed (`[displayed: text/html]`), clipped. In entries written before `printed` was
    recorded apart, also the text it printed (ahead) and `[displayed: image/png]`."""
    printed: str | UnsetType = UNSET
    """What the cell printed (stdout and stderr), clipped; absent when it printed nothing, and
    in entries written before it was recorded apart (their `output` holds it)."""
    images: list[Artifact] | UnsetType = UNSET
    """The images it displayed, kept as artifacts like a tool call's (SPEC §15), in order;
    absent when none."""
    images_not_kept: list[str] | UnsetType = UNSET
    """`imagesNotKept`: one line per image it displayed that was not kept, naming its kind and
    why (`image/png not kept: not a readable image (UnidentifiedImageError)`); absent when none."""


SourceOutcome = Literal["ok", "error", "unrecorded"]


class CellSource(Struct, kw_only=True, frozen=True, rename="camel", gc=False):
    """One cell the user ran, whole: what `/code` exports and `/rebuild` re-runs."""

    execution_count: int
    source: str
    """Its source as typed (IPython syntax included), redacted, never clipped."""
    outcome: SourceOutcome = "ok"
    """`unrecorded`: it ran before `%load_ext soba_nb`, so how it ended was not seen."""
