"""The environment line of the system prompt (SPEC §15): where the agent's code runs.

    Environment: notebook sales.ipynb · Python 3.12.3 · pandas 3.0, numpy 2.3, matplotlib 3.10 · today 2026-12-06

A model trained on pandas 2 misreads pandas 3's `str` dtype; one told the version does not.
The line names the notebook, the kernel's Python, the data libraries the kernel can import
and today's date. Libraries: the first `MAX_LIBRARIES` of `DATA_LIBRARIES` that are
installed, in that order (the most used first), by major and minor version — what an API
changes with; the line is part of every request, so it is bounded (the system prompt and
the tool schemas stay under 1,300 tokens, SPEC §15). Nothing is imported to learn a version:
a module already imported answers with its `__version__` (what the kernel really runs, even
after an upgrade on disk), any other one with its installed distribution's metadata. The
libraries are looked up once per process; the date each time.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import platform
import re
import sys
from datetime import date
from pathlib import PurePath

from soba_nb.printable import note_line

DATA_LIBRARIES: tuple[tuple[str, str], ...] = (
    ("pandas", "pandas"),
    ("numpy", "numpy"),
    ("polars", "polars"),
    ("sklearn", "scikit-learn"),
    ("scipy", "scipy"),
    ("matplotlib", "matplotlib"),
    ("seaborn", "seaborn"),
    ("pyarrow", "pyarrow"),
    ("duckdb", "duckdb"),
    ("statsmodels", "statsmodels"),
    ("plotly", "plotly"),
    ("torch", "torch"),
)
"""(module, distribution) of the libraries named when the kernel can import them, most used first."""
MAX_LIBRARIES = 8
NAME_CHARS = 40
"""The notebook's name, on one line, control characters escaped, clipped to this length."""
PREFIX = "Environment: "
_MAJOR_MINOR = re.compile(r"\d+(?:\.\d+)?")


def environment_line(notebook: str | None, today: date | None = None) -> str:
    """The line, for a session of `notebook` (a path or None) run in this process."""
    parts = [f"notebook {note_line(PurePath(notebook).name, NAME_CHARS)}" if notebook else "no notebook file"]
    parts.append(f"Python {platform.python_version()}")
    libraries = ", ".join(f"{name} {version}" for name, version in importable_libraries()[:MAX_LIBRARIES])
    if libraries:
        parts.append(libraries)
    parts.append(f"today {(today or date.today()).isoformat()}")
    return PREFIX + " · ".join(parts)


def importable_libraries() -> tuple[tuple[str, str], ...]:
    """(distribution, major.minor version) of each data library the kernel can import, in
    `DATA_LIBRARIES` order; a module already imported gives its own version (what runs), even
    if a newer one is on disk."""
    found = []
    for module, distribution in DATA_LIBRARIES:
        loaded = sys.modules.get(module)
        running = getattr(loaded, "__version__", None) if loaded is not None else None
        version = running if isinstance(running, str) else _installed_version(module, distribution)
        shown = _MAJOR_MINOR.match(version or "")
        if shown is not None:
            found.append((distribution, shown.group()))
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
