"""The user's cells, whole, for the transcript (`cell_sources` entries): the notebook's code
that `/code` exports and `/rebuild` re-runs.

The model's view of the cells (`cells` entries) is clipped to a budget and, at a session's
first turn, holds only the last few; a script that runs on its own needs every cell as it was
typed. The cell recorder keeps each one's source and how it ended by execution count
(`CellRecorder.sources`, `.outcomes`); the cells that ran before it started — before `%load_ext
soba_nb` — are read from IPython's input history (`input_hist_raw`) and are `unrecorded`: how
they ended was not seen.

Cells that are only soba's magics (`%soba …`, `%%soba` requests, `%load_ext soba_nb`) are the
conversation, not the notebook: left out, and so is `exit` / `quit()`. A cell that mixes them with code is kept whole (the
export leaves every magic line out of the script).

Each session keeps its own cursor (the last execution count it recorded in this kernel): its
first record in a kernel holds every cell the kernel ran, later ones the cells since.
"""

from __future__ import annotations

import re
from typing import Any

from msgspec import UNSET

from soba_nb.agent.soba_magics import is_only_soba
from soba_nb.notebook.cells import CellRecorder
from soba_nb.redact import redact
from soba_nb.transcript.entries import CellSource, CellSourcesEntry
from soba_nb.transcript.parts import SourceOutcome

_EXIT = re.compile(r"\A\s*(exit|quit)(\s*\(.*\))?\s*\Z", re.DOTALL)
"""A cell that ends the kernel (IPython keeps no history of it either): not the notebook's code."""


def history_of(shell: Any) -> list[str]:
    """The shell's raw input history, indexed by execution count ([] when it keeps none)."""
    history = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None)
    return history if isinstance(history, list) else []


def sources_after(shell: Any, recorder: CellRecorder, after: int) -> tuple[list[CellSource], int]:
    """The cells the shell ran with an execution count above `after`, in order, redacted, and
    the highest count whose source was known (a cell still running has none yet: it is taken
    the next time). Sources come from the recorder; those of cells that ran before it started
    from IPython's history."""
    history = history_of(shell)
    first = recorder.first_count if recorder.first_count is not None else 0
    top = max(len(history) - 1, max(recorder.sources, default=0))
    found = []
    last = after
    for count in range(max(after + 1, 1), top + 1):
        source = recorder.sources.get(count)
        if source is None and count <= first and count < len(history):
            source = history[count]
        if not isinstance(source, str):
            continue
        last = count
        if not source.strip() or is_only_soba(source) or _EXIT.match(source):
            continue
        ran = recorder.outcomes.get(count)
        outcome: SourceOutcome = "unrecorded" if ran is None else "ok" if ran else "error"
        found.append(CellSource(execution_count=count, source=redact(source), outcome=outcome))
    return found, last


class SourceCursor:
    """Per session, the last execution count recorded in this kernel."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._written: set[str] = set()
        """Sessions that have a record from this kernel (the first one says `newKernel`)."""

    def entry(self, session_id: str, shell: Any, recorder: CellRecorder) -> CellSourcesEntry | None:
        """The `cell_sources` entry of the cells `session_id` has not recorded yet, or None."""
        cells, self._last[session_id] = sources_after(shell, recorder, self._last.get(session_id, 0))
        if not cells:
            return None
        first = session_id not in self._written
        self._written.add(session_id)
        return CellSourcesEntry(cells=cells, new_kernel=True if first else UNSET)
