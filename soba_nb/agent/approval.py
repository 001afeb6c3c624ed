"""Approval before a tool call runs (SPEC §11).

`agent.approval` (or `%soba --approve MODE` for one turn) says which calls are asked about:
`never` (none), `edits` (`shell`, `write_file`, `edit_file`, and every MCP server's tool: what
it does is the server's, as a command is the shell's), `all` (those and `python`).
Asking means showing the call as the user would judge it — the code, the command, or the file
with a diff of the change, whole (nothing clipped: the part left out could be the part that
does harm) and with every control character escaped (an ESC sequence or a carriage return
could otherwise erase a line on a terminal before it is read) — and reading one answer: `y` runs it, `n` does not (the model gets
the error result `declined by the user` and goes on), `a` runs it and every later call of the
turn. Where no answer can be read (nbconvert, a frontend without stdin, end of input) the call
is declined and the cell says why and how to change the mode. Each answer is an `approval`
entry between the call and its result.

The question is put by whoever runs the turn (`Approver`: the notebook's `input()`); this
module decides what is asked and words what is shown.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any, Protocol

from soba_nb.agent.mcp.names import is_mcp_tool
from soba_nb.agent.tools.base import ToolError
from soba_nb.agent.tools.confined import Confinement
from soba_nb.printable import printable
from soba_nb.transcript.entries import ApprovalDecision, ApprovalMode

EDIT_TOOLS = frozenset({"shell", "write_file", "edit_file"})
ASKED: dict[str, frozenset[str]] = {"never": frozenset(), "edits": EDIT_TOOLS, "all": EDIT_TOOLS | {"python"}}
"""Which tools each mode asks about."""
QUESTION = "Run this call? [y]es / [n]o / [a]ll this turn: "
ANSWERS: dict[str, ApprovalDecision] = {
    "y": "approved", "yes": "approved", "n": "declined", "no": "declined", "a": "approved_all", "all": "approved_all",
}
ASKS = 3
"""An answer that is none of these is asked for again, at most this many times in all."""
DECLINED = "declined by the user"
NO_INPUT = "declined: the call needs the user's approval and no answer could be read here"


class NoInput(Exception):
    """No answer can be read (the message says why, in one line)."""


class Approver(Protocol):
    """Shows a call and reads the user's answer."""

    def ask(self, shown: str, question: str) -> str:
        """Show `shown`, ask `question`, return the answer; raise `NoInput` when none can be
        read (`KeyboardInterrupt` stops the turn)."""
        ...


@dataclass
class ApprovalGate:
    """One turn's approvals: the mode, and whether the user said "all"."""

    mode: ApprovalMode
    approver: Approver | None
    all_approved: bool = False

    def needs(self, tool: str) -> bool:
        asked = tool in ASKED[self.mode] or (is_mcp_tool(tool) and self.mode != "never")
        return not self.all_approved and asked

    def decide(self, shown: str) -> tuple[ApprovalDecision, str | None]:
        """The decision, and why no answer could be read (for `no_input`)."""
        if self.approver is None:
            return "no_input", "nothing here can ask the user"
        for _ in range(ASKS):
            try:
                answer = self.approver.ask(shown, QUESTION)
            except NoInput as reason:
                return "no_input", str(reason)
            decision = ANSWERS.get(answer.strip().lower())
            if decision is not None:
                self.all_approved = decision == "approved_all"
                return decision, None
            shown = ""  # asked again: the call is still on screen
        return "declined", None


def describe_call(tool: str, arguments: str, project_root: Any) -> str:
    """The call as the user judges it, whole: python's code, the shell command, or the file and
    a diff of what the call would change; control characters escaped (`printable`), newlines
    and tabs kept. Plain text: a renderer shows it escaped for its medium, never as markup."""
    return printable(_described(tool, arguments, project_root), lines=True)


def _described(tool: str, arguments: str, project_root: Any) -> str:
    try:
        given = json.loads(arguments, strict=False)
    except (ValueError, RecursionError):
        given = None
    if not isinstance(given, dict):
        return f"{tool} with arguments that are not a JSON object: {arguments}"
    if tool == "python":
        return f"python:\n{given.get('code', '')}"
    if tool == "shell":
        timeout = printable(str(given.get("timeout_s", 60)))
        return f"shell (time limit {timeout} s):\n$ {given.get('command', '')}"
    if tool in ("write_file", "edit_file"):
        return _file_change(tool, given, project_root)
    return f"{tool} {json.dumps(given, ensure_ascii=False)}"


def _file_change(tool: str, given: dict[str, Any], project_root: Any) -> str:
    path = printable(str(given.get("path", "")))  # on its line: a newline in it cannot forge one
    current = _current_text(tool, str(given.get("path", "")), project_root)
    if tool == "write_file":
        new = str(given.get("content", ""))
        heading = f"write_file {path} ({'new file' if current is None else 'replaces the file'})"
    else:
        old, replacement = str(given.get("old", "")), str(given.get("new", ""))
        if current is None or not old or current.count(old) != 1:
            return f"edit_file {path} (the edit will fail: 'old' is not found exactly once)\n- {old}\n+ {replacement}"
        new = current.replace(old, replacement, 1)
        heading = f"edit_file {path}"
    diff = difflib.unified_diff(
        _lines(current or ""), _lines(new), "a/" + path, "b/" + path, lineterm="", n=2
    )
    return heading + "\n" + ("\n".join(diff) or "(no change)")


def _lines(text: str) -> list[str]:
    """Lines split at newlines only: a carriage return or form feed stays in its line, shown
    escaped, not turned into a line break the file does not have."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def _current_text(tool: str, path: str, project_root: Any) -> str | None:
    """The file as it is now (None: missing, unreadable, or outside the project — the call
    itself will say why when it runs)."""
    try:
        return Confinement(tool, path, project_root).read_bytes().decode("utf-8", "replace")
    except (ToolError, OSError):
        return None
