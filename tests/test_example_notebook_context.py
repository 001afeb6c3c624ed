"""`examples/04_notebook_context.ipynb` in a real kernel under nbclient (issue 24): a cell that
fails, `%soba /fix` proposing the corrected cell, a plot the agent draws under the kernel's
inline backend that the model is sent, and the session's code exported with `%soba /code`.
The model is the loopback server, scripted (see tests/test_examples.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import write_soba_json
from llm_server import RecordedRequest, Reply, text, tool_calls
from test_examples import (  # noqa: F401  (kernel_env and model are fixtures)
    LIMITS,
    cell_starting,
    cell_text,
    code_cells,
    copy_example,
    kernel_env,
    model,
    python_call,
    run_notebook,
    session_transcript,
    user_messages,
)

from soba_nb.transcript.entries import CellsEntry, ToolResultEntry

FIXED = 'sales["amount"].sum()'
PLOT = """
ax = sales.plot(x="month", y="amount", figsize=(6, 3), legend=False, title="Monthly sales")
ax.set_ylabel("amount")
"""


def answer_about_the_plot(request: RecordedRequest) -> Reply:
    """The model's answer names what it was sent: one image, or none."""
    return text(f"I was sent {len(request.images())} image(s). 2026-09 stands out at 310.")


def test_notebook_context_example(tmp_path, model, kernel_env):  # noqa: F811  (the fixtures)
    notebook_path = copy_example("04_notebook_context.ipynb", tmp_path)
    folder = notebook_path.parent
    write_soba_json(folder, model.server.url, LIMITS)  # gpt-4o: a model that takes images
    model.script(
        python_call("sales.columns.tolist()"),
        tool_calls(("add_cell", {"source": FIXED})),
        text("The column is `amount`; there is no `revenue` column."),
        python_call(PLOT),
        answer_about_the_plot,
    )

    notebook = run_notebook(notebook_path, kernel_env)

    cells = code_cells(notebook)
    assert all(cell.get("execution_count") is not None for cell in cells)
    failing = cell_starting(notebook, 'sales["revenue"]')
    assert [o.ename for o in failing.outputs if o.output_type == "error"] == ["KeyError"]
    assert not [o for cell in cells if cell is not failing for o in cell.outputs if o.output_type == "error"]

    # /fix: the failed cell's source and traceback reach the model once (in the cells block
    # ahead of the request, which names the cell); the fix is proposed.
    fix_request = model.requests("inference")[0]
    request_text = user_messages(fix_request)[-1]
    count = failing.execution_count
    assert f"Fix the notebook cell In [{count}] above" in request_text
    sent = "\n".join(user_messages(fix_request))
    assert sent.count('sales["revenue"].sum()') == 1 and sent.count("KeyError: 'revenue'") == 1
    fix = cell_text(cell_starting(notebook, "%soba /fix"))
    assert "Proposed code cell" in fix and FIXED in fix
    assert "no `revenue` column" in fix

    # The plot: shown in the cell, kept, sent to the model, and the model's answer says so.
    plot_cell = cell_starting(notebook, "%%soba")
    assert any("image/png" in o.get("data", {}) for o in plot_cell.outputs if o.output_type == "display_data")
    assert "I was sent 1 image(s)" in cell_text(plot_cell)
    transcript = session_transcript(folder, "04_notebook_context")
    with_images = [e for e in transcript.entries if isinstance(e, ToolResultEntry) and e.artifacts]
    [plotted] = with_images
    assert (folder / plotted.artifacts[0].path).read_bytes()[:4] == b"\x89PNG"
    assert any(isinstance(e, CellsEntry) for e in transcript.entries)

    # /code: the user's cell that built `sales` (not the one that raised) and the agent's
    # successful python calls, in order, as a script that runs on its own (issue 44).
    exported = cell_text(cell_starting(notebook, "%soba /code"))
    assert re.search(r"wrote the code of 1 cell of yours and 2 python calls to .*session_code\.py", exported), exported
    script = (folder / "session_code.py").read_text()
    assert script.count("# %%") == 3 and "sales.columns.tolist()" in script and 'title="Monthly sales"' in script
    assert 'sales["revenue"]' not in script and "cells that raised: In [" in " ".join(line.lstrip("# ") for line in script.split("# %%")[0].splitlines())
    assert cell_text(cells[-1]).startswith("# soba session")
    ran = subprocess.run([sys.executable, "session_code.py"], cwd=folder, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "MPLBACKEND": "Agg"})
    assert ran.returncode == 0, ran.stderr
