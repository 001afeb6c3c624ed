"""The agent's code, reproducible (SPEC §10): the `python` calls on the current path that ran
without error, in order, as a percent-format script (`# %%` before each call, with a comment
naming the call id and the request it served) or as a notebook.

`soba-nb code SESSION [OUT]` and `%soba /code [OUT]` write it; without OUT the script is
printed. Nothing is written over an existing file without `force`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from soba_nb.agent.provenance import PYTHON_TOOL
from soba_nb.capsule_files.file import CapsuleFileError, write_file_atomically
from soba_nb.compaction.requests import is_request
from soba_nb.text import one_line
from soba_nb.transcript.entries import Entry, MessageEntry, ToolCallEntry, ToolResultEntry

NOTEBOOK_SUFFIX = ".ipynb"
REQUEST_CHARS = 100
"""The request a call served, in its comment, clipped to this length."""
NBFORMAT = 4
NBFORMAT_MINOR = 5


class CodeExportError(ValueError):
    """The code cannot be written where it was asked (the message says why, in one line)."""


@dataclass(frozen=True)
class CodeStep:
    call_id: str
    request: str
    code: str


def code_steps(path: Sequence[Entry]) -> list[CodeStep]:
    """The successful `python` calls on `path`, in order, each with the request it served.

    A call is matched with the first result after it that bears its id: some servers number
    their calls afresh each turn (`call_0`, …), so an id alone does not name one call."""
    waiting: dict[str, CodeStep] = {}
    succeeded: set[int] = set()
    steps: list[CodeStep] = []
    request = ""
    for entry in path:
        if isinstance(entry, MessageEntry) and is_request(entry):  # a steer is part of its request
            request = entry.content
        elif isinstance(entry, ToolCallEntry) and entry.name == PYTHON_TOOL:
            code = _code_of(entry)
            if code is not None and code.strip():
                waiting[entry.call_id] = CodeStep(entry.call_id, request, code)
                steps.append(waiting[entry.call_id])
            else:
                waiting.pop(entry.call_id, None)
        elif isinstance(entry, ToolResultEntry) and entry.call_id in waiting:
            step = waiting.pop(entry.call_id)
            if not entry.is_error:
                succeeded.add(id(step))
    return [step for step in steps if id(step) in succeeded]


def _code_of(call: ToolCallEntry) -> str | None:
    try:
        arguments = json.loads(call.arguments, strict=False)
    except (ValueError, RecursionError):
        return None
    code = arguments.get("code") if isinstance(arguments, dict) else None
    return code if isinstance(code, str) else None


def _comment(step: CodeStep) -> str:
    request = one_line(step.request, REQUEST_CHARS) if step.request else "(no request)"
    return f"# call {step.call_id} · for: {request}"


def as_script(steps: Sequence[CodeStep], *, title: str) -> str:
    """A percent-format script (Jupytext, VS Code, Spyder read its `# %%` cells)."""
    parts = [f"# {title}\n# The agent's successful python calls, in order ({len(steps)})."]
    for step in steps:
        parts.append(f"# %%\n{_comment(step)}\n{step.code.rstrip()}")
    return "\n\n".join(parts) + "\n"


def as_notebook(steps: Sequence[CodeStep], *, title: str) -> str:
    """A notebook (nbformat 4) with one code cell per call, each led by its comment."""
    cells: list[dict[str, object]] = [{"cell_type": "markdown", "id": "title", "metadata": {}, "source": f"# {title}\n\nThe agent's successful python calls, in order ({len(steps)})."}]
    for index, step in enumerate(steps):
        source = f"{_comment(step)}\n{step.code.rstrip()}"
        cells.append({"cell_type": "code", "id": f"call-{index}", "metadata": {}, "execution_count": None, "outputs": [], "source": source})
    notebook = {
        "nbformat": NBFORMAT,
        "nbformat_minor": NBFORMAT_MINOR,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}, "language_info": {"name": "python"}},
        "cells": cells,
    }
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class CodeExport:
    text: str
    """The script or the notebook."""
    calls: int
    written: Path | None
    """The file written; None when OUT was not given (the text is to be printed)."""

    def receipt(self, where: str | None = None) -> str:
        """What the user is told once OUT is written (`where`: the path as the caller shows it)."""
        return f"wrote the code of {self.calls} python call{'s' if self.calls != 1 else ''} to {where or self.written}"


def export_code(path: Sequence[Entry], out: Path | None, *, title: str, force: bool = False) -> CodeExport:
    """The code of the successful python calls on `path`, written to `out` (a notebook when it
    ends in `.ipynb`, else a script) or, without `out`, only returned."""
    steps = code_steps(path)
    notebook = out is not None and out.suffix.lower() == NOTEBOOK_SUFFIX
    text = as_notebook(steps, title=title) if notebook else as_script(steps, title=title)
    if out is None:
        return CodeExport(text, len(steps), None)
    if out.is_dir():
        raise CodeExportError(f"{out}: is a folder; give a file name (.py or .ipynb)")
    if out.exists() and not force:
        raise CodeExportError(f"{out}: already exists; add --force to overwrite it")
    try:
        written = write_file_atomically(out, text.encode("utf-8"), force=force, suffix=out.suffix or ".py")
    except (CapsuleFileError, OSError) as error:  # in one line
        raise CodeExportError(str(error).splitlines()[0]) from None
    return CodeExport(text, len(steps), written)
