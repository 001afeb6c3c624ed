"""An answer that came only when asked again reaches the cell, not only the transcript.

Found: a server answered a small prompt with HTTP 200 and an empty stream; soba asked again
without streaming and got the answer, which was recorded in the transcript, but the cell
showed nothing of it (the plain answer never went through the streaming display).
"""

from __future__ import annotations

from IPython.utils.capture import capture_output
from llm_server import empty_stream, text

from soba_nb.transcript.entries import MessageEntry


def test_the_plain_answer_after_an_empty_stream_is_shown(ip, nb_dir, scripted):
    scripted.script(empty_stream(), text("Here is the answer, asked again."))
    with capture_output() as out:
        ip.run_line_magic("soba", "a small question")
    assert "Here is the answer, asked again." in out.stdout
    assert out.stdout.count("Here is the answer, asked again.") == 1
    agent = ip.magics_manager.registry["SobaMagics"].agent
    answers = [e.content for e in agent.transcript.path() if isinstance(e, MessageEntry) and e.role == "assistant"]
    assert answers[-1] == "Here is the answer, asked again."
    streamed = [r.get("stream") for r in scripted.inference_requests()]
    assert streamed == [True, False]
