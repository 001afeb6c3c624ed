"""The notebook a request names, confined to the server's root folder.

`path` is the notebook's path relative to the root, as the contents API names it. Refused, in
one line naming the path and what was wrong: no path, an absolute one, one going up (`..`),
one that is no `.ipynb`, no such notebook, a notebook reached through a link out of the root,
and a session folder (or its inbox) that is a link: the server never writes through one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from soba_nb.layout import INBOX_FOLDER, sessions_folder_for

NOTEBOOK_SUFFIX = ".ipynb"
MAX_PATH_CHARS = 4096
_DRIVE = re.compile(r"^[A-Za-z]:")


class Refused(ValueError):
    """Bad input; the text is one line naming the thing and what was wrong."""


def notebook_in_root(root_dir: str | os.PathLike[str], path: object) -> Path:
    """The notebook `root_dir/path`, checked (raises `Refused`)."""
    if not isinstance(path, str) or not path.strip():
        raise Refused("path: give the notebook's path relative to the server root (as the contents API names it)")
    shown = ascii(path) if len(path) <= 200 else ascii(path[:200]) + "…"
    if "\x00" in path or len(path) > MAX_PATH_CHARS:
        raise Refused(f"path {shown}: not a path")
    pure = PurePosixPath(path)
    if pure.is_absolute() or path.startswith("\\") or _DRIVE.match(path):
        raise Refused(f"path {shown}: absolute; give it relative to the server root")
    if ".." in pure.parts or ".." in path.split("\\"):
        raise Refused(f"path {shown}: goes up (..); give the notebook's path inside the server root")
    if pure.suffix != NOTEBOOK_SUFFIX:
        raise Refused(f"path {shown}: not a notebook ({NOTEBOOK_SUFFIX})")
    root = Path(os.path.realpath(Path(root_dir).expanduser()))
    notebook = root / pure
    if not Path(os.path.realpath(notebook)).is_relative_to(root):
        raise Refused(f"path {shown}: leads out of the server root through a link")
    if not notebook.is_file():
        raise Refused(f"path {shown}: no such notebook")
    folder = sessions_folder_for(notebook)
    for place in (folder, folder / INBOX_FOLDER):
        if place.is_symlink() or (os.path.lexists(place) and not place.is_dir()):
            raise Refused(f"path {shown}: its session folder {place.relative_to(root)} is a link or not a folder; not used")
    return notebook
