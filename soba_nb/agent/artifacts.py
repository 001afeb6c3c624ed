"""Images the agent's calls displayed, kept as artifacts (SPEC §10).

Each image is written once, named by its content, in the session folder:
`<notebook-stem>.soba/artifacts/<sha256>.png` (or `.jpg`), private to the user like the
transcript beside it. The `tool_result` entry lists it (`artifacts`: path relative to the
notebook's folder, mime, sha256, width, height) and its content names it in one line, so a
model that takes no images, the capsule and a reader of the transcript all know it is there.

The folder is soba's own (the file tools never write it) and is opened without following
links: a link planted in its place, or in a file's, is refused, never written through. An
image that cannot be read or kept is named in the content with the reason; the call's
result stands.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from soba_nb.agent.tools.base import DisplayedImage
from soba_nb.agent.vault import write_once
from soba_nb.transcript.entries import Artifact

EXTENSIONS = {"image/png": ".png", "image/jpeg": ".jpg"}
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg"}
"""Pillow's name of a format → the mime type an artifact is kept under."""


class ArtifactError(OSError):
    """An image could not be kept (the message says why, in one line)."""


@dataclass(frozen=True)
class Kept:
    """What became of the images of one call."""

    artifacts: tuple[Artifact, ...]
    notes: tuple[str, ...]
    """One line per image: the artifact and its size, or why it was not kept."""


def image_size(data: bytes) -> tuple[str, int, int]:
    """(mime type, width, height) read from the image's header; raises `ArtifactError` for
    bytes that are not a PNG or JPEG image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            mime = FORMATS.get(image.format or "")
            width, height = image.size
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as error:
        raise ArtifactError(f"not a readable image ({type(error).__name__})") from None
    if mime is None or width < 1 or height < 1:
        raise ArtifactError("not a PNG or JPEG image")
    return mime, width, height


def keep_images(images: Sequence[DisplayedImage], folder: Path, relative_to: Path) -> Kept:
    """Keep each image in `folder` (the session folder's `artifacts/`); paths in the entries
    are relative to `relative_to` (the notebook's folder)."""
    artifacts: list[Artifact] = []
    notes: list[str] = []
    for number, image in enumerate(images, 1):
        try:
            artifact = _keep(image, folder, relative_to)
        except ArtifactError as error:
            notes.append(f"[image {number}: not kept: {error}]")
            continue
        artifacts.append(artifact)
        kind = artifact.mime.split("/")[1].upper()
        notes.append(f"[image {number}: {artifact.path} · {artifact.width}×{artifact.height} {kind}]")
    return Kept(tuple(artifacts), tuple(notes))


def _keep(image: DisplayedImage, folder: Path, relative_to: Path) -> Artifact:
    mime, width, height = image_size(image.data)
    digest = hashlib.sha256(image.data).hexdigest()
    name = digest + EXTENSIONS[mime]
    try:
        write_once(folder, name, image.data)
    except OSError as error:
        raise ArtifactError(f"cannot write {folder / name} ({error.strerror or error})") from None
    path = Path(os.path.relpath(folder / name, relative_to)).as_posix()
    return Artifact(path=path, mime=mime, sha256=digest, width=width, height=height)  # type: ignore[arg-type]
