"""A description of the user's variables for the capsule's `## Kernel state` section.

One line per variable: its name, type and shape or size, never its value — values can be
large, private, or expensive to render, and the capsule only needs to remind the model what
exists. No repr of a user object is ever called. pandas, numpy, polars and torch objects are
recognised by duck typing (`shape`, `dtype`, `dtypes`, the type's name), so none of them is
imported:

    clean: DataFrame 1722×8 · columns: order_id int64, region str, amount float64, … +5 more · built by the agent
    amount: Series float64 (1722,) · name: amount
    arr: ndarray float64 (3, 4)
    items: list[5]
    model: LinearRegression

`kernel_state` writes the section: the variables the agent's `python` calls used come first
(most recently used first), then the user's own; at most `MAX_KERNEL_LINES` lines and a `+N
more` line; and a last line naming variables the agent built that the kernel no longer has (a
restart, a `del`). A table names its first `MAX_COLUMNS_NAMED` columns with their dtypes (after
a compaction the model still knows the column is `region`); a line is at most
`MAX_LINE_CHARS` long. Figures, axes and other plot handles are left out (they are how a plot
was drawn, not the data; the image is an artifact). No line names a transcript entry id: the
model sees none, so it could look for it nowhere (`/rebuild` reads the provenance itself).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterable, Mapping
from itertools import islice
from typing import Any

from soba_nb.agent.provenance import Provenance
from soba_nb.text import clip

IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})
"""Names IPython puts in every user namespace; they are not the user's work."""
SIZED_BUILTINS = (list, tuple, dict, set, frozenset, str, bytes, bytearray)
"""Types whose len() is safe to take (no user code runs) and worth showing."""
MAX_DTYPE_CHARS = 32
MAX_KERNEL_LINES = 20
"""Variables described in a capsule; the rest are counted on a `+N more` line."""
MAX_COLUMNS_SCANNED = 10_000
"""Columns whose dtypes are counted for a table's dtype summary."""
MAX_DTYPE_KINDS = 6
"""Distinct dtypes named in a summary; the rest are counted as `+N kinds`."""
MAX_COLUMNS_NAMED = 20
"""Columns a table's line names with their dtypes; the rest are counted (`… +N more`)."""
MAX_COLUMN_NAME_CHARS = 40
MAX_LINE_CHARS = 500
"""A kernel state line is clipped to this (many columns with long names: fewer are named)."""
BUILT_BY_AGENT = "built by the agent"
"""Ends the line of a variable the agent's python code built."""
PLOT_MODULES = frozenset(
    {"matplotlib", "mpl_toolkits", "seaborn", "plotly", "bokeh", "altair", "holoviews", "hvplot", "pygal", "plotnine"}
)
"""Top-level modules whose objects are plot handles (figures, axes, artists, grids, charts)."""
PLOT_LIST_SCANNED = 8
"""Items of a list or tuple looked at to tell a list of plot handles (`plt.plot` returns one)."""
MISSING_PREFIX = "not in the kernel now (restarted, or deleted):"
"""Starts the line naming variables the agent built that the kernel no longer has."""


def kernel_state(ns: Mapping[str, Any], provenance: Provenance | None = None, limit: int = MAX_KERNEL_LINES) -> list[str]:
    """The `## Kernel state` lines: variables the agent's work used first, never values."""
    ranked = provenance.ranked() if provenance is not None else []
    producers = provenance.producers if provenance is not None else {}
    order = [name for name in ranked if name in ns] + list(ns)
    described = [
        name for name in dict.fromkeys(order) if _is_user_variable(name, ns[name]) and not is_plot_handle(ns[name])
    ]
    lines = []
    for name in described[:limit]:
        value = ns[name]
        head = f"{name}: {describe_value(value)}"
        tail = f" · {BUILT_BY_AGENT}" if name in producers else ""
        if (series := series_name(value)) is not None:
            head += f" · name: {series}"
        if (columns := column_summary(value, MAX_LINE_CHARS - len(head) - len(tail) - len(" · columns: "))) is not None:
            head += f" · columns: {columns}"
        elif (dtypes := dtype_summary(value)) is not None:
            head += f" · {dtypes}"
        lines.append(clip(head, MAX_LINE_CHARS - len(tail)) + tail)
    if len(described) > limit:
        lines.append(f"+{len(described) - limit} more")
    missing = [
        name
        for name in dict.fromkeys([*ranked, *producers])
        if name in producers and name not in ns and name not in producers[name].imported
    ]
    if missing:
        gone = ", ".join(f"`{name}`" for name in missing[:limit])
        more = f", +{len(missing) - limit} more" if len(missing) > limit else ""
        lines.append(f"{MISSING_PREFIX} {gone}{more}")
    return lines


def is_plot_handle(value: Any) -> bool:
    """A figure, axes, artist, seaborn grid, plotly/bokeh/altair chart (by the module of its
    type, so nothing is imported); a list or tuple of them (`plt.plot` returns Line2D objects);
    a numpy array of axes (`plt.subplots(2, 2)`)."""
    if _plot_type(value):
        return True
    if isinstance(value, (list, tuple)) and value:
        return all(_plot_type(item) for item in value[:PLOT_LIST_SCANNED])
    if _module_root(value) == "numpy" and _dtype(value) == "object":
        try:
            first = next(iter(value.flat), None)
        except Exception:
            return False
        return first is not None and _plot_type(first)
    return False


def _module_root(value: Any) -> str:
    module = getattr(type(value), "__module__", None)
    return module.split(".", 1)[0] if isinstance(module, str) else ""


def _plot_type(value: Any) -> bool:
    root = _module_root(value)
    return root in PLOT_MODULES or (root == "cartopy" and ".mpl" in type(value).__module__)


def column_summary(value: Any, room: int = MAX_LINE_CHARS) -> str | None:
    """`order_id int64, region str, amount float64, … +5 more` for a table (pandas, polars:
    its `columns` and `dtypes`, read by duck typing); None for anything else. The first
    `MAX_COLUMNS_NAMED` columns, fewer when `room` characters cannot hold them."""
    table = table_columns(value, MAX_COLUMNS_NAMED)
    if table is None:
        return None
    pairs, total = table
    named: list[str] = []
    used = 0
    for column, dtype in pairs:
        part = f"{column} {dtype}"
        rest = total - len(named) - 1
        if used + len(part) + 2 + (len(f"… +{rest} more") + 2 if rest else 0) > room and named:
            break
        named.append(part)
        used += len(part) + 2
    if total > len(named):
        named.append(f"… +{total - len(named)} more")
    return ", ".join(named)


def table_columns(value: Any, limit: int) -> tuple[list[tuple[str, str]], int] | None:
    """The first `limit` columns of a table (pandas, polars: its `columns` and `dtypes`, read by
    duck typing) as (name, dtype) texts, and how many columns it has; None for anything else."""
    if not hasattr(type(value), "columns") or not hasattr(type(value), "dtypes"):
        return None
    try:
        columns = value.columns
        dtypes = value.dtypes
        total = len(columns)
        if isinstance(dtypes, str) or total <= 0 or not hasattr(dtypes, "__iter__"):
            return None
        pairs = list(zip(islice(iter(columns), limit), islice(iter(dtypes), limit), strict=False))
    except Exception:  # a table that will not say: its shape is enough
        return None
    return [(_label(column), _dtype_name(dtype)) for column, dtype in pairs], total


def series_name(value: Any) -> str | None:
    """The name of a pandas or polars Series (a 1-D value with `name` and `dtype`), else None."""
    if _shape(value) is None or len(_shape(value) or ()) != 1 or not hasattr(type(value), "name"):
        return None
    if hasattr(type(value), "columns") or _dtype(value) is None:
        return None
    try:
        name = value.name
    except Exception:
        return None
    return None if name is None or name == "" else _label(name)


def _label(name: Any) -> str:
    """A column's or Series' name, shown without calling a user object's repr: a string, a
    number, or a tuple of them (a MultiIndex); in backticks when it has spaces or commas."""
    if isinstance(name, tuple):
        text = "/".join(_label(part) for part in name)
    elif type(name) in (str, int, float, bool) or _module_root(name) == "numpy":
        text = str(name)
    else:
        text = f"<{type(name).__name__}>"
    text = clip(" ".join(text.split()), MAX_COLUMN_NAME_CHARS)
    return f"`{text}`" if not text or any(c in text for c in " ,·`") else text


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, tuple) and len(dtype) == 2:  # (name, type): a Spark DataFrame's dtypes
        dtype = dtype[1]
    try:
        name = getattr(dtype, "name", None)
        text = name if isinstance(name, str) and _module_root(dtype) in ("numpy", "pandas") else str(dtype)
    except Exception:
        return "?"
    return clip(" ".join(text.split()), MAX_DTYPE_CHARS) or "?"


def dtype_summary(value: Any) -> str | None:
    """`float64×2, object×1` for a table (pandas, polars); None for anything else."""
    if not hasattr(type(value), "columns") and not hasattr(value, "columns"):
        return None
    try:
        dtypes = getattr(value, "dtypes", None)
        if dtypes is None or isinstance(dtypes, str) or not hasattr(dtypes, "__iter__"):
            return None
        counts: dict[str, int] = {}
        for index, dtype in enumerate(dtypes):
            if index >= MAX_COLUMNS_SCANNED:
                break
            name = str(dtype)[:MAX_DTYPE_CHARS]
            counts[name] = counts.get(name, 0) + 1
    except Exception:  # a table that will not say: the shape is enough
        return None
    if not counts:
        return None
    parts = [f"{name}×{count}" for name, count in counts.items()]
    extra = f", +{len(parts) - MAX_DTYPE_KINDS} kinds" if len(parts) > MAX_DTYPE_KINDS else ""
    return ", ".join(parts[:MAX_DTYPE_KINDS]) + extra


def describe_namespace(
    ns: Mapping[str, Any], names: Iterable[str] | None = None, limit: int = 20
) -> list[str]:
    """Describe the user variables in `ns` (or only `names`, in that order), at most `limit`.

    When more variables qualify than `limit`, a last line `… and N more` says how many were
    left out. Names that are missing from `ns` are skipped.
    """
    candidates = list(ns) if names is None else [name for name in names if name in ns]
    described = [name for name in dict.fromkeys(candidates) if _is_user_variable(name, ns[name])]
    lines = [f"{name}: {describe_value(ns[name])}" for name in described[:limit]]
    if len(described) > limit:
        lines.append(f"… and {len(described) - limit} more")
    return lines


def describe_value(value: Any) -> str:
    """Type and shape or size of one value, e.g. `ndarray float64 (3, 4)`; never the value."""
    type_name = type(value).__name__
    if isinstance(value, SIZED_BUILTINS):
        return f"{type_name}[{len(value)}]"
    shape = _shape(value)
    if shape is None or shape == ():
        return type_name
    dtype = _dtype(value)
    if dtype is None and len(shape) == 2:
        return f"{type_name} {shape[0]}×{shape[1]}"
    return " ".join(part for part in (type_name, dtype, str(shape)) if part)


def _is_user_variable(name: str, value: Any) -> bool:
    if name.startswith("_") or name in IPYTHON_NAMES:
        return False
    return not (isinstance(value, (types.ModuleType, type)) or inspect.isroutine(value))


def _shape(value: Any) -> tuple[int, ...] | None:
    # Only a real tuple (numpy, pandas, polars, torch.Size): anything else is not a shape.
    try:
        shape = getattr(value, "shape", None)
    except Exception:
        return None
    if isinstance(shape, tuple) and all(isinstance(size, int) for size in shape):
        return tuple(shape)
    return None


def _dtype(value: Any) -> str | None:
    try:
        dtype = getattr(value, "dtype", None)
        if dtype is None:
            return None
        name = getattr(dtype, "name", None)
        text = name if isinstance(name, str) else str(dtype)
    except Exception:
        return None
    return text[:MAX_DTYPE_CHARS] if text and "\n" not in text else None
