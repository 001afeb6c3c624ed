"""Which images a request carries, and their bytes (SPEC §10, §15).

Model input names every image a call displayed (its tool result lists the artifacts) and every
image the user's cells displayed (the cells entry lists them). Just before a request leaves,
this decides what is sent: for a model that takes images, the newest
`notebook.maxImagesPerRequest` of them over both — messages from the last back, each message's
images from its last — each read from its artifact and made no larger than
`soba_nb.images.sent_size` (a 20-megapixel plot is resized, never sent whole); older ones, and
every image for a model that takes none, stay what the result's text already says they are —
one line naming the artifact and its size. An artifact that cannot be read (deleted, replaced
by a link, not an image any more) is not sent either; the line still names it.
"""

from __future__ import annotations

import base64
import functools
import io
from collections.abc import Sequence
from pathlib import Path

import msgspec

from soba_nb.compaction.model_input import image_part_tokens
from soba_nb.images import sent_size
from soba_nb.messages import ChatMessage, ImagePart
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.sidecar import read_regular

ARTIFACT_BYTES_MAX = 64 * 1024 * 1024
"""An artifact file larger than this is not read (no image the agent displayed is near it)."""
ENCODED_CACHE = 32
"""Images kept encoded between the requests of a session (each turn re-sends the newest)."""


def with_images(messages: Sequence[ChatMessage], *, base: Path, vision: bool, max_images: int) -> list[ChatMessage]:
    """`messages` with each message's images (a tool result's, a cells block's) either filled
    in (sent) or dropped (named in its text only); nothing else changes."""
    if not any(message.images for message in messages):
        return list(messages)
    budget = max_images if vision else 0
    prepared: list[ChatMessage] = list(messages)
    for index in range(len(prepared) - 1, -1, -1):
        message = prepared[index]
        if not message.images:
            continue
        kept: list[ImagePart] = []
        for part in reversed(message.images):  # the newest image of the call (or cell) first
            if budget <= 0:
                break
            data = _encoded(str(base / part.path), part.mime)
            if data is not None:
                width, height = sent_size(part.width, part.height)
                kept.append(ImagePart(part.path, part.mime, width, height, data, part.label))
                budget -= 1
        prepared[index] = msgspec.structs.replace(message, images=tuple(reversed(kept)))
    return prepared


@functools.lru_cache(maxsize=ENCODED_CACHE)
def _encoded(path: str, mime: str) -> str | None:
    """Base64 of the artifact as sent (resized when larger than a request takes), or None."""
    data = read_regular(Path(path), ARTIFACT_BYTES_MAX)
    if data is None:
        return None
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            size = sent_size(*image.size)
            if size != image.size:
                smaller = image.resize(size, Image.Resampling.LANCZOS, reducing_gap=2.0)
                out = io.BytesIO()
                if mime == "image/jpeg":
                    smaller.convert("RGB").save(out, format="JPEG", quality=90)
                else:
                    smaller.save(out, format="PNG")
                data = out.getvalue()
            else:
                image.verify()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None
    return base64.b64encode(data).decode("ascii")


def sent_image_tokens(prepared: Sequence[ChatMessage], counter: TokenCounter) -> int:
    """Our estimate of the images a request (`prepared`, from `with_images`) carries: the server
    counts them by its own rule or not at all, so the evidence about its counting leaves them
    out (`usage_evidence`)."""
    return sum(image_part_tokens(part, counter) for message in prepared for part in message.images if part.data)


def unsent_image_tokens(named: Sequence[ChatMessage], prepared: Sequence[ChatMessage], counter: TokenCounter) -> int:
    """Tokens of the images model input names (`named`) that the request (`prepared`, from
    `with_images`) does not carry: older than the newest `notebook.maxImagesPerRequest`, or
    unreadable. The budget counts every image as if sent (never under); the server counts only
    those sent, so a comparison with its usage figure (`usage_evidence`) must leave these out,
    or plots rotating out of the request look like a server that cuts prompts."""

    def tokens(messages: Sequence[ChatMessage], sent: bool) -> int:
        return sum(
            image_part_tokens(part, counter) for message in messages for part in message.images if part.data or not sent
        )

    return max(tokens(named, sent=False) - tokens(prepared, sent=True), 0)
