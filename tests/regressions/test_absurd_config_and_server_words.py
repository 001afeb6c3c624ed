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
