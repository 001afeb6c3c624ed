"""The README's "A tour in ten lines" as `examples/05_readme_tour.ipynb`, run as a new user
runs it (issue 44, "Done when"): top to bottom in a real kernel under nbclient, and with the
real `jupyter nbconvert --to notebook --execute` command; after each run the exported
`session_code.py` runs with `python` in a fresh interpreter.

The model is the loopback server, scripted as in tests/test_examples.py: `/fix` checks the
right column with `python` and proposes the corrected cell with `edit_cell`; the plot request
builds the monthly table from the user's `sales` and plots it, and the answer names the month
that stands out from the table it was sent. Each run (one kernel) is a module-scoped fixture
that two tests read: what the saved notebook and the transcript show, and the export.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_KEY_ENV, TEST_KEY_VALUE, write_soba_json
from llm_server import LLMServer, RecordedRequest, Reply, text, tool_calls
from test_examples import (
    HARD_LIMIT_SHOWN,
    LIMITS,
    NotebookModel,
    assert_verified,
    cell_starting,
    cell_text,
    code_cells,
    copy_example,
    last_tool_output,
    python_call,
    run_notebook,
    session_transcript,
    summary_text,
    user_messages,
)

from soba_nb.transcript.entries import CapsuleEntry, CheckpointEntry, ToolCallEntry, ToolResultEntry

nbformat = pytest.importorskip("nbformat")
pd = pytest.importorskip("pandas")

NOTEBOOK = "05_readme_tour.ipynb"
STEM = "05_readme_tour"
CELL_TIMEOUT_S = 120
SCRIPT_TIMEOUT_S = 60
FIXED = 'sales["amount"].sum()'
PLOT = """
import matplotlib.pyplot as plt

monthly = sales.groupby(sales["date"].dt.to_period("M"))["amount"].sum()
print(monthly.to_string())
ax = monthly.plot(kind="bar", figsize=(7, 3), title="Monthly amounts", legend=False)
ax.set_ylabel("amount")
plt.show()
"""
TOUR_SUMMARY = summary_text(
    {
        "Goal and constraints": "Total and monthly amounts of the sales in `sales` (sales.csv).",
        "Work done": "- fixed the total: the column is `amount`, not `revenue`\n- plotted the monthly amounts",
        "Decisions": "- amounts summed per calendar month of `date`, no cleaning needed",
        "Files read": "- sales.csv",
        "Kernel state": "- sales: DataFrame (60 rows: date, region, amount)\n- monthly: Series",
    }
)
FAILED_REQUEST = re.compile(r"Fix the notebook cell In \[(\d+)\] above")


def propose_the_fix(request: RecordedRequest) -> Reply:
    """`edit_cell` on the cell the request names (its execution count, read from the request)."""
    named = FAILED_REQUEST.search(user_messages(request)[-1])
    assert named, user_messages(request)[-1]
    return tool_calls(("edit_cell", {"execution_count": int(named.group(1)), "source": FIXED}))


def name_the_month(request: RecordedRequest) -> Reply:
    """The answer names the largest month of the table the model was sent, with its amount."""
    rows = re.findall(r"^(\d{4}-\d{2})\s+(\d+)$", last_tool_output(request), re.MULTILINE)
    assert rows, last_tool_output(request)
    month, amount = max(rows, key=lambda row: int(row[1]))
    return text(f"{month} stands out at {amount}, well above the other months (a promotion?).", chunks=3)


def script_the_tour(model: NotebookModel) -> None:
    model.summary = TOUR_SUMMARY
    model.script(
        python_call(FIXED),
        propose_the_fix,
        text("The frame has no `revenue` column: the amounts are in `amount`."),
        python_call(PLOT),
        name_the_month,
    )


def read_sales(csv: bytes) -> Any:
    return pd.read_csv(io.BytesIO(csv), parse_dates=["date"])


def expected_monthly(csv: bytes) -> Any:
    """The monthly table, computed here from the file the notebook wrote."""
    sales = read_sales(csv)
    return sales.groupby(sales["date"].dt.to_period("M"))["amount"].sum()


# -- the two runs -----------------------------------------------------------------------------


@dataclass
class TourRun:
    runner: str
    folder: Path
    notebook: Any
    """As saved by the runner."""
    model: NotebookModel
    sales_csv: bytes
    """sales.csv as the notebook wrote it (the script is run without it)."""
    script: subprocess.CompletedProcess[str]
    """`python session_code.py` in the notebook's folder."""


def run_with_nbconvert(path: Path) -> Any:
    """`jupyter nbconvert --to notebook --execute` as a user types it; what it saved."""
    jupyter = shutil.which("jupyter", path=str(Path(sys.executable).parent)) or shutil.which("jupyter")
    assert jupyter, "jupyter is not installed"
    done = subprocess.run(
        [jupyter, "nbconvert", "--to", "notebook", "--execute", f"--ExecutePreprocessor.timeout={CELL_TIMEOUT_S}", path.name],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=CELL_TIMEOUT_S * 3,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    saved = path.with_suffix(".nbconvert.ipynb")
    notebook = nbformat.read(saved, as_version=4)
    nbformat.validate(notebook)
    return notebook


def run_exported_script(folder: Path) -> subprocess.CompletedProcess[str]:
    """The exported code in a fresh interpreter, in the notebook's folder, without the CSV
    the notebook wrote (the script must make what it needs)."""
    (folder / "sales.csv").unlink()
    env = {**os.environ, "MPLBACKEND": "Agg"}
    return subprocess.run(
        [sys.executable, "session_code.py"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )


@pytest.fixture(scope="module", params=["nbclient", "nbconvert"])
def tour(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> TourRun:
    """The notebook run once by `request.param`, in a folder of its own, then its export (the
    server stopped and the environment restored before the tests read them)."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    with pytest.MonkeyPatch.context() as env, LLMServer() as server:
        for var in list(os.environ):  # as test_examples' kernel_env: no user config
            if var.startswith("SOBA_") or var == "JPY_SESSION_NAME":
                env.delenv(var)
        (tmp_path / "home").mkdir()
        env.setenv("HOME", str(tmp_path / "home"))
        env.setenv(TEST_KEY_ENV, TEST_KEY_VALUE)
        model = NotebookModel(server, TOUR_SUMMARY)
        script_the_tour(model)
        path = copy_example(NOTEBOOK, tmp_path)
        write_soba_json(path.parent, server.url, LIMITS)
        if request.param == "nbclient":
            notebook = run_notebook(path, env, timeout=CELL_TIMEOUT_S)
        else:
            env.setenv("JPY_SESSION_NAME", str(path))  # docs/transcript.md: how the kernel learns its notebook
            notebook = run_with_nbconvert(path)
        sales_csv = (path.parent / "sales.csv").read_bytes()
        script = run_exported_script(path.parent)
    return TourRun(request.param, path.parent, notebook, model, sales_csv, script)


# -- what a user sees -------------------------------------------------------------------------


def test_the_tour_shows_each_step(tour: TourRun) -> None:
    notebook, folder, model = tour.notebook, tour.folder, tour.model
    cells = code_cells(notebook)
    assert all(cell.get("execution_count") is not None for cell in cells)
    failing = cell_starting(notebook, 'sales["revenue"]')
    for cell in cells:  # only the deliberate KeyError; no soba failure anywhere
        errors = [f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"]
        assert errors == (["KeyError: 'revenue'"] if cell is failing else []), cell.source
        if cell is not failing:
            shown = cell_text(cell)
            for marker in ("failed:", "error:", "Traceback", "UsageError", "not told its notebook"):
                assert marker not in shown, f"{cell.source!r} shows {marker!r}:\n{shown}"
    assert "sales.csv: 60 rows, columns ['date', 'region', 'amount']" in cell_text(cell_starting(notebook, "import pandas"))
    monthly = expected_monthly(tour.sales_csv)
    transcript = session_transcript(folder, STEM)  # next to the notebook, under nbconvert too
    assert not (folder / "untitled.soba").exists()
    inference = model.requests("inference")

    # /fix: the request names the failed cell, its traceback is sent once, the edit is proposed.
    count = failing.execution_count
    assert f"Fix the notebook cell In [{count}] above" in user_messages(inference[0])[-1]
    sent = "\n".join(user_messages(inference[0]))
    assert sent.count('sales["revenue"].sum()') == 1 and sent.count("KeyError: 'revenue'") == 1
    fix = cell_text(cell_starting(notebook, "%soba /fix"))
    assert f"[edit_cell In [{count}]: {FIXED} · ok" in fix
    assert f"Proposed edit of In [{count}]" in fix and f"-sales[\"revenue\"].sum()\n+{FIXED}" in fix
    assert f"result: np.int64({read_sales(tour.sales_csv)['amount'].sum()})" in fix  # the check ran on the user's `sales`
    assert "the amounts are in `amount`" in fix

    # The bookmark prints nothing (IPython's %%capture keeps its line for the rewind).
    assert cell_starting(notebook, "%%capture bookmark").outputs == []

    # The plot: drawn from the user's `sales`, shown, sent, and the month that stands out named.
    plot_cell = cell_starting(notebook, '%soba "plot the monthly amounts')
    assert any("image/png" in o.get("data", {}) for o in plot_cell.outputs if o.output_type == "display_data")
    plotted = inference[-1]
    assert len(inference) == 5 and user_messages(inference[3])[-1] == "plot the monthly amounts and tell me which month stands out"
    assert monthly.to_string() in last_tool_output(plotted) and len(plotted.images()) == 1
    top = monthly.idxmax()
    assert f"{top} stands out at {monthly[top]}," in cell_text(plot_cell)
    assert str(top) == "2026-09"
    (kept,) = [e for e in transcript.entries if isinstance(e, ToolResultEntry) and e.artifacts]
    assert (folder / kept.artifacts[0].path).read_bytes()[:4] == b"\x89PNG"

    # The budget, then the explicit compaction with its focus.
    budget = cell_text(cell_starting(notebook, "%budget"))
    assert budget.startswith("Budget: ") and HARD_LIMIT_SHOWN in budget and "Last compaction: none on this path" in budget
    compacted = cell_text(cell_starting(notebook, "%compact"))
    line = re.search(r"Compacted \(user\) · ([\d,]+) → ([\d,]+) tokens · reclaimed \d+% · (ck_[0-9a-f]{8})", compacted)
    assert line, compacted
    assert int(line.group(2).replace(",", "")) < int(line.group(1).replace(",", ""))
    assert "focus on the cleaning decisions" in json.dumps(model.requests("compaction")[0].body)

    # The capsule: the file, with the one checkpoint id the cell names and the session holds.
    created = cell_text(cell_starting(notebook, "%capsule create"))
    named = re.search(r"capsule 'Sales cleaning handoff' written to sales-cleaning-handoff\.capsule\.md .*· (ck_[0-9a-f]{8})", created)
    assert named, created
    handoff = (folder / "sales-cleaning-handoff.capsule.md").read_text(encoding="utf-8")
    assert 'title: "Sales cleaning handoff"' in handoff and f'checkpoint: "{named.group(1)}"' in handoff
    capsule_ids = {e.checkpoint_id for e in transcript.entries if isinstance(e, CapsuleEntry)}
    assert line.group(3) in capsule_ids
    assert named.group(1) in {e.checkpoint_id for e in transcript.entries if isinstance(e, CheckpointEntry | CapsuleEntry)}

    # The code, written.
    exported = cell_text(cell_starting(notebook, "%soba /code"))
    assert re.fullmatch(r"wrote the code of .+ to session_code\.py\s*", exported), exported
    assert (folder / "session_code.py").is_file()

    # The rewind: to the bookmark the session really has, the plot's turn left on a branch.
    (bookmark,) = [e for e in transcript.entries if isinstance(e, CheckpointEntry) and e.note == "before the plot"]
    ck = bookmark.checkpoint_id
    rewound = cell_text(cell_starting(notebook, "%rewind"))
    assert rewound.startswith(f"rewound to {ck} (entry {bookmark.id}); the next turn continues from there"), rewound
    assert f"no file to restore: the agent changed none after {ck}" in rewound
    path = transcript.path_view()
    calls = [e for e in path if isinstance(e, ToolCallEntry)]
    assert [c.name for c in calls] == ["python", "edit_cell"]  # the /fix turn's; the plot's is on the branch left
    assert path[-1].id == bookmark.id
    assert_verified(transcript)


def test_the_exported_code_runs_with_python(tour: TourRun) -> None:
    """`python session_code.py` in a fresh interpreter, without sales.csv: it writes the file
    the user's cell wrote (byte for byte) and prints the monthly table the agent built from it."""
    done = tour.script
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tour.folder / "sales.csv").read_bytes() == tour.sales_csv
    assert "sales.csv: 60 rows, columns ['date', 'region', 'amount']" in done.stdout
    assert expected_monthly(tour.sales_csv).to_string() in done.stdout
