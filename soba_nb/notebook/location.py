"""Where the notebook is, where its sessions go, and which folder is the project (SPEC §7, §8).

The kernel tells us the notebook's path in one of three ways, tried in this order:

1. `__session__` in the user namespace — ipykernel ≥ 6.22 copies it from the server
   (JupyterLab 4, Notebook 7);
2. the `JPY_SESSION_NAME` environment variable — what jupyter-server gives the kernel;
3. `__vsc_ipynb_file__` in the user namespace — set by VS Code's Jupyter extension.

A relative path is read against the working folder (a kernel starts in its notebook's
folder, so a server-relative `sub/analysis.ipynb` is found as `./analysis.ipynb`). A value
without a file suffix (a console session's name) is not a notebook path. When none of the
three gives a path — terminal IPython, a bare `InteractiveShell`, a script — there is no
notebook: sessions go to `<working folder>/untitled.soba/`, as if the notebook were an
unsaved `untitled.ipynb` there.

The project root (SPEC §8) is the nearest folder, from the notebook's own folder upward,
holding `soba.json` or `.git`; if there is none, the notebook's folder
(`soba_nb.layout.project_root_for`, shared with project memory).

The path is read when a session starts; renaming the notebook afterwards keeps the
session where it was (the server does not tell a running kernel about renames).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from soba_nb.layout import UNTITLED_NOTEBOOK, project_root_for, sessions_folder_for

NAMESPACE_KEYS = ("__session__",)
"""User-namespace names holding the notebook path, tried before the environment."""
ENVIRONMENT_KEYS = ("JPY_SESSION_NAME",)
LATE_NAMESPACE_KEYS = ("__vsc_ipynb_file__",)
"""Tried after the environment (VS Code sets it; JPY_SESSION_NAME may be inherited)."""


class NotebookLocation(NamedTuple):
    """The answer of `locate`: unpack it as `(notebook, sessions_dir, project_root)`."""

    notebook: Path | None
    """Absolute notebook path, or None when the kernel does not know it."""
    sessions_dir: Path
    """`<notebook-stem>.soba/` next to the notebook (or `untitled.soba/`)."""
    project_root: Path
    """Nearest folder upward holding `soba.json` or `.git`, else the notebook's folder."""


def _as_notebook_path(value: Any, cwd: Path) -> Path | None:
    if not isinstance(value, str | os.PathLike):
        return None
    text = os.fspath(value).strip()
    if not text:
        return None
    path = Path(text).expanduser()
    if not path.suffix:
        return None
    if path.is_absolute():
        return path
    joined = cwd / path
    return joined if joined.exists() else cwd / path.name


def notebook_path(
    namespace: Mapping[str, Any] | None,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Path | None:
    """The notebook's absolute path as the kernel reports it, or None."""
    namespace = namespace or {}
    environ = os.environ if environ is None else environ
    cwd = (cwd or Path.cwd()).resolve()
    candidates = [namespace.get(key) for key in NAMESPACE_KEYS]
    candidates += [environ.get(key) for key in ENVIRONMENT_KEYS]
    candidates += [namespace.get(key) for key in LATE_NAMESPACE_KEYS]
    for value in candidates:
        found = _as_notebook_path(value, cwd)
        if found is not None:
            return found.resolve()
    return None


def locate(
    namespace: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    session_file: Path | None = None,
) -> NotebookLocation:
    """Notebook path, sessions folder and project root for a kernel.

    `session_file` (from `%soba --session PATH`) overrides the sessions folder: the
    transcript's own folder is used.
    """
    cwd = (cwd or Path.cwd()).resolve()
    notebook = notebook_path(namespace, environ=environ, cwd=cwd)
    sessions_dir = sessions_folder_for(notebook or cwd / UNTITLED_NOTEBOOK)
    if session_file is not None:
        sessions_dir = (cwd / session_file.expanduser()).resolve().parent
    folder = notebook.parent if notebook is not None else cwd
    return NotebookLocation(notebook, sessions_dir, project_root_for(folder))
