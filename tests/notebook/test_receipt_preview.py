"""A receipt's preview says what it left out: a call that printed 13 lines shows 3 and
`… 10 more lines` (a preview that just stops reads as the whole output)."""

from __future__ import annotations

from IPython.utils.capture import capture_output
from llm_server import text, tool_calls

from soba_nb.agent.receipts import result_preview


def test_a_long_result_is_previewed_with_what_was_left_out(ip, scripted):
    ip.run_line_magic("config", "SobaMagics.display_mode = 'rich'")
    scripted.script(tool_calls(("python", {"code": "for month in range(1, 14):\n    print('month', month)"})), text("Done."))
    with capture_output() as cap:
        ip.run_line_magic("soba", "print the months")
    receipts = [o.data["text/plain"] for o in cap.outputs if "<details" in o.data.get("text/html", "")]
    assert receipts[-1].splitlines()[1:] == [
        "stdout:",
        "month 1",
        "month 2",
        "… 11 more lines (the whole result is in the transcript)",
    ]


def test_a_short_result_is_shown_whole_and_a_long_line_is_marked_clipped():
    assert result_preview("a\nb\nc") == "a\nb\nc"
    assert result_preview("x" * 500) == "x" * 240 + "…"
