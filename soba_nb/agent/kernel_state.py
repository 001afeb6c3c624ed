"""A description of the user's variables for the capsule's `## Kernel state` section.

One line per variable: its name, type and shape or size, never its value — values can be
large, private, or expensive to render, and the capsule only needs to remind the model what
exists. No repr of a user object is ever called. pandas, numpy, polars and torch objects are
recognised by duck typing (`shape`, `dtype`, `dtypes`, the type's name), so none of them is
imported:

    df: DataFrame 120000×14 · float64×9, object×4, datetime64[ns]×1 · built by python call 3fa2b1c0
    arr: ndarray float64 (3, 4)
    items: list[5]
    model: LinearRegression

`kernel_state` writes the section: the variables the agent's `python` calls used come first
(most recently used first, with the call that last assigned each), then the user's own; at
most `MAX_KERNEL_LINES` lines and a `+N more` line; and a last line naming variables the
agent built that the kernel no longer has (a restart, a `del`).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterable, Mapping
from typing import Any

from soba_nb.agent.provenance import Provenance

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
MISSING_PREFIX = "not in the kernel now (restarted, or deleted):"
"""Starts the line naming variables the agent built that the kernel no longer has."""


def kernel_state(ns: Mapping[str, Any], provenance: Provenance | None = None, limit: int = MAX_KERNEL_LINES) -> list[str]:
    """The `## Kernel state` lines: variables the agent's work used first, never values."""
    ranked = provenance.ranked() if provenance is not None else []
    producers = provenance.producers if provenance is not None else {}
    order = [name for name in ranked if name in ns] + list(ns)
    described = [name for name in dict.fromkeys(order) if _is_user_variable(name, ns[name])]
    lines = []
    for name in described[:limit]:
        line = f"{name}: {describe_value(ns[name])}"
        if (dtypes := dtype_summary(ns[name])) is not None:
            line += f" · {dtypes}"
        if name in producers:
            line += f" · built by python call {producers[name].entry_id}"
        lines.append(line)
    if len(described) > limit:
        lines.append(f"+{len(described) - limit} more")
    missing = [
        name
        for name in dict.fromkeys([*ranked, *producers])
        if name in producers and name not in ns and name not in producers[name].imported
    ]
    if missing:
        gone = ", ".join(f"`{name}` (python call {producers[name].entry_id})" for name in missing[:limit])
        more = f", +{len(missing) - limit} more" if len(missing) > limit else ""
        lines.append(f"{MISSING_PREFIX} {gone}{more}")
    return lines


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
