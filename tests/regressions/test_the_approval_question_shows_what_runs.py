"""Issue 40, item 1 (SPEC §16): the approval question shows exactly what will run.

The code used to sit in a Markdown fence chosen by looking for three backticks: a four-backtick
line followed by `<!--` closed the fence and hid the rest as an HTML comment, so JupyterLab
showed `print("plot the sales data")`, the user answered `y`, and `open("PWNED1.txt", "w")` ran.
In a terminal `\\x1b[2K\\r` erased a line before it was read; code over 4,000 characters lost
its middle; a 121-line `write_file` showed 80 diff lines.

Each test drives a real `%soba` turn (a bare InteractiveShell, the loopback model server, the
answer read by `input()` from a real stdin stream) and reads the question as a user would:
the rich output as JupyterLab renders it (its renderer order: text/html before text/markdown;
Markdown through markdown-it-py's CommonMark, raw HTML allowed as in JupyterLab; then only the
text a browser shows — no comments, no script/style), the plain output through a small
terminal that obeys carriage return and erase-line.
"""

from __future__ import annotations

import io
import json
import re
import sys
from typing import Any

from IPython.utils.capture import capture_output
from llm_server import text, tool_calls
from screen_support import jupyterlab_visible, terminal_screen

from soba_nb.transcript.entries import ApprovalEntry

SHOWN = 'print("plot the sales data")'
RUNS = 'open("PWNED1.txt", "w")'
FENCE_BREAK = f'{SHOWN}\n_ = """\n````\n<!--\n"""\n{RUNS}\n'  # valid Python; ran unseen
ERASE = f'{RUNS}  # \x1b[2K\r{SHOWN}\n'


def magics(ip: Any) -> Any:
    return ip.magics_manager.registry["SobaMagics"]


def set_approval(nb_dir: Any, mode: str, **model: int) -> None:
    config = json.loads((nb_dir / "soba.json").read_text())
    config["agent"] = {"approval": mode}
    config["model"].update(model)
    (nb_dir / "soba.json").write_text(json.dumps(config))


def rich_turn(ip: Any, monkeypatch: Any, answers: str, prompt: str) -> list[str]:
    """A turn with rich output; the visible text of every display it made."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(answers))
    magics(ip).display_mode = "rich"
    with capture_output() as out:
        ip.run_line_magic("soba", prompt)
    return [jupyterlab_visible(o.data) for o in out.outputs]


def plain_turn(ip: Any, monkeypatch: Any, answers: str, prompt: str) -> str:
    monkeypatch.setattr(sys, "stdin", io.StringIO(answers))
    magics(ip).display_mode = "plain"
    with capture_output() as out:
        ip.run_line_magic("soba", prompt)
    return out.stdout


def the_question(visible: list[str]) -> str:
    [question] = [v for v in visible if "Approval needed before this call runs:" in v]
    return question


def test_a_fence_and_a_comment_in_python_code_hide_nothing(ip, nb_dir, scripted, monkeypatch):
    set_approval(nb_dir, "all")
    scripted.script(tool_calls(("python", {"code": FENCE_BREAK})), text("Plotted."))
    question = the_question(rich_turn(ip, monkeypatch, "y\n", "plot the sales data"))
    assert (nb_dir / "PWNED1.txt").exists()  # the user said yes to this: it must have been shown
    assert RUNS in question and SHOWN in question
    assert question.rstrip().endswith(RUNS)  # nothing after the fence and the comment is hidden
    assert FENCE_BREAK.strip() in question  # the code whole, as it runs
    [approval] = [e for e in magics(ip).agent.transcript.path() if isinstance(e, ApprovalEntry)]
    assert approval.decision == "approved"


def test_the_same_for_a_shell_command_under_edits(ip, nb_dir, scripted, monkeypatch):
    set_approval(nb_dir, "edits")
    command = "echo plot the sales data\n````\n<!--\ntouch PWNED2.txt\n-->"
    scripted.script(tool_calls(("shell", {"command": command})), text("Declined."))
    question = the_question(rich_turn(ip, monkeypatch, "n\n", "plot the sales data"))
    assert "touch PWNED2.txt" in question and f"$ {command}" in question
    assert not (nb_dir / "PWNED2.txt").exists()


def test_a_terminal_shows_escape_sequences_escaped(ip, nb_dir, scripted, monkeypatch):
    set_approval(nb_dir, "all")
    scripted.script(tool_calls(("python", {"code": ERASE})), text("Declined."))
    shown = plain_turn(ip, monkeypatch, "n\n", "plot the sales data")
    screen = terminal_screen(shown)
    assert f"{RUNS}  # \\x1b[2K\\x0d{SHOWN}" in screen  # the line that would run, read on screen
    question = shown[shown.index("Approval needed") : shown.index("Run this call?")]
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", question)


def test_bidi_overrides_and_bell_are_escaped_in_the_rich_question_too(ip, nb_dir, scripted, monkeypatch):
    set_approval(nb_dir, "all")
    code = 'x = "\u202eftp.ysae\u202c"\x07\nprint(1)\x9b2J'
    scripted.script(tool_calls(("python", {"code": code})), text("Declined."))
    question = the_question(rich_turn(ip, monkeypatch, "n\n", "go"))
    assert 'x = "\\u202eftp.ysae\\u202c"\\x07\nprint(1)\\x9b2J' in question


def test_a_ten_thousand_character_call_is_shown_whole(ip, nb_dir, scripted, monkeypatch):
    set_approval(nb_dir, "all", contextWindow=64_000, maxOutputTokens=8000)  # room for the long call
    filler = "\n".join(f"total_{i} = {i}  # harmless bookkeeping" for i in range(120))
    code = f"{filler}\n{RUNS}\n{filler}\n"
    code += "#" * (10_000 - len(code) - 1) + "\n"
    assert len(code) == 10_000
    scripted.script(tool_calls(("python", {"code": code})), text("Declined."), tool_calls(("python", {"code": code})), text("Declined."))
    question = the_question(rich_turn(ip, monkeypatch, "n\n", "tidy up"))
    assert code.rstrip("\n") in question and "clipped" not in question
    assert "lines, shown whole" in question  # a long call says the block scrolls
    shown = plain_turn(ip, monkeypatch, "n\n", "tidy up")
    assert code.rstrip("\n") in shown and "clipped" not in shown


def test_a_121_line_write_file_shows_its_whole_diff(ip, nb_dir, scripted, monkeypatch):
    set_approval(nb_dir, "edits")
    content = "".join(f"line {i}\n" for i in range(1, 122))
    scripted.script(tool_calls(("write_file", {"path": "report.py", "content": content})), text("Declined."))
    question = the_question(rich_turn(ip, monkeypatch, "n\n", "write the report"))
    added = [line for line in question.splitlines() if line.startswith("+line ")]
    assert added == [f"+line {i}" for i in range(1, 122)]
    assert "more diff lines" not in question and not (nb_dir / "report.py").exists()
