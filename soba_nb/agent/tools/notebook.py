"""Notebook tools (SPEC §10, §18): `read_cells`, `read_notebook`, `add_cell`, `edit_cell`.

The agent sees the notebook the way the user does — the cells this kernel ran (recorded as
they ran, with their errors) and any saved notebook of the project — and its work lands in
the notebook as cells it proposes: `add_cell` never runs anything; the cell is put below the
current one for the user to read and run. `edit_cell` changes nothing either: it proposes a
new source for a cell the user ran, which the user accepts or rejects (the decision reaches
the model later, as a user message: `soba_nb.agent.cell_edits`).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from soba_nb.agent.tools.base import (
    CLIPPED,
    CellKind,
    NotebookAccess,
    ToolArguments,
    ToolContext,
    ToolError,
    ToolOutcome,
    optional_parameter,
)
from soba_nb.agent.tools.confined import Confinement
from soba_nb.compaction.cells_context import render_cell

DEFAULT_CELLS = 10
"""`read_cells` without bounds: the last this many cells."""
NOTEBOOK_SUFFIX = ".ipynb"
OUTPUT_TEXT_CHARS = 2000
"""One output of a saved cell, as text, at most this long."""


class ReadCellsArguments(ToolArguments):
    first: int = Field(0, ge=0, description="First In [n]; 0: the last 10 cells.", json_schema_extra=optional_parameter)
    last: int = Field(0, ge=0, description="Last In [n]; 0: the newest.", json_schema_extra=optional_parameter)


class ReadNotebookArguments(ToolArguments):
    path: str = Field("", description="A .ipynb in the project; empty: this notebook.")


class AddCellArguments(ToolArguments):
    source: str = Field(description="The cell's source.")
    kind: CellKind = "code"


class EditCellArguments(ToolArguments):
    execution_count: int = Field(description="n of In [n].")
    source: str = Field(description="The whole new source.")


# Short on purpose: every request carries the tool schemas, and a small local model's whole
# window may be 2,048 tokens.
READ_CELLS_DESCRIPTION = "Read cells the user ran (source, output, error) by In [n]." + CLIPPED
READ_NOTEBOOK_DESCRIPTION = "Read a saved notebook's cells in order, outputs as text." + CLIPPED
ADD_CELL_DESCRIPTION = "Propose a cell (code or markdown) below this one, not run." + CLIPPED
EDIT_CELL_DESCRIPTION = "Propose a new source for In [n]; the user accepts or rejects it." + CLIPPED
EDIT_PROPOSED = "proposed a new source for In [{count}] ({lines} line{plural}), not applied: {where}."
"""The result of an `edit_cell` call: a proposal, and how it reaches the user (`where`: a diff on
the cell awaiting their decision, or the output and the next cell with no decision coming back —
one of the two, never both, so the model is not told two things)."""


def _access(ctx: ToolContext, tool: str) -> NotebookAccess:
    if ctx.notebook is None:
        raise ToolError(f"{tool}: there is no notebook here (a kernel without a notebook frontend)")
    return ctx.notebook


def read_cells(arguments: ReadCellsArguments, ctx: ToolContext) -> ToolOutcome:
    access = _access(ctx, "read_cells")
    first, last = arguments.first or None, arguments.last or None
    if first is not None and last is not None and first > last:
        raise ToolError(f"read_cells: first ({first}) is after last ({last})")
    found = list(access.cells(first, last))
    if first is None and last is None:
        found = found[-DEFAULT_CELLS:]
    if not found:
        bounds = "" if first is None and last is None else f" between In [{first or 1}] and In [{last or '…'}]"
        return ToolOutcome(f"no recorded cells{bounds} (cells run before `%load_ext soba_nb` are not recorded)")
    return ToolOutcome("\n\n".join(render_cell(record) for record in found))


def read_notebook(arguments: ReadNotebookArguments, ctx: ToolContext) -> ToolOutcome:
    shown = arguments.path.strip()
    if not shown:
        notebook = ctx.notebook.notebook if ctx.notebook is not None else None
        if notebook is None:
            raise ToolError("read_notebook: this kernel does not know its notebook; give a path")
        shown = str(notebook)
    if not shown.endswith(NOTEBOOK_SUFFIX):
        raise ToolError(f"read_notebook: '{shown}' is not a notebook (.ipynb); use read_file")
    place = Confinement("read_notebook", shown, ctx.project_root)
    try:
        data = json.loads(place.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ToolError(f"read_notebook: cannot read '{shown}' as a notebook ({type(error).__name__}: {error})") from None
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, list):
        raise ToolError(f"read_notebook: '{shown}' has no cells list; is it a notebook?")
    rendered = [_saved_cell(cell) for cell in cells if isinstance(cell, dict)]
    return ToolOutcome("\n\n".join(part for part in rendered if part) or f"'{shown}' has no cells")


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "".join(str(part) for part in value)
    return value if isinstance(value, str) else ""


def _saved_cell(cell: dict[str, Any]) -> str:
    kind = cell.get("cell_type")
    source = _text(cell.get("source"))
    if kind == "markdown":
        return f"[markdown]\n{source}"
    if kind != "code":
        return ""
    count = cell.get("execution_count")
    label = f"In [{count}]" if isinstance(count, int) else "In [ ]"
    fence = "````" if "```" in source else "```"
    parts = [f"{label}:\n{fence}python\n{source}\n{fence}"]
    for output in cell.get("outputs") or []:
        if isinstance(output, dict):
            parts.append(_saved_output(output)[:OUTPUT_TEXT_CHARS])
    return "\n".join(part for part in parts if part)


def _saved_output(output: dict[str, Any]) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        return _text(output.get("text")).rstrip("\n")
    if kind == "error":
        return f"raised {output.get('ename', 'Error')}: {output.get('evalue', '')}"
    data = output.get("data") if isinstance(output.get("data"), dict) else {}
    assert isinstance(data, dict)
    images = [mime for mime in data if str(mime).startswith("image/")]
    text = _text(data.get("text/plain"))
    if images:
        return f"[image: {', '.join(images)}]" + (f" {text}" if text and not text.startswith("<Figure") else "")
    return text


def add_cell(arguments: AddCellArguments, ctx: ToolContext) -> ToolOutcome:
    access = _access(ctx, "add_cell")
    if not arguments.source.strip():
        raise ToolError("add_cell: the source is empty")
    where = access.propose(arguments.source, arguments.kind)
    lines = len(arguments.source.splitlines())
    return ToolOutcome(f"proposed a {arguments.kind} cell ({lines} line{'' if lines == 1 else 's'}), not run: {where}")


def edit_cell(arguments: EditCellArguments, ctx: ToolContext) -> ToolOutcome:
    access = _access(ctx, "edit_cell")
    count = arguments.execution_count
    if access.edit is None:
        raise ToolError("edit_cell: this notebook cannot take edits; propose a cell with add_cell")
    recorded = list(access.recorded())
    if count not in recorded:
        raise ToolError(f"edit_cell: no cell In [{count}] was recorded in this kernel; {_recorded_counts(recorded)}")
    if not arguments.source.strip():
        raise ToolError("edit_cell: the source is empty")
    where = access.edit(count, arguments.source)
    lines = len(arguments.source.splitlines())
    return ToolOutcome(EDIT_PROPOSED.format(count=count, lines=lines, plural="" if lines == 1 else "s", where=where))


def _recorded_counts(counts: list[int]) -> str:
    """`recorded: In [1]–In [3], In [7]` (runs of counts joined), or why there are none."""
    if not counts:
        return "none is (cells run before `%load_ext soba_nb` are not recorded)"
    runs: list[list[int]] = []
    for count in sorted(set(counts)):
        if runs and count == runs[-1][-1] + 1:
            runs[-1].append(count)
        else:
            runs.append([count])
    shown = [f"In [{run[0]}]" if len(run) == 1 else f"In [{run[0]}]–In [{run[-1]}]" for run in runs]
    return "recorded: " + ", ".join(shown)


def summarize_read_cells(arguments: ReadCellsArguments) -> str:
    if not arguments.first and not arguments.last:
        return "read_cells (the last 10)"
    return f"read_cells In [{arguments.first or 1}]–In [{arguments.last or '…'}]"


def summarize_read_notebook(arguments: ReadNotebookArguments) -> str:
    return f"read_notebook {arguments.path or '(this notebook)'}"


def summarize_add_cell(arguments: AddCellArguments) -> str:
    first = next((line for line in arguments.source.splitlines() if line.strip()), "")
    return f"add_cell {arguments.kind}: {first}"


def summarize_edit_cell(arguments: EditCellArguments) -> str:
    first = next((line for line in arguments.source.splitlines() if line.strip()), "")
    return f"edit_cell In [{arguments.execution_count}]: {first}"
