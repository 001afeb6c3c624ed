"""A cell the agent proposes goes into the notebook while the turn runs (SPEC §10, `add_cell`).

`set_next_input` (what `SessionHolder.place_proposed` sends when the turn ends) carries one
cell, and only as code: a turn that proposes a fix and a note explaining it would lose the
first. So each proposal is also sent at once, as an ``add_cell`` message over the
labextension's comm (`soba_nb.notebook.comm`; kernel → frontend messages flow on iopub while
the cell still runs), and the labextension inserts it below the running cell, in order,
with its kind. Where no labextension listens (VS Code, nbclient, a terminal) nothing is
sent, and `set_next_input` and the cell output work as before.

The message names the running cell by the ``cellId`` JupyterLab and Notebook 7 put in the
execute_request's metadata, and by its execution count (the labextension inserts a
proposal that arrives late only below the run it belongs to). `announce` never raises: a
proposal is the agent's receipt first, and a view that fails must not fail the tool call.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from soba_nb.agent.tools.base import CellKind
from soba_nb.notebook.comm import ADD_CELL, publish

TURN_ID_CHARS = 12
"""Hex characters of a turn's id: unique enough among one kernel's turns."""

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_turn: str | None = None
"""The id of the turn whose cells are being proposed (a new one at each turn's first)."""


def new_turn_id() -> str:
    """A fresh id for a turn's proposals (`add_cell` and `edit_cell` messages name it)."""
    return uuid.uuid4().hex[:TURN_ID_CHARS]


def announce(shell: Any, source: str, kind: CellKind, index: int, turn: str | None = None) -> bool:
    """Send the `index`-th cell proposed in this turn to the labextension (`turn`: the turn's id;
    without it, index 0 starts a new turn); True when a frontend's comm took it, False
    otherwise (nothing raised)."""
    global _turn
    try:
        with _lock:
            if turn is not None:
                _turn = turn
            elif index == 0 or _turn is None:
                _turn = new_turn_id()
            turn = _turn
        message = {
            "type": ADD_CELL,
            "source": source,
            "kind": kind,
            "cellId": running_cell_id(shell),
            "executionCount": _execution_count(shell),
            "turn": turn,
            "index": index,
        }
        return publish(message)
    except Exception:  # the cell is in the output and the transcript all the same
        logger.debug("soba_nb: add_cell message not sent", exc_info=True)
        return False


def running_cell_id(shell: Any) -> str | None:
    """The id of the notebook cell being run, from the execute_request's metadata (JupyterLab
    and Notebook 7 send `cellId`); None outside a kernel or from another frontend."""
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return None
    try:
        parent = kernel.get_parent()
    except Exception:  # an ipykernel without get_parent (before 6)
        return None
    metadata = parent.get("metadata") if isinstance(parent, dict) else None
    cell_id = metadata.get("cellId") if isinstance(metadata, dict) else None
    return cell_id if isinstance(cell_id, str) and cell_id else None


def _execution_count(shell: Any) -> int | None:
    """The running cell's `In [n]`. IPython 8 counts `execution_count` up when the cell has
    finished, IPython 9 before it runs; the display hook's `prompt_count` is the running
    cell's number in both (what its `Out[n]` would show)."""
    count = getattr(getattr(shell, "displayhook", None), "prompt_count", None)
    if not isinstance(count, int):
        count = getattr(shell, "execution_count", None)
    return count if isinstance(count, int) else None
