"""Issue 40 items 1 and 9 (SPEC §16), the rest of the screen: a cell the agent proposes and a
Markdown answer are read as the user reads them — rich output as JupyterLab renders it
(text/html before text/markdown, Markdown through CommonMark with raw HTML, only the text a
browser shows), plain output through a terminal that obeys carriage return and erase-line.

A proposed cell used to sit in a Markdown fence chosen by looking for three backticks: a
four-backtick line and `<!--` hid the rest of the cell, which the user then ran from the next
input. A Markdown answer carried ESC, BEL and bidi overrides to the page raw.
"""

from __future__ import annotations

from typing import Any

from IPython.utils.capture import capture_output
from llm_server import text, tool_calls
from screen_support import jupyterlab_visible, terminal_screen

SHOWN = 'print("plot the sales data")'
RUNS = 'open("PWNED1.txt", "w")'
FENCE_BREAK = f'{SHOWN}\n_ = """\n````\n<!--\n"""\n{RUNS}\n'
ERASE = f'{RUNS}  # \x1b[2K\r{SHOWN}\n'


def magics(ip: Any) -> Any:
    return ip.magics_manager.registry["SobaMagics"]

HOSTILE_ANSWER = (
    "The totals are below.\x1b[2J\x07 Open \x1b]8;;http://evil.example\x07the report\x1b]8;;\x07.\n"
    "Balance: \u202e0001\u202c dollars\r\nDone."
)


def proposed(ip: Any, source: str, mode: str) -> Any:
    magics(ip).display_mode = mode
    with capture_output() as out:
        ip.run_line_magic("soba", "propose the fix")
    return out


def test_a_fence_and_a_comment_in_a_proposed_cell_hide_nothing(ip, scripted):
    scripted.script(tool_calls(("add_cell", {"source": FENCE_BREAK})), text("Proposed."))
    out = proposed(ip, FENCE_BREAK, "rich")
    [shown] = [v for v in map(jupyterlab_visible, (o.data for o in out.outputs)) if "Proposed code cell" in v]
    assert SHOWN in shown and RUNS in shown
    assert shown.rstrip().endswith(RUNS)  # the line after the fence and the comment is read
    assert ip.rl_next_input == FENCE_BREAK  # what goes into the notebook is what was shown


def test_an_erase_sequence_in_a_proposed_cell_is_shown_escaped(ip, scripted):
    scripted.script(tool_calls(("add_cell", {"source": ERASE})), text("Proposed."))
    out = proposed(ip, ERASE, "plain")
    screen = terminal_screen(out.stdout)
    assert RUNS in screen and "\\x1b[2K\\x0d" in screen
    rich = proposed_again(ip, scripted, ERASE)
    assert RUNS in rich and "\\x1b[2K\\x0d" in rich


def proposed_again(ip: Any, scripted: Any, source: str) -> str:
    scripted.script(tool_calls(("add_cell", {"source": source})), text("Proposed."))
    out = proposed(ip, source, "rich")
    [shown] = [v for v in map(jupyterlab_visible, (o.data for o in out.outputs)) if "Proposed code cell" in v]
    return shown


def answer_bundles(ip: Any, scripted: Any, mode: str) -> Any:
    scripted.script(text(HOSTILE_ANSWER, chunks=4))
    magics(ip).display_mode = mode
    with capture_output() as out:
        ip.run_line_magic("soba", "sum it up")
    return out


def test_a_markdown_answer_reaches_the_page_with_its_control_characters_escaped(ip, scripted):
    out = answer_bundles(ip, scripted, "rich")
    bundles = [o.data for o in out.outputs if "text/markdown" in o.data]
    assert bundles
    for bundle in bundles:
        for mime in ("text/markdown", "text/plain"):
            assert not any(ch in bundle[mime] for ch in "\x1b\x07\r\u202e\u202c"), (mime, bundle[mime])
    visible = jupyterlab_visible(bundles[-1])
    assert "\\x1b[2J\\x07" in visible and "\\x1b]8;;http://evil.example\\x07the report" in visible
    assert "Balance: \\u202e0001\\u202c dollars" in visible
    assert "dollars\nDone." in bundles[-1]["text/markdown"]  # a CRLF line end is a line end, not \x0d


def test_a_streamed_plain_answer_is_escaped_on_the_terminal(ip, scripted):
    out = answer_bundles(ip, scripted, "plain")
    assert not any(ch in out.stdout for ch in "\x1b\x07\u202e")
    screen = terminal_screen(out.stdout)
    assert "The totals are below.\\x1b[2J\\x07" in screen and "Balance: \\u202e0001\\u202c dollars" in screen
