"""Which cells fit `notebook.contextTokens` (`soba_nb.compaction.cells_context`): the block never
exceeds its budget, the oldest go first, and the newest error stays."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from soba_nb.compaction.cells_context import TRACEBACK_LINES, fit_cells, render_cells
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import CellRecord

COUNTER = TokenCounter.for_model("openai", "gpt-4o")

CELL = st.builds(
    lambda count, source, error, output: CellRecord(
        execution_count=count, source=source, outcome="error" if error else "ok", error=error, output=output
    ),
    st.integers(1, 500),
    st.text(min_size=0, max_size=3000),
    st.one_of(st.none(), st.text(min_size=1, max_size=8000).map(lambda t: "KeyError: 'x'\n" + t)),
    st.one_of(st.none(), st.text(max_size=5000)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(CELL, min_size=1, max_size=12), st.integers(0, 3000))
def test_the_block_never_exceeds_its_budget_and_keeps_the_newest_error(cells, budget):
    records = [msgspec.structs.replace(cell, execution_count=index + 1) for index, cell in enumerate(cells)]
    entry = fit_cells(records, budget, COUNTER)
    if entry is None:
        return
    assert COUNTER.count_message("user", render_cells(entry)) <= budget
    assert entry.omitted + len(entry.cells) == len(records)
    counts = [cell.execution_count for cell in entry.cells]
    assert counts == sorted(counts)  # newest last, as run
    newest_error = max((r.execution_count for r in records if r.outcome == "error"), default=None)
    others = [c for c in range(1, len(records) + 1) if c != newest_error]
    ordinary = [c for c in counts if c != newest_error]
    assert ordinary == others[len(others) - len(ordinary) :]  # the oldest went first
    errors = [i for i, r in enumerate(records) if r.outcome == "error"]
    if errors:
        newest = records[errors[-1]]
        assert any(cell.execution_count == newest.execution_count and cell.outcome == "error" for cell in entry.cells)


def test_the_oldest_cells_go_first():
    records = [CellRecord(execution_count=n, source=f"step_{n} = {n}\n" * 40) for n in range(1, 21)]
    entry = fit_cells(records, 900, COUNTER)
    assert entry is not None and 0 < entry.omitted < 20
    assert [c.execution_count for c in entry.cells] == list(range(entry.omitted + 1, 21))


def test_a_long_traceback_keeps_its_last_lines():
    frames = "\n".join(f'  File "lib.py", line {n}, in f{n}' for n in range(200))
    record = CellRecord(execution_count=7, source="f()", outcome="error", error=f"ValueError: bad\nTraceback (most recent call last):\n{frames}")
    entry = fit_cells([record], 5000, COUNTER)
    assert entry is not None
    error = entry.cells[0].error or ""
    assert error.startswith("ValueError: bad") and "in f199" in error and "in f10," not in error
    assert len(error.splitlines()) <= TRACEBACK_LINES + 2


def test_zero_turns_it_off():
    assert fit_cells([CellRecord(execution_count=1, source="x = 1")], 0, COUNTER) is None
