"""What the agent's `python` calls display, seen through IPython's own display machinery
(SPEC §10).

A call runs inside the `%soba` cell, so whatever it displays goes through the shell's display
publisher to the cell like any output: a kernel sends it to the frontend, a terminal prints
its text. `ShellDisplays.capture` lets it through unchanged and keeps a copy of every PNG or
JPEG on the way (the receipt's images, kept as artifacts and shown to the model). Under
matplotlib's inline backend a figure is displayed only when the cell ends
(`flush_figures`, a `post_execute` hook); a call's figures are flushed when the call ends
instead, so each plot shows under the call that drew it and is captured with it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from soba_nb.agent.tools.base import DisplayedImage
from soba_nb.notebook.cells import IMAGE_TYPES, image_bytes

IMAGES_PER_CALL = 8
"""Images kept from one call (the first ones); more still show in the cell."""
IMAGE_BYTES_MAX = 32 * 1024 * 1024
"""An image larger than this is shown but not kept (no plot is near it)."""
_INLINE_BACKEND = "matplotlib_inline.backend_inline"


class ShellDisplays:
    """The `DisplayCapture` of one IPython shell."""

    def __init__(self, shell: Any):
        self.shell = shell

    @contextmanager
    def capture(self) -> Iterator[list[DisplayedImage]]:
        shown: list[DisplayedImage] = []
        publisher = getattr(self.shell, "display_pub", None)
        if publisher is None:
            yield shown
            return
        own = "publish" in vars(publisher)  # (the cell recorder's wrapper, an instance attribute)
        previous = publisher.publish

        def publish(data: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(data, dict) and len(shown) < IMAGES_PER_CALL:
                shown.extend(_images_in(data))
            return previous(data, *args, **kwargs)

        publisher.publish = publish
        try:
            yield shown
            _flush_inline_figures()
        finally:
            if own:
                publisher.publish = previous
            else:
                del publisher.publish

    def show(self, value: Any) -> bool:
        formatter = getattr(self.shell, "display_formatter", None)
        if formatter is None:
            return False
        data, metadata = formatter.format(value)
        if not any(mime in data for mime in IMAGE_TYPES):
            return False
        from IPython.display import publish_display_data

        publish_display_data(data, metadata)  # type: ignore[no-untyped-call]
        return True


def _images_in(data: dict[str, Any]) -> list[DisplayedImage]:
    found = []
    for mime in IMAGE_TYPES:
        raw = image_bytes(data.get(mime)) if mime in data else None
        if raw and len(raw) <= IMAGE_BYTES_MAX:
            found.append(DisplayedImage(mime, raw))
    return found


def _flush_inline_figures() -> None:
    """Show the figures the call drew under the inline backend now (a no-op when that backend
    drew none, or is not loaded)."""
    backend = sys.modules.get(_INLINE_BACKEND)
    flush = getattr(backend, "flush_figures", None)
    if flush is not None:
        flush()
