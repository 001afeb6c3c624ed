"""Issue 40 item 11 (SPEC §16 "Absurd stated limits"): a server's overflow error stating a limit of
0, a negative number, or less than the system prompt and the compact tool schemas is ignored as a
limit, and never leads to a "cannot fit" diagnosis — "maximum context length is -5 tokens" on a
5-token session had said "the request cannot fit even alone". The turn reports the server's
error plainly, in one line, and no window is learned. Real shell, loopback server."""

from __future__ import annotations

import pytest
from IPython.utils.capture import capture_output
from llm_server import overflow, text

from soba_nb.transcript.entries import WindowEntry
from soba_nb.transcript.store import Transcript


def overflow_stating(limit: str):
    message = f"This model's maximum context length is {limit} tokens. However, your messages resulted in 9000 tokens."
    return overflow(body={"error": {"message": message, "type": "invalid_request_error", "code": "context_length_exceeded"}})


def agent(ip):
    return ip.magics_manager.registry["SobaMagics"].agent


@pytest.mark.parametrize("limit", ["-5", "0", "5", "100"])
def test_an_absurd_limit_on_a_tiny_session_is_the_servers_error_not_a_diagnosis(ip, nb_dir, scripted, limit):
    scripted.script(overflow_stating(limit))
    with capture_output() as out:
        ip.run_line_magic("soba", "hi")
    shown = out.stdout + out.stderr
    assert "Traceback" not in shown
    assert "cannot fit" not in shown and "Nothing fits" not in shown and "fit beside" not in shown
    [failed] = [line for line in shown.splitlines() if line.startswith("failed:")]
    assert f"maximum context length is {limit} tokens. However, your messages resulted in 9000 tokens" in failed
    assert "request not sent again" in failed
    assert [e for e in Transcript.load(agent(ip).file).entries if isinstance(e, WindowEntry)] == []
    assert agent(ip).limits.context_window == 6000  # model.contextWindow of the fixture's soba.json
    scripted.script(text("Still here."))
    with capture_output() as out:
        ip.run_line_magic("soba", "and now?")
    assert "Still here." in out.stdout


@pytest.mark.parametrize(
    ("body", "limit", "absurd"),
    [
        ({"error": {"message": "maximum context length is -5 tokens", "code": "context_length_exceeded"}}, None, True),
        ({"error": {"message": "maximum context length is 0 tokens", "code": "context_length_exceeded"}}, None, True),
        ({"error": {"message": "maximum context length is -8,192 tokens", "code": "context_length_exceeded"}}, None, True),
        ({"error": {"message": "context size exceeded", "code": "context_length_exceeded", "n_ctx": 0}}, None, True),
        ({"error": {"message": "maximum context length is 8192 tokens", "code": "context_length_exceeded"}}, 8192, False),
        ({"error": {"message": "the prompt is too long", "code": "context_length_exceeded"}}, None, False),
    ],
)
def test_the_classifier_says_when_a_stated_limit_is_no_figure(body, limit, absurd):
    import json

    from soba_nb.providers.classify import classify_http_error
    from soba_nb.providers.errors import ContextOverflowError

    error = classify_http_error("openai", 400, json.dumps(body))
    assert isinstance(error, ContextOverflowError)
    assert (error.limit, error.absurd_limit) == (limit, absurd)
