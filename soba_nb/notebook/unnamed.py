"""One line when a kernel cannot know its notebook's file (issue 44 item 7).

`jupyter nbconvert --execute`, nbclient and papermill start a kernel in the notebook's
folder but tell it neither `__session__` nor `JPY_SESSION_NAME` (nbclient passes only the
working folder, `resources['metadata']['path']`), so the session goes to
`untitled.soba/` there (`soba_nb.notebook.location`). In a kernel that is a surprise: the
first session opened says so, once, with the two ways to name it. Outside a kernel
(terminal IPython, a script) `untitled.soba/` is the documented place and nothing is said.
"""

from __future__ import annotations

from typing import Any

from soba_nb.notebook.location import NotebookLocation


def in_kernel(shell: Any) -> bool:
    """True for a Jupyter kernel's shell (ipykernel's `ZMQInteractiveShell`)."""
    return any(cls.__name__ == "ZMQInteractiveShell" for cls in type(shell).__mro__)


def unnamed_line(location: NotebookLocation, shell: Any) -> str | None:
    """The line to show when the kernel does not know its notebook, else None."""
    if location.notebook is not None or not in_kernel(shell):
        return None
    return (
        f"soba: this kernel was not told its notebook's file (as under nbconvert, nbclient or papermill), "
        f"so the session is in {location.sessions_dir}/; to name it, start the kernel with "
        f"JPY_SESSION_NAME=<notebook.ipynb> or use %soba --session <file.jsonl> --new"
    )
