"""Listings show control characters escaped, never raw (SPEC §13).

Found: `%capsule list` printed the ANSI escapes and BEL of a checkpoint note raw, so a note
(from a user, the model's `checkpoint` tool or a loaded file) could clear the screen, ring the
bell or plant a terminal link in whoever lists the session.
"""

from __future__ import annotations

from IPython.utils.capture import capture_output
from llm_server import text, tool_calls

RAW = ("\x1b", "\x07", "\x9b", "\u202e")
NOTE = "done \x1b[2J\x1b]8;;http://evil.invalid\x07click\x1b]8;;\x07 \u202ereversed"


def raw_controls(shown: str) -> list[str]:
    return [repr(c) for c in RAW if c in shown]


def test_checkpoint_notes_and_titles_are_escaped_in_every_listing(ip, nb_dir, scripted):
    scripted.script(
        tool_calls(("checkpoint", {"kind": "milestone", "note": f"model says {NOTE}"})),
        text(f"Finished {NOTE}"),
    )
    ip.run_line_magic("soba", f"start {NOTE}")
    ip.run_line_magic("checkpoint", f"mine {NOTE}")
    with capture_output() as out:
        ip.run_line_magic("capsule", "list")
        ip.run_line_magic("rewind", "")
        ip.run_line_magic("capsule", "list --all")
    assert raw_controls(out.stdout) == []
    assert "\\x1b[2J" in out.stdout and "\\x07" in out.stdout and "\\u202e" in out.stdout
    assert "model says done" in out.stdout and "mine done" in out.stdout
