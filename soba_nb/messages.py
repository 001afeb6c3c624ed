"""Chat message types shared by the compaction core (model-input assembly) and providers.

Kept free of any provider or IPython import so the compaction core stays pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from msgspec import Struct


class ToolCall(Struct, gc=False):
    """One tool call the model asked for."""

    id: str
    """Provider call id; tool results refer to it."""
    name: str
    arguments: str = "{}"
    """The JSON text of the arguments, exactly as the model produced it."""


class ImagePart(Struct, gc=False, frozen=True):
    """An image a message carries to a model that takes images: one a tool call displayed
    (SPEC §10), or one the user's own cell displayed (SPEC §15)."""

    path: str
    """The artifact, relative to the notebook's folder (as the transcript names it)."""
    mime: str
    width: int
    height: int
    data: str | None = None
    """Base64 of the bytes as sent (resized), filled in just before the request leaves; a
    provider sends only parts that have it."""
    label: str | None = None
    """What names it beside the image in a request instead of the bare path: the cell that
    displayed it (`In [11]`), for the user's images."""

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{self.data or ''}"


class ChatMessage(Struct, gc=False):
    """One message of model input, in a provider-neutral shape.

    A plain struct, not a validated model: model input builds one per visible entry on every
    assembly (tens of thousands on a long uncompacted path), from entries that were validated
    when they were read. Like the transcript's entries it is left out of the cyclic garbage
    collector (`gc=False`: it refers to strings and its own list of calls, never back to
    anything that refers to it), so building a long model input allocates nothing the
    collector must scan afterwards."""

    role: Literal["user", "assistant", "tool"]
    content: str = ""
    tool_calls: Sequence[ToolCall] = ()
    """Only on assistant messages (none: the shared empty tuple, no list per message)."""
    tool_call_id: str | None = None
    """Only on tool messages: the call this result answers."""
    name: str | None = None
    """Only on tool messages: the tool's name."""
    is_error: bool = False
    """Only on tool messages: the tool failed."""
    images: Sequence[ImagePart] = ()
    """On tool messages, the images the call displayed, to send with its result; on the user
    message of a cells block, the images the user's cells displayed (newest last). Named
    without bytes in model input; `agent.request_images.with_images` fills in the bytes of the
    newest `notebook.maxImagesPerRequest` over all messages (none for a model that takes no
    images) just before a request leaves, and a provider puts those on the wire: with the tool
    result as its format allows, or as image parts of the user message itself."""

    def sent_images(self) -> list[ImagePart]:
        """The images this message carries in a request (those with their bytes filled in)."""
        return [part for part in self.images if part.data]


IMAGES_LABEL = "Images the calls above displayed, in order:"
"""The text ahead of images sent as a message of their own (Chat Completions, Responses)."""


def image_label(part: ImagePart) -> str:
    """How an image is named beside it in a request: the cell that displayed it, for the user's
    images (the cells block names it the same way; its artifact's 64-hex path would cost the
    model 40 tokens and tell it nothing), else its artifact, as the call's result names it;
    and the size sent."""
    if part.label:
        return f"{part.label}: displayed {part.mime} ({part.width}×{part.height})"
    return f"{part.path} ({part.width}×{part.height})"


class ToolSchema(Struct, frozen=True):
    """A tool the model may call: name, description and JSON schema of its parameters."""

    name: str
    description: str
    parameters: dict[str, object]
