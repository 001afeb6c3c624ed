"""A minimal Server-Sent Events parser over the lines of a streamed HTTP answer.

Both wire formats stream with SSE: OpenAI-compatible servers send `data:` lines only
(ending with `data: [DONE]`), Anthropic names each event with an `event:` line. The
parser follows the WHATWG rules the servers rely on — `field: value` lines, several
`data:` lines joined by newlines, `:` comment lines (keep-alives) ignored, a blank line
dispatches the event — and nothing more (no `id:`/`retry:` reconnection: a dropped
stream is a failed request, retried by `soba_nb.providers.http`).

Hand-written because it is tiny and `httpx-sse` is not a dependency.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

DONE_SENTINEL = "[DONE]"
"""OpenAI-style streams end with `data: [DONE]`."""

DEFAULT_EVENT = "message"
"""The event name when a server sends `data:` lines without an `event:` line."""


@dataclass(frozen=True)
class ServerSentEvent:
    """One dispatched event: its name and its data (several `data:` lines joined by `\\n`)."""

    event: str
    data: str

    @property
    def is_done(self) -> bool:
        """True for the OpenAI end-of-stream marker `data: [DONE]`."""
        return self.data.strip() == DONE_SENTINEL


def _split_field(line: str) -> tuple[str, str]:
    """`field: value` → (field, value); one space after the colon is part of the syntax."""
    field, colon, value = line.partition(":")
    if not colon:
        return line, ""
    if value.startswith(" "):
        value = value[1:]
    return field, value


def iter_sse_events(lines: Iterable[str]) -> Iterator[ServerSentEvent]:
    """Yield the events of an SSE stream given its lines (without line terminators).

    An event still open when the lines run out is dispatched too: some servers close
    the stream right after the last `data:` line without the blank line.
    """
    event_name = ""
    data_lines: list[str] = []
    for raw_line in lines:
        line = raw_line.rstrip("\r\n")
        if not line:
            if data_lines:
                yield ServerSentEvent(event_name or DEFAULT_EVENT, "\n".join(data_lines))
            event_name, data_lines = "", []
            continue
        if line.startswith(":"):
            continue
        field, value = _split_field(line)
        if field == "data":
            data_lines.append(value)
        elif field == "event":
            event_name = value
    if data_lines:
        yield ServerSentEvent(event_name or DEFAULT_EVENT, "\n".join(data_lines))
