"""`/fix`: the request about the latest cell that raised, or the one named (`/fix --cell 4`, the
sidebar's Fix button), SPEC §10, §15, §18; the model is asked to propose the corrected source
with `edit_cell` on that cell.

The failed cell's source and traceback reach the model in ONE place. When the cells block
appended ahead of the request carries that cell (as the block carries any cell: only its usual
clipping), the request names it (`Fix the notebook cell In [4] above, …`) and repeats nothing;
when the block does not (the cell ran before the previous turn, `notebook.contextTokens` is 0,
or the block could keep it only cut shorter than it keeps cells), the request carries the source
and traceback itself. The choice is made on the block actually appended: the turn loop calls
`FixRequest.prompt` with it.

Both forms then describe the data the cell names, as the kernel holds it now — a DataFrame's
shape and columns, a Series' length and dtype, an array's shape — never a value. The lines go in
the request rather than the cells block: they describe the kernel at the moment of /fix, not the
cell as it ran, and the block is a transcript entry whose fields are public (SPEC §10).

The magics (`%soba /fix`) and the sidebar build the request here, so both send the same text.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from soba_nb.agent.kernel_state import MAX_DTYPE_CHARS, series_name, table_columns
from soba_nb.compaction.cells_context import clip_record, fence_for
from soba_nb.text import clip
from soba_nb.transcript.entries import CellRecord, CellsEntry

INSTRUCTIONS = (
    "Find the cause (check your idea with the python tool if it helps, without changing the "
    "user's variables), then propose the corrected source of In [{count}] with edit_cell (not a "
    "copy with add_cell) and say in one or two sentences what was wrong."
)
"""The user accepts or rejects the edit on the cell itself (SPEC §18): the notebook keeps one
cell, not the broken one and its fixed copy."""
FIX_REQUEST = """\
Fix the notebook cell In [{count}], which failed. Its source:

{fence}python
{source}
{fence}

It raised:

{error_fence}
{error}
{error_fence}

""" + INSTRUCTIONS + "{extra}"
"""The request when the cells block does not carry the failed cell: source and traceback here.
`extra`: the data lines and the user's instructions (`/fix use the region column`)."""
FIX_REFERENCE = "Fix the notebook cell In [{count}] above, which failed.\n\n" + INSTRUCTIONS + "{extra}"
"""The request when the cells block appended ahead of it carries the failed cell."""
DATA_HEADING = "The data it names, as the kernel holds it now:"
MAX_DATA_NAMES = 8
"""Names described; the rest are counted (`… and N more`)."""
MAX_DATA_COLUMNS = 30
"""Columns of a table named with their dtypes; the rest are counted."""
DATA_KINDS = (("pandas", ("DataFrame", "Series")), ("polars", ("DataFrame", "Series")), ("numpy", ("ndarray",)))
"""The types described, looked up in `sys.modules` (soba imports none of these libraries): a
value of a library the kernel never imported cannot be one."""
NAMED_LIBRARIES = frozenset({"polars"})
"""Libraries whose types are named with them (`polars DataFrame`): their API is not pandas'."""
_MAGIC_OR_SHELL = re.compile(r"^\s*(?:%%?[\w.]+|!)\s*")


@dataclass(frozen=True)
class FixRequest:
    """A `/fix` turn's request, decided once the cells block ahead of it is known."""

    cell: CellRecord
    """The failed cell as the model is told of it (redacted)."""
    data: tuple[str, ...] = ()
    """One line per DataFrame, Series or array the cell names (`describe_data`)."""
    instructions: str = ""
    """What the user typed after `/fix`."""

    def prompt(self, block: CellsEntry | None) -> str:
        """The request, given the cells block appended ahead of it (None: none was)."""
        count = self.cell.execution_count if self.cell.execution_count is not None else " "
        extra = ""
        if self.data:
            extra += "\n\n" + DATA_HEADING + "\n" + "\n".join(self.data)
        if self.instructions.strip():
            extra += f"\n\nAlso: {self.instructions.strip()}"
        if carries(block, self.cell):
            return FIX_REFERENCE.format(count=count, extra=extra)
        source, error = self.cell.source, self.cell.error or ""
        return FIX_REQUEST.format(
            count=count, fence=fence_for(source), source=source, error_fence=fence_for(error), error=error, extra=extra
        )


def fix_request(cell: CellRecord, namespace: Mapping[str, Any], instructions: str = "") -> FixRequest:
    """The request about `cell`, with the data it names described from `namespace`."""
    return FixRequest(cell, tuple(describe_data(names_read(cell.source), namespace)), instructions)


def carries(block: CellsEntry | None, cell: CellRecord) -> bool:
    """Whether `block` holds `cell` with its source and error as the block keeps any cell
    (clipped to the usual sizes, not cut down further to fit a small budget)."""
    if block is None or cell.outcome != "error":
        return False
    kept = clip_record(cell)
    return any(
        shown.execution_count == cell.execution_count
        and shown.outcome == "error"
        and shown.source == kept.source
        and shown.error == kept.error
        for shown in block.cells
    )


def names_read(source: str) -> list[str]:
    """The names `source` reads (loads, the bases of attributes), in the order they first
    appear. A cell Python cannot parse (IPython syntax, a syntax error) is read line by line,
    a line magic's or `!`'s own word left out, lines that still do not parse skipped."""
    try:
        trees = [ast.parse(source)]
    except (SyntaxError, ValueError):
        trees = []
        for line in source.splitlines():
            try:
                trees.append(ast.parse(_MAGIC_OR_SHELL.sub("", line).strip()))
            except (SyntaxError, ValueError):
                continue
    found: list[tuple[int, int, int, str]] = []
    for index, tree in enumerate(trees):
        found.extend(
            (index, node.lineno, node.col_offset, node.id)
            for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
        )
    return list(dict.fromkeys(name for *_, name in sorted(found)))


def describe_data(names: list[str], namespace: Mapping[str, Any]) -> list[str]:
    """`df: DataFrame 1,000 × 3 — columns: region (str), amount (float64)` for each of `names`
    that is a pandas or polars DataFrame or Series or a numpy array in `namespace`; at most
    `MAX_DATA_NAMES`, then `… and N more`. Shapes, names and dtypes only, never a value."""
    lines = [line for name in names if name in namespace and (line := _described(name, namespace[name])) is not None]
    if len(lines) > MAX_DATA_NAMES:
        lines = [*lines[:MAX_DATA_NAMES], f"… and {len(lines) - MAX_DATA_NAMES} more"]
    return lines


def data_kind(value: Any) -> tuple[str, str] | None:
    """(library, `DataFrame`, `Series` or `ndarray`) for a value of those pandas, polars or
    numpy types (subclasses too); None otherwise."""
    for module_name, type_names in DATA_KINDS:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for type_name in type_names:
            try:
                kind = getattr(module, type_name, None)
                if isinstance(kind, type) and isinstance(value, kind):
                    return module_name, type_name
            except Exception:  # a half-imported or lazy module: not this kind
                continue
    return None


def _described(name: str, value: Any) -> str | None:
    found = data_kind(value)
    if found is None:
        return None
    library, kind = found
    try:
        shape = tuple(int(size) for size in value.shape)
        dtype = None if kind == "DataFrame" else clip(" ".join(str(value.dtype).split()), MAX_DTYPE_CHARS)
    except Exception:  # a value that will not say: not described
        return None
    shown = f"{library} {type(value).__name__}" if library in NAMED_LIBRARIES else type(value).__name__
    sizes = " × ".join(f"{size:,}" for size in shape)
    if kind != "DataFrame":
        label = series_name(value) if kind == "Series" else None
        return f"{name}: {shown} {sizes} ({dtype})" + (f" — name: {label}" if label is not None else "")
    table = table_columns(value, MAX_DATA_COLUMNS)
    if table is None:
        return f"{name}: {shown} {sizes}"
    pairs, total = table
    columns = [f"{column} ({column_dtype})" for column, column_dtype in pairs]
    if total > len(pairs):
        columns.append(f"… and {total - len(pairs)} more")
    return f"{name}: {shown} {sizes} — columns: " + ", ".join(columns)
