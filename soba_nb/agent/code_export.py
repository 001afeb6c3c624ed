"""The session's code, reproducible (SPEC §10): the cells the user ran without an error and
the agent's `python` calls that succeeded, on the current path, in the order they ran, as a
percent-format script (`# %%` before each, with a comment naming the cell `In [n]`, or the call
id and the request it served) or as a notebook — code that runs on its own with `python`.

Every such cell, not only those the agent's code reads: a seed, an option, a working folder or a
file a cell wrote changes what the code computes without a name the agent's code uses, so only
the whole record reproduces it. Cells that raised are left out (they would stop the script), and
so are soba's own magics and requests (the conversation, not the code). The cells come from the
`cell_sources` entries (whole sources); a session recorded before them falls back to the model's
view (`cells` entries), whose clipped cells are left out and said.

The script starts with a header of what it needs: where to run it, the packages it imports
(with the versions installed where it was exported), the files it reads, the IPython-only
lines left out, the secrets written as `[redacted]` (`code_needs`, `script_python`).

`soba-nb code SESSION [OUT]` and `%soba /code [OUT]` write it; without OUT the script is
printed. Nothing is written over an existing file without `force`.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from soba_nb.agent.code_needs import Needs, needs_of
from soba_nb.agent.provenance import PYTHON_TOOL, REBUILD_PREFIX
from soba_nb.agent.script_python import plain_python
from soba_nb.capsule_files.file import CapsuleFileError, write_file_atomically
from soba_nb.compaction.requests import is_request
from soba_nb.redact import REDACTED
from soba_nb.text import MIDDLE_NOTE, one_line
from soba_nb.transcript.entries import (
    CellsEntry,
    CellSourcesEntry,
    Entry,
    MessageEntry,
    ToolCallEntry,
    ToolResultEntry,
)
from soba_nb.transcript.store import Transcript

NOTEBOOK_SUFFIX = ".ipynb"
REQUEST_CHARS = 100
"""The request a call served, in its comment, clipped to this length."""
NBFORMAT = 4
NBFORMAT_MINOR = 5
HEADER_WIDTH = 96
MAX_LISTED = 12
"""Cells, lines and files a header line names; the rest are counted."""
_CLIPPED = re.compile(re.escape(MIDDLE_NOTE).replace(r"\{count\}", r"\d+"))


class CodeExportError(ValueError):
    """The code cannot be written where it was asked (the message says why, in one line)."""


@dataclass(frozen=True)
class CodeStep:
    kind: Literal["cell", "call"]
    label: str
    """`In [3]` for a cell, the call id for a call."""
    request: str
    """The request a call served ("" for a cell)."""
    code: str
    """As it ran (IPython syntax included)."""
    unrecorded: bool = False
    """A cell soba did not see end (it ran before `%load_ext soba_nb`)."""
    new_kernel: bool = False
    """The first cell of another kernel (a restart: counts start again from 1)."""

    @property
    def call_id(self) -> str:
        return self.label if self.kind == "call" else ""


@dataclass
class CodeSteps:
    steps: list[CodeStep] = field(default_factory=list)
    raised: list[str] = field(default_factory=list)
    """The cells left out because they raised (`In [4]`)."""
    clipped: list[str] = field(default_factory=list)
    """Cells left out because only a clipped source was recorded (an older session)."""
    from_model_view: bool = False
    """No `cell_sources` entry: the cells come from the model's view (an older session)."""


def code_steps(path: Sequence[Entry]) -> list[CodeStep]:
    """The steps of the script, in order (see `session_code`)."""
    return session_code(path).steps


def session_code(path: Sequence[Entry]) -> CodeSteps:
    """The cells that ran without an error and the successful `python` calls on `path`, in
    order, each call with the request it served.

    A call is matched with the first result after it that bears its id: some servers number
    their calls afresh each turn (`call_0`, …), so an id alone does not name one call."""
    found = CodeSteps(from_model_view=not any(isinstance(entry, CellSourcesEntry) for entry in path))
    waiting: dict[str, CodeStep] = {}
    succeeded: set[int] = set()
    request = ""
    kernels = 0
    for entry in path:
        if isinstance(entry, MessageEntry) and is_request(entry):  # a steer is part of its request
            request = entry.content
        elif isinstance(entry, CellSourcesEntry) and entry.rerun is not True:  # a re-run's code is there once
            kernels += entry.new_kernel is True
            new_kernel = entry.new_kernel is True and kernels > 1  # said on the first cell exported
            for cell in entry.cells:
                label = f"In [{cell.execution_count}]"
                if cell.outcome == "error":
                    found.raised.append(label)
                    continue
                unrecorded = cell.outcome == "unrecorded"
                found.steps.append(CodeStep("cell", label, "", cell.source, unrecorded=unrecorded, new_kernel=new_kernel))
                new_kernel = False
                succeeded.add(id(found.steps[-1]))
        elif isinstance(entry, CellsEntry) and found.from_model_view:
            _cells_from_model_view(entry, found, succeeded)
        elif isinstance(entry, ToolCallEntry) and entry.name == PYTHON_TOOL and not entry.call_id.startswith(REBUILD_PREFIX):
            code = _code_of(entry)
            if code is not None and code.strip():
                waiting[entry.call_id] = CodeStep("call", entry.call_id, request, code)
                found.steps.append(waiting[entry.call_id])
            else:
                waiting.pop(entry.call_id, None)
        elif isinstance(entry, ToolResultEntry) and entry.call_id in waiting:
            step = waiting.pop(entry.call_id)
            if not entry.is_error:
                succeeded.add(id(step))
    found.steps = [step for step in found.steps if id(step) in succeeded]
    return found


def _cells_from_model_view(entry: CellsEntry, found: CodeSteps, succeeded: set[int]) -> None:
    for cell in entry.cells:
        label = f"In [{cell.execution_count}]" if cell.execution_count is not None else "In [ ]"
        if cell.outcome == "error":
            found.raised.append(label)
        elif _CLIPPED.search(cell.source):
            found.clipped.append(label)
        else:
            found.steps.append(CodeStep("cell", label, "", cell.source))
            succeeded.add(id(found.steps[-1]))


def _code_of(call: ToolCallEntry) -> str | None:
    try:
        arguments = json.loads(call.arguments, strict=False)
    except (ValueError, RecursionError):
        return None
    code = arguments.get("code") if isinstance(arguments, dict) else None
    return code if isinstance(code, str) else None


def _comment(step: CodeStep) -> str:
    if step.kind == "cell":
        unseen = " (ran before or with %load_ext soba_nb: whether it raised was not recorded)" if step.unrecorded else ""
        restart = "# (another kernel from here: its cells are numbered from 1 again)\n" if step.new_kernel else ""
        return f"{restart}# {step.label} · your cell{unseen}"
    request = one_line(step.request, REQUEST_CHARS) if step.request else "(no request)"
    return f"# call {step.call_id} · for: {request}"


@dataclass(frozen=True)
class Script:
    """The steps as plain Python, and what the header says."""

    codes: list[str]
    header: list[str]
    imports: list[str]


def _listed(items: Sequence[str]) -> str:
    shown = ", ".join(items[:MAX_LISTED])
    return shown + (f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else "")


def _script(found: CodeSteps, base: Path | None) -> Script:
    plain = [plain_python(step.code) for step in found.steps]
    codes = [f"{_comment(step)}\n{code.text.rstrip()}" for step, code in zip(found.steps, plain, strict=True)]
    needs: Needs = needs_of((code.text for code in plain if not code.whole_left_out), base)
    cells = sum(1 for step in found.steps if step.kind == "cell")
    calls = len(found.steps) - cells
    header = [
        "Run it from the notebook's folder (the code reads its files from there): python <this file>",
        "",
        f"In the order they ran: the {cells} cell{'s' if cells != 1 else ''} you ran without an error and the agent's "
        f"{calls} successful python call{'s' if calls != 1 else ''}. Every such cell, not only those the agent's code "
        "reads: a seed, an option or a file a cell wrote changes the results without a name.",
        "Left out: soba's magics and requests (the conversation, not the code)"
        + (f"; cells that raised: {_listed(found.raised)}" if found.raised else "")
        + ".",
    ]
    if found.from_model_view and cells:
        header.append("This session was recorded before whole cell sources were: the cells are the model's view of them.")
    if found.clipped:
        header.append(f"Left out, recorded only clipped: {_listed(found.clipped)} — copy them from the notebook.")
    lines = [line for code in plain for line in code.left_out]
    if lines:
        header.append(f"IPython-only lines left out (each marked where it was): {_listed(lines)}")
    whole = [step.label for step, code in zip(found.steps, plain, strict=True) if code.whole_left_out]
    if whole:
        header.append(f"Not Python outside IPython, left out whole (commented): {_listed(whole)}")
    installs = [what for code in plain for what in code.installs]
    if needs.packages or installs:
        packages = ", ".join(needs.packages) or "none imported"
        header.append(f"Needs the packages: {packages} (versions as installed where this was exported)")
        if installs:
            header.append(f"  and installed in the notebook with pip: {_listed(installs)}")
    if needs.reads:
        header.append(f"Reads these files (in the notebook's folder at export): {_listed(needs.reads)}")
    if needs.writes:
        header.append(f"Writes: {_listed(needs.writes)}")
    secret = [step.label for step in found.steps if REDACTED in step.code]
    if secret:
        header.append(
            f"Secrets were written as {REDACTED} in: {_listed(secret)} — put them back (e.g. from "
            "os.environ) before running."
        )
    return Script(codes, header, needs.imports)


def _wrapped(lines: Sequence[str]) -> list[str]:
    """The header's lines wrapped for a comment block, never inside `In [n]`."""
    glued = (textwrap.wrap(line.replace("In [", "In\0["), HEADER_WIDTH) or [""] for line in lines)
    return [part.replace("In\0[", "In [") for parts in glued for part in parts]


def as_script(found: CodeSteps, *, title: str, base: Path | None = None) -> str:
    """A percent-format script (Jupytext, VS Code, Spyder read its `# %%` cells)."""
    script = _script(found, base)
    head = "\n".join(f"# {line}".rstrip() for line in _wrapped([title, *script.header]))
    parts = [head + ("\n\n" + "\n".join(script.imports) if script.imports else "")]
    parts.extend(f"# %%\n{code}" for code in script.codes)
    return "\n\n".join(parts) + "\n"


def as_notebook(found: CodeSteps, *, title: str, base: Path | None = None) -> str:
    """A notebook (nbformat 4): the header as a Markdown cell, then one code cell per step,
    each led by its comment (a notebook has `display`: no import is added)."""
    script = _script(found, base)
    intro = f"# {title}\n\n" + "\n".join(f"{line}  " if line else "" for line in script.header)
    cells: list[dict[str, object]] = [{"cell_type": "markdown", "id": "title", "metadata": {}, "source": intro}]
    for index, code in enumerate(script.codes):
        cells.append({"cell_type": "code", "id": f"step-{index}", "metadata": {}, "execution_count": None, "outputs": [], "source": code})
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
    cells: int
    calls: int
    written: Path | None
    """The file written; None when OUT was not given (the text is to be printed)."""

    def receipt(self, where: str | None = None) -> str:
        """What the user is told once OUT is written (`where`: the path as the caller shows it)."""
        cells = f"{self.cells} cell{'s' if self.cells != 1 else ''} of yours and " if self.cells else ""
        return f"wrote the code of {cells}{self.calls} python call{'s' if self.calls != 1 else ''} to {where or self.written}"


def export_code(
    transcript: Transcript | Sequence[Entry], out: Path | None, *, title: str, force: bool = False, base: Path | None = None
) -> CodeExport:
    """The session's code (see the module docstring): the agent's calls on the current path,
    the user's cells on every branch — a rewind takes the conversation back, not the cells
    that ran in the kernel — written to `out` (a notebook when it ends in `.ipynb`, else a
    script) or, without `out`, only returned. `base`: the folder the code ran in (its files
    are named in the header)."""
    path = transcript.path_and_every(CellSourcesEntry) if isinstance(transcript, Transcript) else transcript
    found = session_code(path)
    notebook = out is not None and out.suffix.lower() == NOTEBOOK_SUFFIX
    text = as_notebook(found, title=title, base=base) if notebook else as_script(found, title=title, base=base)
    cells = sum(1 for step in found.steps if step.kind == "cell")
    if out is None:
        return CodeExport(text, cells, len(found.steps) - cells, None)
    if out.is_dir():
        raise CodeExportError(f"{out}: is a folder; give a file name (.py or .ipynb)")
    if out.exists() and not force:
        raise CodeExportError(f"{out}: already exists; add --force to overwrite it")
    try:
        written = write_file_atomically(out, text.encode("utf-8"), force=force, suffix=out.suffix or ".py")
    except (CapsuleFileError, OSError) as error:  # in one line
        raise CodeExportError(str(error).splitlines()[0]) from None
    return CodeExport(text, cells, len(found.steps) - cells, written)
