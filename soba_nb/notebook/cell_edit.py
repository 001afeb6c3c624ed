"""A cell edit the agent proposes reaches the user (SPEC §18, `edit_cell`).

The proposal is sent at once as an ``edit_cell`` message over the labextension's comm
(`soba_nb.notebook.comm`; kernel → frontend messages flow while the cell runs): JupyterLab
shows the change as a diff on that cell, with accept and reject, and the decision comes back
as an entry (`soba_nb.agent.cell_edits`). The message names the cell by its execution count
and by the id the frontend gave it when it ran (`RecordedCell.cell_id`), and the tool call by
its id, which the decision names.

Where no comm took it (VS Code, nbclient, a terminal, the cell that loaded soba), nothing can
show a diff on the cell: the running cell's output shows the change as a diff — escaped text
in a block, never Markdown around code (`render.whole_block_view`) — and the new source is
put below as a new cell when the turn ends (`set_next_input`, as `add_cell` does), not run.
Nothing here raises: a proposal is the agent's receipt first.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass

from soba_nb.notebook.comm import EDIT_CELL, publish
from soba_nb.transcript.entries import MessageEntry, ToolCallEntry, ToolResultEntry
from soba_nb.transcript.store import Transcript

DIFF_CONTEXT_LINES = 3
TOOL = "edit_cell"
ON_THE_CELL = (
    "shown on that cell as a diff; the user accepts or rejects it and their decision comes to you "
    "as a message (until then the cell keeps its source)"
)
"""How a proposal the labextension took reaches the user (the tool's result says it)."""
IN_THE_OUTPUT = (
    "there is no editor here, so it is shown as a diff in this cell's output and put below as a new cell "
    "when the turn ends, not run; the cell keeps its source and no decision comes back"
)
"""How a proposal no comm took reaches the user."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProposedEdit:
    """A new source the agent proposed for the recorded cell In [execution_count]."""

    execution_count: int
    old: str
    """The cell's source as it ran (as recorded)."""
    new: str
    call: str | None = None
    """The id of the `edit_cell` call (None outside a turn's transcript)."""
    cell_id: str | None = None
    """The notebook cell's id, when the frontend that ran it sent one."""

    def message(self, turn: str) -> dict[str, object]:
        """The ``edit_cell`` comm message (`soba_nb.notebook.comm` documents its fields)."""
        return {
            "type": EDIT_CELL,
            "call": self.call,
            "executionCount": self.execution_count,
            "cellId": self.cell_id,
            "old": self.old,
            "new": self.new,
            "turn": turn,
        }

    def heading(self) -> str:
        return f"Proposed edit of In [{self.execution_count}] (the new source is put below as a cell, not run):"

    def diff(self) -> str:
        """The change as a unified diff (`--- In [4]` / `+++ In [4] proposed`)."""
        name = f"In [{self.execution_count}]"
        lines = difflib.unified_diff(
            self.old.splitlines(), self.new.splitlines(), name, f"{name} proposed", lineterm="", n=DIFF_CONTEXT_LINES
        )
        return "\n".join(lines) or "(no change)"


def announce_edit(edit: ProposedEdit, turn: str) -> bool:
    """Send `edit` to the labextension; True when a frontend's comm took it (never raises)."""
    try:
        return publish(edit.message(turn))
    except Exception:  # the proposal is in the output and the transcript all the same
        logger.debug("soba_nb: edit_cell message not sent", exc_info=True)
        return False


def running_call(transcript: Transcript, tool: str = TOOL) -> str | None:
    """The id of the `tool` call being run now: the first call of the latest answer that has
    no result yet (the turn loop records an answer's calls, then each result after its call
    ran). None when there is none."""
    results: set[str] = set()
    calls: list[str] = []
    current = transcript.leaf
    while current is not None:
        entry = transcript.get(current)
        if entry is None or (isinstance(entry, MessageEntry) and entry.role == "assistant"):
            break
        if isinstance(entry, ToolResultEntry):
            results.add(entry.call_id)
        elif isinstance(entry, ToolCallEntry) and entry.name == tool:
            calls.append(entry.call_id)
        current = entry.parent_id
    return next((call for call in reversed(calls) if call not in results), None)
