"""Absurd configuration and absurd server words are one line of error, or ignored; never a crash.

Found through the magics (issue 22): `ftp://` and `file://` base URLs, `contextWindow` 10^100,
`"auto": "yes"` were accepted; a `soba.json` that is a folder, a FIFO or a link to `/dev/zero`
was silently skipped, and the embedded model used instead; a `soba.json` nested 100,000 deep
ended `%soba` in a 26-line `RecursionError` traceback. And an overflow error stating "maximum
context length is 0 tokens" ended the turn in `TranscriptError: … bad window entry`.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from llm_server import text

from soba_nb.transcript.entries import WindowEntry
from soba_nb.transcript.store import Transcript

NESTED_DEEP = 100_000
"""As deep as the issue's file: far past Python's recursion limit."""


def write(nb_dir, kind: str) -> None:
    """Put a `soba.json` of `kind` in the notebook folder (replacing the fixture's)."""
    path = nb_dir / "soba.json"
    path.unlink()
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "/dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "nested":
        path.write_text('{"model": ' + "[" * NESTED_DEEP + "]" * NESTED_DEEP + "}", encoding="utf-8")
    else:
        path.write_text(json.dumps(kind_layers()[kind]), encoding="utf-8")


def kind_layers() -> dict[str, dict]:
    return {
        "ftp": {"model": {"provider": "openai", "baseUrl": "ftp://127.0.0.1/v1"}},
        "file": {"model": {"provider": "openai", "baseUrl": "file:///etc/passwd"}},
        "huge window": {"model": {"contextWindow": 10**100}},
        "auto yes": {"compaction": {"auto": "yes"}},
    }


EXPECTED = {
    "folder": "soba.json: cannot read config file: it is a folder",
    "fifo": "soba.json: cannot read config file: it is a FIFO",
    "/dev/zero": "soba.json: cannot read config file: it is a device",
    "nested": "soba.json: nested too deeply",
    "ftp": 'model.baseUrl = "ftp://127.0.0.1/v1": must be an http:// or https:// URL',
    "file": 'model.baseUrl = "file:///etc/passwd": must be an http:// or https:// URL',
    "huge window": "model.contextWindow = 1000",
    "auto yes": 'compaction.auto = "yes": input should be a valid boolean',
}


@pytest.mark.parametrize("kind", EXPECTED)
def test_an_absurd_soba_json_is_one_line_naming_the_file_or_key(ip, nb_dir, llm_server, capsys, kind):
    write(nb_dir, kind)
    started = time.monotonic()
    with pytest.raises(UsageError) as raised:
        ip.run_line_magic("soba", "hello")
    assert time.monotonic() - started < 5  # a FIFO is never waited on
    message = str(raised.value)
    assert "\n" not in message and EXPECTED[kind] in message
    if kind in ("ftp", "file", "huge window", "auto yes"):
        assert "soba.json" in message  # the file that set the key
    ip.run_cell("%soba hello")  # as a user types it: one line, no traceback
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err and "RecursionError" not in captured.err
    assert EXPECTED[kind] in captured.err
    assert not llm_server.requests  # nothing was sent anywhere, the embedded model neither
    assert ip.magics_manager.registry["SobaMagics"].agent is None


def test_an_environment_boolean_that_is_no_boolean_names_the_variable(ip, monkeypatch):
    monkeypatch.setenv("SOBA_COMPACTION_AUTO", "yes")
    with pytest.raises(UsageError) as raised:
        ip.run_line_magic("budget", "")
    assert "SOBA_COMPACTION_AUTO" in str(raised.value) and "\n" not in str(raised.value)
    monkeypatch.setenv("SOBA_COMPACTION_AUTO", "false")
    with capture_output():
        ip.run_line_magic("budget", "")
    assert ip.magics_manager.registry["SobaMagics"].agent.limits.auto is False


# -- a server's words are data ------------------------------------------------------------

LONG_ANSWER = "The data has many columns worth describing. " * 45
"""About 400 tokens."""


def overflow_stating(limit: str) -> object:
    from llm_server import overflow

    message = f"This model's maximum context length is {limit} tokens. However, your messages resulted in 9000 tokens."
    return overflow(body={"error": {"message": message, "type": "invalid_request_error", "code": "context_length_exceeded"}})


def windows(ip) -> list[WindowEntry]:
    agent = ip.magics_manager.registry["SobaMagics"].agent
    return [e for e in Transcript.load(agent.file).entries if isinstance(e, WindowEntry)]


@pytest.mark.parametrize("limit", ["0", "-5", "3", "100", "1" + "0" * 30, "9" * 5000])
def test_an_absurd_stated_limit_is_ignored_and_the_turn_goes_on(ip, nb_dir, scripted, limit):
    """0, negative, smaller than the system prompt and tool schemas, past 100,000,000 or
    thousands of digits: none is a window, so none is learned, and the retry is answered."""
    for index in range(3):
        scripted.script(text(f"Answer {index}. {LONG_ANSWER}"))
        with capture_output():
            ip.run_line_magic("soba", f"question {index}")
    window = ip.magics_manager.registry["SobaMagics"].agent.limits.context_window
    scripted.script(overflow_stating(limit), text("Answered after the recovery."))
    with capture_output() as out:
        ip.run_line_magic("soba", "one more question")
    assert "Traceback" not in out.stdout and "TranscriptError" not in out.stdout
    assert "Answered after the recovery." in out.stdout
    assert windows(ip) == []
    assert ip.magics_manager.registry["SobaMagics"].agent.limits.context_window == window
    if limit in ("3", "100"):  # read as a figure, and refused as a window
        assert f"the server stated a limit of {limit} tokens" in out.stdout and "not taken as the window" in out.stdout


def test_a_usage_count_of_zero_is_no_cut_prompt_and_no_window(ip, nb_dir, scripted):
    """The truncation check would have learned a window of 0 tokens from it."""
    scripted.script(text("Hi.", input_tokens=0))
    with capture_output() as out:
        ip.run_line_magic("soba", "hello " + "with some context " * 200)
    assert "Hi." in out.stdout and "Traceback" not in out.stdout
    assert "not a count to trust" in out.stdout
    assert windows(ip) == []
    scripted.script(text("Still here."))
    with capture_output() as out:
        ip.run_line_magic("soba", "and now?")
    assert "Still here." in out.stdout


@pytest.mark.parametrize("n_ctx", [0, -1, 3, 10**12, 8192.5, "8192"])
def test_an_absurd_server_window_is_not_the_window(ip, nb_dir, llm_server, scripted, n_ctx):
    """llama.cpp `/props` saying 0, negative, less than the system prompt, a trillion, or not
    an integer: the configured window stays, and the turn is answered."""
    llm_server.route("GET", "/props", body={"default_generation_settings": {"n_ctx": n_ctx}})
    scripted.script(text("Hi."))
    with capture_output() as out:
        ip.run_line_magic("soba", "hello")
    assert "Hi." in out.stdout
    with capture_output() as out:
        ip.run_line_magic("budget", "")
    assert "Window: 6,000 tokens (model.contextWindow from soba.json)" in out.stdout
    assert windows(ip) == []
