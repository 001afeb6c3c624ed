"""Plain text stays plain (SPEC §16): control characters from a server, the model or a file
are shown escaped in plain-text output, never raw.

Found by review (issue 40): an HTTP error body, an answer and a receipt printed `ESC[2J`
(clears the terminal), BEL, an OSC 8 link and U+202E (reverses what follows) as they came.
"""

from __future__ import annotations

import pytest
from llm_server import http_error, text, tool_calls

from soba_nb.notebook.render import HtmlView, TextView, notice_view, receipt_view

HOSTILE = "clear\x1b[2J bell\x07 \x1b]8;;http://evil.invalid\x1b\\link\x1b]8;;\x1b\\ \u202eevil"
ESCAPED = "clear\\x1b[2J bell\\x07 \\x1b]8;;http://evil.invalid\\x1b\\link\\x1b]8;;\\x1b\\ \\u202eevil"
RAW = ("\x1b", "\x07", "\u202e")


def assert_plain(out: str) -> None:
    assert not any(char in out for char in RAW), repr(out)
    assert ESCAPED in out, out


def test_an_answer_with_control_characters_prints_them_escaped(ip, scripted, capsys):
    scripted.script(text(f"Line one.\n\t{HOSTILE}\nLast line.", chunks=4))
    ip.run_line_magic("soba", "hello")
    out = capsys.readouterr().out
    assert_plain(out)
    assert "Line one.\n\t" in out and "\nLast line." in out  # newlines and tabs kept


def test_an_http_error_body_with_control_characters_prints_them_escaped(ip, scripted, capsys):
    scripted.script(*[http_error(500, {"error": {"message": HOSTILE, "type": "server_error"}})] * 10)  # retries too
    ip.run_line_magic("soba", "hello")
    out = capsys.readouterr().out
    assert "failed" in out
    assert_plain(out)


def test_a_file_name_from_the_model_shows_escaped_in_its_receipt(ip, scripted, capsys):
    scripted.script(tool_calls(("read_file", {"path": f"{HOSTILE}.txt"})), text("Done."))
    ip.run_line_magic("soba", "read it")
    out = capsys.readouterr().out
    assert not any(char in out for char in RAW), repr(out)


@pytest.mark.parametrize(
    "view",
    [
        TextView(HOSTILE),
        notice_view(f"failed: {HOSTILE}", "error"),
        receipt_view("read_file", HOSTILE, "error", 3, HOSTILE),
        HtmlView("", HOSTILE),
    ],
)
def test_every_view_has_a_plain_text_twin_without_control_characters(view):
    plain = view._repr_mimebundle_()["text/plain"]
    assert_plain(plain)
    assert_plain(repr(view))
