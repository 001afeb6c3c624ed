"""The sidebar's conversation (SPEC §18), kernel side: a turn as it happens, on the comm.

Every turn — typed in the sidebar's prompt box or run as `%soba` in a cell — is sent to the
open sidebars as `turn` messages on the `soba_nb.monitor` comm (`comm.publish`), so the panel
shows the same conversation whichever way the user talks to soba:

- ``{"type": "turn", "phase": "start", "turn": id, "prompt": str}`` — what the user asked, as
  typed (`/fix --cell 4`, not soba's expansion of it);
- ``{"type": "turn", "phase": "text", "turn": id, "text": str}`` — a piece of the answer
  (pieces are joined and sent at most `TEXT_UPDATES_PER_S` times a second);
- ``{"type": "turn", "phase": "tool", "turn": id, "call": id, "line": str, "status":
  "running" | "ok" | "error" | "declined", "preview": str, "images": [path]}`` — a call's receipt, once
  when it starts and once when it ends (the same words as the cell's receipt), with the
  images the call displayed (paths relative to the notebook's folder, in its session
  folder's `artifacts/`);
- ``{"type": "turn", "phase": "steer", "turn": id, "text": str}`` — the running turn took a
  message the user sent into it (`steer`): it goes to the model with the next request;
- ``{"type": "turn", "phase": "notice", "turn": id, "line": str, "level": str}`` — a one-line
  notice (a stop, a cut answer, a steer taken);
- ``{"type": "turn", "phase": "waiting", "turn": id, "line": str}`` — the model has not
  answered yet (`waiting for the model · 3 s`, `the model is reading 12,400 tokens · 45 s`);
- ``{"type": "turn", "phase": "approval", "turn": id, "text": str}`` — a call waits for the
  user's answer: what it would run, whole (the panel shows it as text, never as Markdown);
- ``{"type": "turn", "phase": "end", "turn": id, "status": str, "line": str}`` — the turn is
  over (`completed`, `cancelled`, `failed`, `step_limit`) and the line the cell printed.

Compaction lines reach the panel as `progress` / `result` messages, as before. Text is sent
with control characters escaped (`printable`), as the cell shows it. A view never breaks the
turn: sending is `comm.publish`, which never raises.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from soba_nb.agent.events import Notice, Steered, TextDelta, ToolFinished, ToolStarted, Waiting
from soba_nb.agent.receipts import receipt_status
from soba_nb.notebook.comm import publish
from soba_nb.notebook.render import RUNNING, receipt_text
from soba_nb.printable import printable

if TYPE_CHECKING:
    from soba_nb.agent.loop import TurnResult

TEXT_UPDATES_PER_S = 10
"""Answer pieces are joined and sent at most this often (a token per message would flood)."""
WAITING_UPDATES_PER_S = 1
PREVIEW_CHARS = 400
"""A finished call's first output, at most this long, under its receipt."""

Send = Callable[[dict[str, Any]], bool]


def both(first: Callable[[Any], None], second: Callable[[Any], None]) -> Callable[[Any], None]:
    """One event sink feeding two (the cell's renderer and the sidebar's conversation)."""

    def forward(event: Any) -> None:
        first(event)
        second(event)

    return forward


class ConversationFeed:
    """One turn's messages to the sidebar: `start`, then `on_event` for each agent event,
    `approval` for each question, `end`."""

    def __init__(
        self, prompt: str, *, send: Send = publish, clock: Callable[[], float] = time.monotonic
    ):
        self.turn = uuid.uuid4().hex[:12]
        self.prompt = prompt
        self.send = send
        self.clock = clock
        self._pending = ""
        self._sent_at = float("-inf")
        self._waited_at = float("-inf")

    def _message(self, phase: str, **fields: Any) -> None:
        self.send({"type": "turn", "phase": phase, "turn": self.turn, **fields})

    def start(self) -> None:
        self._message("start", prompt=printable(self.prompt, lines=True))

    def on_event(self, event: object) -> None:
        if isinstance(event, TextDelta):
            self._pending += event.text
            if self.clock() - self._sent_at >= 1 / TEXT_UPDATES_PER_S:
                self.flush()
            return
        if isinstance(event, Waiting):
            if self.clock() - self._waited_at >= 1 / WAITING_UPDATES_PER_S:
                self._waited_at = self.clock()
                self._message("waiting", line=f"{event.status} · {event.elapsed_s:.0f} s")
            return
        self.flush()
        if isinstance(event, ToolStarted):
            line = receipt_text(event.name, event.summary, RUNNING, None)
            self._message(
                "tool", call=event.call_id, line=printable(line), status=RUNNING, preview=""
            )
        elif isinstance(event, ToolFinished):
            status = receipt_status(event.is_error, event.declined)
            line = receipt_text(
                event.name, event.summary, status, None if event.declined else event.duration_ms
            )
            preview = printable(event.preview[:PREVIEW_CHARS], lines=True)
            images = list(event.images)
            self._message(
                "tool",
                call=event.call_id,
                line=printable(line),
                status=status,
                preview=preview,
                images=images,
            )
        elif isinstance(event, Steered):
            self._message("steer", text=printable(event.text, lines=True))
        elif isinstance(event, Notice):
            self._message("notice", line=printable(event.text, lines=True), level=event.level)

    def flush(self) -> None:
        """Send the answer's pieces not sent yet."""
        if self._pending:
            text, self._pending = self._pending, ""
            self._sent_at = self.clock()
            self._message("text", text=printable(text, lines=True))

    def approval(self, shown: str) -> None:
        self.flush()
        self._message("approval", text=printable(shown, lines=True))

    def end(self, result: TurnResult | None) -> None:
        self.flush()
        if result is None:
            self._message("end", status="failed", line="failed")
            return
        line = f"{result.status}: {result.message}" if result.message else result.status
        if result.status == "completed" and result.checkpoint_id:
            line = f"completed · {result.checkpoint_id}"
        self._message("end", status=result.status, line=printable(line, lines=True))
