"""SPEC §10: the cells the agent proposes (`add_cell`) land in the notebook below the running
cell, in order, once each, not run — in a real JupyterLab 4 and a real Notebook 7.

A notebook runs `%load_ext soba_nb` and `%soba …` in a real kernel against the loopback LLM
server, scripted to call `add_cell` twice (a code cell, then a Markdown cell). Debian's
chromium, driven by Playwright, runs all cells and reads the page; the notebook is then saved
and read from disk:

- while the `%soba` cell still runs (its answer streams for seconds), both proposals are
  already below it: the labextension inserted them from the kernel's comm messages;
- once the run is over: the `%soba` cell, the code cell, the Markdown cell (rendered), then
  the cell that was below it all along — no copy of the last proposal, although the kernel
  also sent it as `set_next_input` and the frontend did insert that copy (the notebook's
  recorded cell changes show it added, then removed); the proposed code cell has no
  execution count and no output, although "Run All Cells" ran the notebook;
- the same when one cell both loads soba and runs the turn: the frontend had no comm open
  then, the kernel sends the proposals when the comm opens after the cell, and they go below
  the cell, above the `set_next_input` copy, which is removed.

Each frontend gets one server for this module (temporary root, random token, its own
Jupyter folders); every server, kernel and browser is stopped. Skipped, with the reason,
without /usr/bin/chromium, Playwright, the built labextension or Notebook 7. A screenshot of
each frontend goes into the test's temporary folder.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_KEY_ENV, TEST_KEY_VALUE, ScriptedModel, write_soba_json
from jupyter_support import (
    EXPOSE_APP,
    LABEXTENSION_BUILD,
    NOT_RUN_PROMPT,
    NOTEBOOK_EXPOSE_APP,
    SOBA_LABEXTENSION,
    UI_TIMEOUT_MS,
    JupyterServer,
    browser_page,
    cell,
    installed_data_dirs,
    isolated_env,
    jupyter_server,
    require_browser,
    run_all_cells,
    wait_for_kernel_idle,
    write_code_notebook,
)
from llm_server import LLMServer, text, tool_calls

VIEWPORT: Any = {"width": 1280, "height": 800}
LAYER: dict[str, Any] = {"model": {"contextWindow": 32_000, "maxOutputTokens": 1_000}}
"""A window the short turns never come near: no compaction in these tests."""

FIX = "revenue = sales['amount'].sum()\nrevenue"
NOTE = "## Revenue\n\nThe column is `amount`, not `revenue`."
NOTE_AS_NEXT_INPUT = f"%%markdown\n{NOTE}"
"""The kernel's `set_next_input` text for the Markdown proposal (a `%%markdown` code cell)."""
REQUEST = "%soba fix the revenue cell"
AFTER = "print('after')"
ANSWER = "The corrected cell and a note on the column are below. " * 4
ANSWER_CHUNKS, ANSWER_CHUNK_DELAY_S = 8, 0.5
"""The answer streams for ~4 s after the proposals: long enough to see them while it runs."""
RUNNING_PROMPT = re.compile(r"^\[\*\]:$")

LIVE_NOTEBOOK = "live.ipynb"
LIVE_CELLS = ("%load_ext soba_nb", REQUEST, AFTER)
ONE_CELL_NOTEBOOK = "one_cell.ipynb"
ONE_CELL = f"%load_ext soba_nb\n{REQUEST}"
ONE_CELL_CELLS = (ONE_CELL, AFTER)


@dataclass(frozen=True)
class Frontend:
    module: str
    page: str
    """The notebook's URL path: `{file}` is the notebook, `{stem}` its name without suffix (a
    JupyterLab workspace of its own, so no other notebook is reopened beside it)."""
    expose_app: str


FRONTENDS = {
    "jupyterlab": Frontend("jupyterlab", "/lab/workspaces/{stem}/tree/{file}", EXPOSE_APP),
    "notebook7": Frontend("notebook", "/notebooks/{file}", NOTEBOOK_EXPOSE_APP),
}


@dataclass(frozen=True)
class Served:
    name: str
    frontend: Frontend
    server: JupyterServer
    model: ScriptedModel


@pytest.fixture(scope="module", params=list(FRONTENDS))
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One server of the frontend for the module, its root holding the notebooks and a
    `soba.json` for a loopback LLM server; both always stopped."""
    require_browser()
    if not installed_data_dirs(SOBA_LABEXTENSION):
        pytest.skip(f"{SOBA_LABEXTENSION} is not built and installed ({LABEXTENSION_BUILD})")
    frontend = FRONTENDS[request.param]
    if frontend.module == "notebook":
        pytest.importorskip(
            "notebook", minversion="7", reason="Notebook 7 is missing (pip install 'notebook>=7')"
        )
    tmp = tmp_path_factory.mktemp(request.param)
    root = tmp / "root"
    root.mkdir()
    write_code_notebook(root / LIVE_NOTEBOOK, LIVE_CELLS)
    write_code_notebook(root / ONE_CELL_NOTEBOOK, ONE_CELL_CELLS)
    with LLMServer() as llm:
        write_soba_json(root, llm.url, LAYER)
        env = isolated_env(tmp / "jupyter", {TEST_KEY_ENV: TEST_KEY_VALUE})
        with jupyter_server(
            frontend.module, tmp / "jupyter", root, env, [frontend.expose_app]
        ) as server:
            yield Served(request.param, frontend, server, ScriptedModel(llm))


# -- the page -------------------------------------------------------------------------------

RECORD_CELL_CHANGES = """
async (path) => {
  // Note every cell added to or removed from the notebook's model, in order.
  const app = window.jupyterapp;
  const main = app.shell.widgets ? [...app.shell.widgets('main')] : [];
  const panel = main.find(w => w.context?.path === path) ?? app.shell.currentWidget;
  await panel.context.ready;
  window.sobaCellChanges = [];
  panel.content.model.cells.changed.connect((_, change) => {
    if (change.type === 'add') {
      const sources = change.newValues.map(c => c.sharedModel.getSource());
      window.sobaCellChanges.push(['add', change.newIndex, sources]);
    } else if (change.type === 'remove') {
      window.sobaCellChanges.push(['remove', change.oldIndex, change.oldValues.length]);
    }
  });
}
"""
SAVE = "() => window.jupyterapp.commands.execute('docmanager:save')"


def open_notebook(page: Any, served: Served, notebook: str) -> None:
    """Open `notebook`, wait for its kernel, and start noting its cell changes."""
    page.goto(
        served.server.url(served.frontend.page.format(file=notebook, stem=Path(notebook).stem))
    )
    wait_for_kernel_idle(page)
    page.evaluate(RECORD_CELL_CHANGES, notebook)


def cell_changes(page: Any) -> list[list[Any]]:
    return [list(change) for change in page.evaluate("window.sobaCellChanges")]


def saved_cells(page: Any, root: Path, notebook: str) -> list[dict[str, Any]]:
    """Save the notebook (File > Save) and read its cells from disk."""
    page.evaluate(SAVE)
    cells = json.loads((root / notebook).read_text(encoding="utf-8"))["cells"]
    for saved in cells:
        if isinstance(saved["source"], list):
            saved["source"] = "".join(saved["source"])
    return cells


def check_proposals(page: Any, first: int) -> None:
    """Cells `first` and `first + 1` are the proposals as the user sees them: the code cell
    not run and without output, the Markdown cell rendered."""
    from playwright.sync_api import expect

    code, note = cell(page, first), cell(page, first + 1)
    expect(code).to_have_class(re.compile(r"\bjp-CodeCell\b"))
    expect(code.locator(".jp-InputPrompt")).to_have_text(NOT_RUN_PROMPT)
    expect(code.locator(".jp-OutputArea-output")).to_have_count(0)
    expect(code.locator(".cm-content")).to_have_text(
        re.compile(r"revenue = sales\['amount'\]\.sum\(\)")
    )
    expect(note).to_have_class(re.compile(r"\bjp-MarkdownCell\b"))
    expect(note.locator(".jp-RenderedMarkdown h2")).to_have_text(
        re.compile(r"^Revenue")
    )  # then its ¶ anchor


def check_saved(
    cells: list[dict[str, Any]], expected: list[tuple[str, str]], proposal: int
) -> None:
    """The saved notebook holds exactly `expected` (type, source), and the proposed code
    cell at `proposal` was never run."""
    assert [(c["cell_type"], c["source"]) for c in cells] == expected
    assert cells[proposal]["execution_count"] is None and cells[proposal]["outputs"] == []


def screenshot(page: Any, path: Path) -> None:
    cell(page, 0).scroll_into_view_if_needed()
    page.screenshot(path=str(path))
    print(f"screenshot: {path}")


# -- the tests ------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_proposed_cells_appear_below_the_running_cell_in_order_once_each(
    served: Served, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    served.model.inference.clear()
    served.model.script(
        tool_calls(("add_cell", {"source": FIX})),
        tool_calls(("add_cell", {"source": NOTE, "kind": "markdown"})),
        text(ANSWER, chunks=ANSWER_CHUNKS, chunk_delay_s=ANSWER_CHUNK_DELAY_S),
    )
    with browser_page(VIEWPORT) as page:
        open_notebook(page, served, LIVE_NOTEBOOK)
        run_all_cells(page)

        # While the %soba cell still runs, both proposals are below it, in order.
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(5, timeout=UI_TIMEOUT_MS)
        expect(cell(page, 1).locator(".jp-InputPrompt")).to_have_text(RUNNING_PROMPT)
        check_proposals(page, 2)

        # The run is over: the cell below ran after it; the proposals are there once each.
        expect(cell(page, 4).locator(".jp-OutputArea-output")).to_have_text(
            "after", timeout=UI_TIMEOUT_MS
        )
        expect(cell(page, 1).locator(".jp-InputPrompt")).to_have_text("[2]:")
        expect(cells).to_have_count(5)
        check_proposals(page, 2)
        expect(cell(page, 1).locator(".jp-OutputArea")).to_contain_text("The corrected cell")

        changes = cell_changes(page)
        check_saved(
            saved_cells(page, served.server.root, LIVE_NOTEBOOK),
            [
                ("code", LIVE_CELLS[0]),
                ("code", REQUEST),
                ("code", FIX),
                ("markdown", NOTE),
                ("code", AFTER),
            ],
            proposal=2,
        )
        # Inserted as they came; the `set_next_input` copy went in at the end, and out.
        assert changes == [
            ["add", 2, [FIX]],
            ["add", 3, [NOTE]],
            ["add", 2, [NOTE_AS_NEXT_INPUT]],
            ["remove", 2, 1],
        ]
        screenshot(page, tmp_path / f"add_cell-{served.name}.png")


@pytest.mark.timeout(180)
def test_proposals_of_the_cell_that_loads_soba_arrive_after_it_and_still_go_below_it(
    served: Served, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    served.model.inference.clear()
    served.model.script(
        tool_calls(
            ("add_cell", {"source": FIX}), ("add_cell", {"source": NOTE, "kind": "markdown"})
        ),
        text("The corrected cell and a note are below."),
    )
    with browser_page(VIEWPORT) as page:
        open_notebook(page, served, ONE_CELL_NOTEBOOK)
        run_all_cells(page)

        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cell(page, 2)).to_have_class(
            re.compile(r"\bjp-MarkdownCell\b"), timeout=UI_TIMEOUT_MS
        )
        expect(cells).to_have_count(4)
        check_proposals(page, 1)
        expect(cell(page, 3).locator(".jp-OutputArea-output")).to_have_text("after")

        changes = cell_changes(page)
        check_saved(
            saved_cells(page, served.server.root, ONE_CELL_NOTEBOOK),
            [("code", ONE_CELL), ("code", FIX), ("markdown", NOTE), ("code", AFTER)],
            proposal=1,
        )
        # The copy came first (no comm was open during the cell); the proposals went above it.
        assert changes == [
            ["add", 1, [NOTE_AS_NEXT_INPUT]],
            ["add", 1, [FIX]],
            ["add", 2, [NOTE]],
            ["remove", 3, 1],
        ]
        screenshot(page, tmp_path / f"add_cell-one-cell-{served.name}.png")
