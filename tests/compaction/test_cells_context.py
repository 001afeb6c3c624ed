"""Which cells fit `notebook.contextTokens` (`soba_nb.compaction.cells_context`): the block never
exceeds its budget, the oldest go first, and the newest error stays."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from soba_nb.compaction.cells_context import TRACEBACK_LINES, fit_cells, render_cells
from soba_nb.images import ImageRule, image_tokens
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import Artifact, CellRecord, CellsEntry

COUNTER = TokenCounter.for_model("openai", "gpt-4o")

PIECE = st.text(alphabet=st.sampled_from("ab c`\n\t\x1b\r{}é漢🙂"), max_size=120)
TEXT = st.one_of(PIECE, st.tuples(PIECE, st.integers(1, 60)).map(lambda p: p[0] * p[1]))
"""Short and long texts (up to ~7,000 characters) with fences, controls and wide characters."""
ERROR = st.builds(
    lambda message, frames: "KeyError: " + message + "\nTraceback (most recent call last):\n" + "\n".join(frames),
    TEXT,
    st.lists(st.text(max_size=80), max_size=120),
)
CELL = st.builds(
    lambda source, error, output, printed: CellRecord(
        source=source, outcome="error" if error else "ok", error=error, output=output, printed=printed or msgspec.UNSET
    ),
    TEXT,
    st.one_of(st.none(), ERROR),
    st.one_of(st.none(), TEXT),
    st.one_of(st.none(), TEXT),
)
BUDGET = st.one_of(st.integers(0, 64), st.integers(64, 3000), st.integers(3000, 100_000))
"""From nothing fits to everything fits."""


@settings(max_examples=200, deadline=None)
@given(st.lists(CELL, min_size=1, max_size=14), BUDGET)
def test_the_block_never_exceeds_its_budget_and_keeps_the_newest_error(cells, budget):
    records = [msgspec.structs.replace(cell, execution_count=index + 1) for index, cell in enumerate(cells)]
    entry = fit_cells(records, budget, COUNTER)
    if entry is None:
        return
    assert COUNTER.count_message("user", render_cells(entry)) <= budget
    assert entry.omitted + len(entry.cells) == len(records)
    counts = [cell.execution_count for cell in entry.cells]
    assert counts == sorted(counts) and len(set(counts)) == len(counts)  # in the order they ran
    newest_error = max((r.execution_count for r in records if r.outcome == "error"), default=None)
    others = [c for c in range(1, len(records) + 1) if c != newest_error]
    ordinary = [c for c in counts if c != newest_error]
    assert ordinary == others[len(others) - len(ordinary) :]  # the oldest went first
    if newest_error is not None:  # anything kept: the newest error is among it
        kept = next(cell for cell in entry.cells if cell.execution_count == newest_error)
        assert kept.outcome == "error" and (kept.error or "").startswith("KeyError")


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


def test_a_long_error_message_is_clipped_not_dropped():
    message = "ValueError: " + " ".join(f"column_{n}" for n in range(600))  # ~1,800 tokens
    record = CellRecord(execution_count=3, source="check(df)", outcome="error", error=message + "\nTraceback (most recent call last):\n  File \"In [3]\", line 1")
    for budget in (100, 300, 800):
        entry = fit_cells([record], budget, COUNTER)
        assert entry is not None, budget
        assert (entry.cells[0].error or "").startswith("ValueError: column_0")
        assert COUNTER.count_message("user", render_cells(entry)) <= budget


def test_a_fence_in_a_cell_does_not_end_its_block():
    source = 'print("````")\nnotes = """```python\nx\n```"""'
    rendered = render_cells(fit_cells([CellRecord(execution_count=4, source=source)], 1000, COUNTER))
    assert f"`````python\n{source}\n`````" in rendered


def test_printed_and_out_are_labelled_apart_and_images_named_outside_the_text_budget():
    """The block's budget is its text: the image line counts, the image itself does not (it
    counts in the session's budget, `entry_tokens`)."""
    pie = Artifact(path="analysis.soba/artifacts/" + "a" * 64 + ".png", mime="image/png", sha256="a" * 64, width=640, height=480)
    record = CellRecord(execution_count=11, source="df.plot.pie(y='sales')", output="<Axes: >", printed="fastest: West", images=[pie])
    text = "In [11]:\n```python\ndf.plot.pie(y='sales')\n```\nprinted:\nfastest: West\nOut[11]:\n<Axes: >\n[displayed image/png 640×480]"
    budget = COUNTER.count_message("user", render_cells(CellsEntry(cells=[record]))) + 30  # (+ the "left out" note's room)
    assert budget < 100 < image_tokens(ImageRule.TILES, 640, 480)
    entry = fit_cells([record], budget, COUNTER)
    assert entry is not None and entry.cells[0].images == [pie] and render_cells(entry).endswith(text)
    only_a_plot = CellRecord(execution_count=12, source="plt.show()", images=[pie])
    assert render_cells(CellsEntry(cells=[only_a_plot])).endswith("```\n[displayed image/png 640×480]")
