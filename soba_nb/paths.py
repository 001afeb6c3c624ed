"""Paths as a user reads them: relative to the working folder (the notebook's, in a kernel)
when inside it, `~/…` under the home folder, absolute otherwise."""

from __future__ import annotations

import os
from pathlib import Path


def shown(path: str | os.PathLike[str], base: str | os.PathLike[str] | None = None) -> str:
    """`path` for a message: relative to `base` (default: the working folder) when inside it."""
    target = Path(path)
    if not target.is_absolute():
        return str(target)
    for root, prefix in ((Path(base) if base is not None else _cwd(), ""), (Path.home(), "~/")):
        if root is None:
            continue
        try:
            return prefix + str(target.relative_to(root))
        except ValueError:
            continue
    return str(target)


def _cwd() -> Path | None:
    try:
        return Path.cwd()
    except OSError:  # the working folder was deleted
        return None
