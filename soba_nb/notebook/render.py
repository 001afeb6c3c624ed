"""What a `%soba` turn shows in the cell output (SPEC §9).

Rich (a kernel with a frontend): the answer streams into one display handle as Markdown,
updated at most `MAX_UPDATES_PER_S` times a second and rendered once more, whole, when the
answer ends; each tool call is a collapsed receipt (`<details>`: tool · arguments · status
· duration, the output's first lines inside); a compaction barrier shows its live line and
collapses to the result line (the JupyterLab sidebar, when given, gets the same lines).
Every object displayed carries `text/plain` with the same content (plain-text parity), so
nbconvert-to-text and logs read the same thing.

Plain text stays plain (SPEC §16): what a server, the model or a file put in an answer, a
receipt, a notice or an error line is shown with its control characters escaped
(`soba_nb.printable`: `\\x1b[2J`, never a cleared terminal), newlines and tabs kept, in every
`text/plain` and every printed line.

Plain (terminal IPython, a bare `InteractiveShell`): the same information printed as text
lines — the answer as it streams, one line per receipt, the compaction result line,
notices and errors.
"""

from __future__ import annotations

import html
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from soba_nb.agent.events import Notice, Steered, TextDelta, ToolFinished, ToolStarted, Waiting
from soba_nb.agent.loop import TurnResult
from soba_nb.agent.receipts import receipt_status
from soba_nb.agent.receipts import receipt_text as receipt_text  # its home: agent/receipts
from soba_nb.compaction.outcomes import CompactionEvent
from soba_nb.notebook.monitor import (
    MAX_UPDATES_PER_S,
    BarrierLine,
    Clock,
    SidebarPublisher,
    Throttle,
)
from soba_nb.printable import printable
from soba_nb.providers.reading import READING

STATUS_UPDATES_PER_S = 2
"""The live status line ("waiting for the model · 3 s") changes at most this often."""
PLAIN_READING_EVERY_S = 30.0
"""Plain output repeats the "the model is reading N tokens · 45 s" line this often."""
RUNNING = "running"
NOTICE_COLORS = {"error": "#c62828", "warning": "#ef6c00", "info": "#555", "muted": "#888"}


class TextView:
    """Text shown as Markdown, with the same text as `text/plain`; control characters escaped
    in both (an ESC or a bidi override from a server or the model never reaches the page raw)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return printable(self.text, lines=True)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        # An answer's CRLF line ends are line ends (what runs, a call, keeps its CR: escaped).
        shown = printable(self.text.replace("\r\n", "\n"), lines=True)
        return {"text/markdown": shown, "text/plain": shown}


class HtmlView:
    """An HTML fragment with its plain-text twin."""

    def __init__(self, html_text: str, plain: str):
        self.html = html_text
        self.plain = printable(plain, lines=True)

    def __repr__(self) -> str:
        return self.plain

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/html": self.html, "text/plain": self.plain}


def receipt_view(name: str, summary: str, status: str, duration_ms: int | None, preview: str) -> HtmlView:
    """A collapsed receipt: the summary line, the output's first lines inside."""
    line = printable(receipt_text(name, summary, status, duration_ms))
    preview = printable(preview, lines=True)
    body = f"<pre>{html.escape(preview)}</pre>" if preview else ""
    markup = f'<details class="soba-receipt"><summary><code>{html.escape(line)}</code></summary>{body}</details>'
    plain = f"[{line}]" + (("\n" + preview) if preview else "")
    return HtmlView(markup, plain)


def notice_view(text: str, level: str) -> HtmlView:
    color = NOTICE_COLORS.get(level, NOTICE_COLORS["info"])
    text = printable(text, lines=True)
    return HtmlView(f'<div style="color:{color}">{html.escape(text)}</div>', text)


def line_view(text: str) -> HtmlView:
    text = printable(text)
    return HtmlView(f"<div><code>{html.escape(text)}</code></div>", text)


STEER_LABEL = "steer: "
"""How the cell shows a message the user sent into the running turn from the sidebar."""
APPROVAL_HEADING = "Approval needed before this call runs:"
APPROVAL_SCROLL_LINES = 30
"""A call longer than this many lines says so above its block, which scrolls (max-height)."""


def approval_view(shown: str) -> HtmlView:
    """The call as escaped text in a `<pre>` — never Markdown around it, whose fences and
    comments the call's own text could close or open — whole, in a block that scrolls."""
    return whole_block_view(APPROVAL_HEADING, shown, "soba-approval")


def whole_block_view(heading: str, text: str, css_class: str) -> HtmlView:
    """`text` under a bold heading, whole, as escaped text in a `<pre>` that scrolls past 30em:
    what the user approves or accepts is read exactly as it is (SPEC §16)."""
    text = printable(text, lines=True)
    count = text.count("\n") + 1
    note = f"{count} lines, shown whole: scroll the block to read them all." if count > APPROVAL_SCROLL_LINES else ""
    markup = (
        f'<div class="{css_class}"><b>{html.escape(heading)}</b>'
        + (f"<div>{html.escape(note)}</div>" if note else "")
        + '<pre style="max-height:30em;overflow:auto;white-space:pre">'
        + html.escape(text)
        + "</pre></div>"
    )
    return HtmlView(markup, "\n".join(filter(None, (heading, note, text))))


Display = Callable[..., Any]
"""`IPython.display.display`: `display(obj, display_id=True)` returns a handle with `update`."""


def ipython_display(obj: Any, **kwargs: Any) -> Any:
    """`IPython.display.display`, imported when first used."""
    from IPython.display import display

    return display(obj, **kwargs)  # type: ignore[no-untyped-call]


class TurnRenderer:
    """Receives the agent's events (`on_event`) and shows them; `finish` ends the turn.

    The last notice is held back one event: the loop's closing notice is replaced by the
    status line `finish` prints (`cancelled: …`, `failed: …`), so it is not shown twice.
    """

    def __init__(
        self,
        *,
        rich: bool,
        sidebar: SidebarPublisher | None = None,
        display: Display | None = None,
        clock: Clock = time.monotonic,
        stream: TextIO | None = None,
    ):
        self.rich = rich
        self.sidebar = sidebar
        self.display = display or ipython_display
        self.clock = clock
        self.stream = stream
        self.throttle = Throttle(MAX_UPDATES_PER_S, clock)
        self.answer = ""
        self._answer_handle: Any = None
        self._dirty = False
        self._line_open = False
        self._receipts: dict[str, Any] = {}
        self._barrier: BarrierLine | None = None
        self._barrier_handle: Any = None
        self._held_notice: Notice | None = None
        self._status_handle: Any = None
        self._status_throttle = Throttle(STATUS_UPDATES_PER_S, clock)
        self._reading_printed_at: float | None = None

    # -- plain output ----------------------------------------------------------------

    def _write(self, text: str) -> None:
        out = self.stream or sys.stdout
        out.write(text)
        out.flush()

    def print_line(self, text: str) -> None:
        """A whole line (after ending a streamed answer line), control characters escaped."""
        if self._line_open:
            self._write("\n")
            self._line_open = False
        self._write(printable(text, lines=True) + "\n")

    # -- events ----------------------------------------------------------------------

    def on_event(self, event: object) -> None:
        if isinstance(event, Waiting):
            self._waiting(event)
            return
        self._clear_status()
        if self._held_notice is not None:
            held, self._held_notice = self._held_notice, None
            self._show_notice(held)
        if isinstance(event, TextDelta):
            self._text(event.text)
        elif isinstance(event, ToolStarted):
            self._end_answer()
            self._tool_started(event)
        elif isinstance(event, ToolFinished):
            self._tool_finished(event)
        elif isinstance(event, CompactionEvent):
            self._compaction(event)
        elif isinstance(event, Notice):
            self._held_notice = event
        elif isinstance(event, Steered):  # the user's message into the running turn (SPEC §18)
            self._end_answer()
            self.show(f"{STEER_LABEL}{event.text}")

    __call__ = on_event

    def _text(self, text: str) -> None:
        self.answer += text
        if not self.rich:
            self._write(printable(text, lines=True))
            self._line_open = not self.answer.endswith("\n")
            return
        if self._answer_handle is None:
            self._answer_handle = self.display(TextView(self.answer), display_id=True)
            self.throttle.mark()
            self._dirty = False
        elif self.throttle.ready():
            self._answer_handle.update(TextView(self.answer))
            self._dirty = False
        else:
            self._dirty = True

    def _waiting(self, event: Waiting) -> None:
        """Signs of life before the answer starts: a live status line, replaced by the answer."""
        if not self.rich:
            self._print_reading(event)
            return
        if not self._status_throttle.ready():
            return
        view = line_view(f"{event.status} · {event.elapsed_s:.0f} s")
        if self._status_handle is None:
            self._status_handle = self.display(view, display_id=True)
        else:
            self._status_handle.update(view)

    def _print_reading(self, event: Waiting) -> None:
        """A terminal gets the line of a local model reading a long prompt (SPEC §17) when it
        begins and every `PLAIN_READING_EVERY_S` after: a wait of minutes says what it is, and
        a log is not flooded with seconds. The ordinary short wait prints nothing, as before."""
        if not event.status.startswith(READING):
            return
        last = self._reading_printed_at
        if last is not None and last <= event.elapsed_s < last + PLAIN_READING_EVERY_S:
            return
        self._reading_printed_at = event.elapsed_s
        self.print_line(f"{event.status} · {event.elapsed_s:.0f} s")

    def _clear_status(self) -> None:
        self._reading_printed_at = None
        if self._status_handle is not None:
            self._status_handle.update(HtmlView("", ""))
            self._status_handle = None

    def _end_answer(self) -> None:
        """Render the answer so far whole and start a new segment for later text."""
        if self._answer_handle is not None and self._dirty:
            self._answer_handle.update(TextView(self.answer))
            self.throttle.mark()
        if not self.rich and self._line_open:
            self._write("\n")
            self._line_open = False
        self._answer_handle, self._dirty, self.answer = None, False, ""

    def _tool_started(self, event: ToolStarted) -> None:
        if self.rich:
            view = receipt_view(event.name, event.summary, RUNNING, None, "")
            self._receipts[event.call_id] = self.display(view, display_id=True)

    def _tool_finished(self, event: ToolFinished) -> None:
        status = receipt_status(event.is_error, event.declined)
        duration = None if event.declined else event.duration_ms  # it never ran
        view = receipt_view(event.name, event.summary, status, duration, event.preview)
        handle = self._receipts.pop(event.call_id, None)
        if not self.rich:
            self.print_line(f"[{receipt_text(event.name, event.summary, status, duration)}]")
        elif handle is not None:
            handle.update(view)
        else:
            self.display(view)

    def _compaction(self, event: CompactionEvent) -> None:
        if self.sidebar is not None:
            self.sidebar.on_event(event)
        if event.kind == "compaction_start":
            self._end_answer()
            self._barrier = BarrierLine(self._show_barrier, self.clock)
            self._barrier_handle = None
        if self._barrier is not None:
            self._barrier.on_event(event)
        if event.kind == "compaction_end":
            self._barrier = None

    def _show_barrier(self, text: str, final: bool) -> None:
        if not self.rich:
            if final:  # a terminal gets the result line, not a stream of percentages
                self.print_line(text)
            return
        if self._barrier_handle is None:
            self._barrier_handle = self.display(line_view(text), display_id=True)
        else:
            self._barrier_handle.update(line_view(text))

    def _show_notice(self, notice: Notice) -> None:
        text = f"{notice.level}: {notice.text}" if notice.level != "info" else notice.text
        self.show(text, notice.level)

    def show(self, text: str, level: str = "info") -> None:
        """One line for the user (rich: a small HTML block; plain: printed)."""
        if self.rich:
            self._end_answer()
            self.display(notice_view(text, level))
        else:
            self.print_line(text)

    def show_cell(self, source: str, kind: str) -> None:
        """A cell the agent proposed, shown whole: the user reads what goes into the notebook."""
        heading = f"Proposed {kind} cell (put below this one, not run):"
        if self.rich:
            self._end_answer()
            # Escaped text, never a Markdown fence around it: the source cannot close the
            # block or hide a line in a comment (SPEC §16).
            self.display(whole_block_view(heading, source, "soba-proposed-cell"))
        else:
            self.print_line(f"{heading}\n{source}")

    def show_edit(self, heading: str, diff: str) -> None:
        """A cell edit the agent proposed, as a diff shown whole, escaped like a proposed cell."""
        if self.rich:
            self._end_answer()
            self.display(whole_block_view(heading, diff, "soba-proposed-edit"))
        else:
            self.print_line(f"{heading}\n{diff}")

    def show_call(self, shown: str) -> None:
        """A call waiting for the user's approval: what it would run or change, whole."""
        shown = printable(shown, lines=True)
        if self.rich:
            self._end_answer()
            self.display(approval_view(shown))
        else:
            self.print_line(f"{APPROVAL_HEADING}\n{shown}")

    # -- end -------------------------------------------------------------------------

    def finish(self, result: TurnResult | None) -> None:
        """Render the answer whole and, unless the turn completed, its status line."""
        held, self._held_notice = self._held_notice, None
        self._clear_status()
        self._end_answer()
        if result is not None and held is not None and held.text == result.message:
            held = None
        if held is not None:
            self._show_notice(held)
        if result is not None and result.status != "completed":
            level = "error" if result.status == "failed" else "info"
            self.show(f"{result.status}: {result.message}" if result.message else result.status, level)
        elif result is not None and result.checkpoint_id:
            steps = f"{result.steps} step{'s' if result.steps != 1 else ''}"
            self.show(f"completed · {result.checkpoint_id} · {steps}", "muted")
