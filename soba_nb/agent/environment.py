"""The environment line of the system prompt (SPEC §15): where the agent's code runs.

    Environment: notebook sales.ipynb · Python 3.12.3 · pandas 3.0.0, numpy 2.3.5, matplotlib 3.10.8 · today 2026-12-06

A model trained on pandas 2 misreads pandas 3's `str` dtype; one told the version does not.
The line names the notebook, the kernel's Python, the data libraries the kernel can import
(`DATA_LIBRARIES`, in that order, only those installed) and today's date. Nothing is
imported to learn a version: a module already imported answers with its `__version__` (what
the kernel really runs, even after an upgrade on disk), any other one with its installed
distribution's metadata. The libraries are looked up once per process; the date each time.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import platform
import sys
from datetime import date
from pathlib import PurePath

from soba_nb.printable import note_line

DATA_LIBRARIES: tuple[tuple[str, str], ...] = (
    ("pandas", "pandas"),
    ("numpy", "numpy"),
    ("polars", "polars"),
    ("pyarrow", "pyarrow"),
    ("duckdb", "duckdb"),
    ("scipy", "scipy"),
    ("sklearn", "scikit-learn"),
    ("statsmodels", "statsmodels"),
    ("matplotlib", "matplotlib"),
    ("seaborn", "seaborn"),
    ("plotly", "plotly"),
    ("torch", "torch"),
)
"""(module, distribution) of the libraries named when the kernel can import them."""
MAX_VERSION_CHARS = 24
"""A version string longer than this (a local build's) is cut: it is one word of a line."""
NAME_CHARS = 80
"""The notebook's name, on one line, control characters escaped, clipped to this length."""
PREFIX = "Environment: "


def environment_line(notebook: str | None, today: date | None = None) -> str:
    """The line, for a session of `notebook` (a path or None) run in this process."""
    parts = [f"notebook {note_line(PurePath(notebook).name, NAME_CHARS)}" if notebook else "no notebook file"]
    parts.append(f"Python {platform.python_version()}")
    libraries = ", ".join(f"{name} {version}" for name, version in importable_libraries())
    if libraries:
        parts.append(libraries)
    parts.append(f"today {(today or date.today()).isoformat()}")
    return PREFIX + " · ".join(parts)


def importable_libraries() -> tuple[tuple[str, str], ...]:
    """(distribution, version) of each data library the kernel can import, in `DATA_LIBRARIES` order;
    a module already imported gives its own version (what runs), even if a newer one is on disk."""
    found = []
    for module, distribution in DATA_LIBRARIES:
        loaded = sys.modules.get(module)
        running = getattr(loaded, "__version__", None) if loaded is not None else None
        version = running if isinstance(running, str) and running else _installed_version(module, distribution)
        if version:
            found.append((distribution, version[:MAX_VERSION_CHARS]))
    return tuple(found)


@functools.cache
def _installed_version(module: str, distribution: str) -> str | None:
    """The installed distribution's version when the module can be imported, else None (a
    module without its distribution's metadata, a source tree, is not named)."""
    try:
        if importlib.util.find_spec(module) is None:
            return None
        return importlib.metadata.version(distribution) or None
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        return None
