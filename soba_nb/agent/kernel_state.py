"""A description of the user's variables for the capsule's `## Kernel state` section.

One line per variable: its name, type and shape or size, never its value — values can be
large, private, or expensive to render, and the capsule only needs to remind the model what
exists. No repr of a user object is ever called. pandas, numpy, polars and torch objects are
recognised by duck typing (`shape`, `dtype`, the type's name), so none of them is imported:

    df: DataFrame 120000×14
    arr: ndarray float64 (3, 4)
    items: list[5]
    cfg: dict[3]
    model: LinearRegression
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterable, Mapping
from typing import Any

IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})
"""Names IPython puts in every user namespace; they are not the user's work."""
SIZED_BUILTINS = (list, tuple, dict, set, frozenset, str, bytes, bytearray)
"""Types whose len() is safe to take (no user code runs) and worth showing."""
MAX_DTYPE_CHARS = 32


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
