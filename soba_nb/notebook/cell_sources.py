"""The user's cells, whole, for the transcript (`cell_sources` entries): the notebook's code
that `/code` exports and `/rebuild` re-runs.

The model's view of the cells (`cells` entries) is clipped to a budget and, at a session's
first turn, holds only the last few; a script that runs on its own needs every cell as it was
typed. They are read from IPython's input history (`input_hist_raw`, indexed by execution
count, whole, kept for every cell run with `store_history`), and how each ended from the
cell recorder (`CellRecorder.outcomes`). A cell the recorder did not see — it ran before
`%load_ext soba_nb`, or it used soba's magics beside its code — is `unrecorded`.

Cells that are only soba's magics (`%soba …`, `%%soba` requests, `%load_ext soba_nb`) are the
conversation, not the notebook: left out. A cell that mixes them with code is kept whole (the
export leaves every magic line out of the script).

Each session keeps its own cursor (the last execution count it recorded in this kernel): its
first record in a kernel holds every cell the kernel ran, later ones the cells since.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgspec import UNSET

from soba_nb.agent.soba_magics import is_only_soba
from soba_nb.redact import redact
from soba_nb.transcript.entries import CellSource, CellSourcesEntry
from soba_nb.transcript.parts import SourceOutcome


def history_of(shell: Any) -> list[str]:
    """The shell's raw input history, indexed by execution count ([] when it keeps none)."""
    history = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None)
    return history if isinstance(history, list) else []


def sources_after(shell: Any, outcomes: Mapping[int, bool], after: int) -> list[CellSource]:
    """The cells the shell ran with an execution count above `after`, in order, redacted."""
    history = history_of(shell)
    found = []
    for count in range(max(after + 1, 1), len(history)):
        source = history[count]
        if not isinstance(source, str) or not source.strip() or is_only_soba(source):
            continue
        ran = outcomes.get(count)
        outcome: SourceOutcome = "unrecorded" if ran is None else "ok" if ran else "error"
        found.append(CellSource(execution_count=count, source=redact(source), outcome=outcome))
    return found


class SourceCursor:
    """Per session, the last execution count recorded in this kernel."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._written: set[str] = set()
        """Sessions that have a record from this kernel (the first one says `newKernel`)."""

    def entry(self, session_id: str, shell: Any, outcomes: Mapping[int, bool]) -> CellSourcesEntry | None:
        """The `cell_sources` entry of the cells `session_id` has not recorded yet, or None;
        the cursor moves past the shell's whole history (the running cell included)."""
        after = self._last.get(session_id, 0)
        cells = sources_after(shell, outcomes, after)
        self._last[session_id] = max(after, len(history_of(shell)) - 1)
        if not cells:
            return None
        first = session_id not in self._written
        self._written.add(session_id)
        return CellSourcesEntry(cells=cells, new_kernel=True if first else UNSET)
