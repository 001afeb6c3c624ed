"""Redaction never touches soba's structure (SPEC §16).

Found: with `SECRETS_DIR=config`, `TOKEN_STORE=session` or `KEY_ROLE=assistant` in the
environment (values of variables whose names look secret are redacted), every `%soba` failed
with "bad session entry (type: Invalid value '[redacted]')" or a TranscriptError traceback: the
whole entry was redacted, its type and role included. And a file named like a key
(`sk-learn-pipeline-2024-01-15.py`) was recorded as `[redacted].py`, so `%rewind --files` left it.
"""

from __future__ import annotations

import json

import pytest
from IPython.utils.capture import capture_output
from llm_server import text, tool_calls

from soba_nb.redact import REDACTED, redact, redact_entry_data
from soba_nb.transcript.entries import (
    CheckpointEntry,
    FileChange,
    MessageEntry,
    ToolResultEntry,
    entry_to_dict,
)
from soba_nb.transcript.store import Transcript

REAL_SECRET = "sk-proj-Real0Secret1Value2That3Must4Go5"
KEY_LIKE_NAME = "sk-learn-pipeline-2024-01-15.py"


def agent_of(ip):
    return ip.magics_manager.registry["SobaMagics"].agent


@pytest.mark.parametrize("name, value", [("SECRETS_DIR", "config"), ("TOKEN_STORE", "session"), ("KEY_ROLE", "assistant")])
def test_a_common_word_in_a_secret_named_variable_leaves_the_turn_whole(ip, nb_dir, scripted, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    monkeypatch.setenv("MY_API_KEY", REAL_SECRET.replace("sk-proj-", "zz"))  # a secret by its name only
    secret = REAL_SECRET.replace("sk-proj-", "zz")
    scripted.script(
        tool_calls(("python", {"code": "import os; print(os.environ['MY_API_KEY'])"})),
        text(f"The {value} is fine."),
    )
    with capture_output() as out:
        ip.run_line_magic("soba", f"what is the {value}?")
    shown = out.stdout + out.stderr
    assert "Traceback" not in shown and "bad session entry" not in shown and "[redacted]" not in shown.split("\n")[0]
    agent = agent_of(ip)
    raw = agent.file.read_text()
    assert secret not in raw
    assert REDACTED in raw  # the printed secret is redacted in the tool result
    entries = Transcript.load(agent.file).entries
    assert [e.content for e in entries if getattr(e, "role", None) == "assistant"][-1] == f"The {value} is fine."
    assert all(json.loads(line)["type"] != REDACTED for line in raw.splitlines())
    # a second turn works too (the lock and the transcript are as they were)
    scripted.script(text("Again."))
    ip.run_line_magic("soba", "again")
    assert [e.content for e in Transcript.load(agent.file).entries if getattr(e, "role", None) == "assistant"][-1] == "Again."


def test_short_values_and_common_words_are_never_secrets():
    environ = {"SECRETS_DIR": "config", "KEY_ROLE": "assistant", "TOKEN_STORE": "Session", "PASS_KEY": "a1b2c3d"}
    line = "config session assistant Session a1b2c3d"
    assert redact(line, environ) == line
    assert redact("x Zq9-long-secret-value x", {"MY_TOKEN": "Zq9-long-secret-value"}) == f"x {REDACTED} x"


def test_soba_fields_are_kept_and_content_redacted():
    environ = {"KEY_ROLE": "assistant-Zq9-real-secret"}
    message = MessageEntry(role="assistant", content="the key is assistant-Zq9-real-secret")
    data = redact_entry_data(entry_to_dict(message), environ)
    assert data["role"] == "assistant" and data["type"] == "message" and data["id"] == message.id
    assert data["content"] == f"the key is {REDACTED}"
    result = ToolResultEntry(
        call_id="call_1", name="write_file", content=f"wrote {KEY_LIKE_NAME} for {REAL_SECRET}",
        files=[FileChange(path=KEY_LIKE_NAME, before=None, after="0" * 64)],
    )
    data = redact_entry_data(entry_to_dict(result), {})
    assert data["files"][0]["path"] == KEY_LIKE_NAME
    # A hyphenated name with a date is no key: the model reads which file it wrote (found by
    # the long randomized session: "wrote 15 bytes to [redacted].py" in every later request).
    assert data["content"] == f"wrote {KEY_LIKE_NAME} for {REDACTED}"


def test_a_file_named_like_a_key_is_restored_by_rewind(ip, nb_dir, scripted):
    scripted.script(text("Ready."))
    ip.run_line_magic("soba", "start")
    agent = agent_of(ip)
    [checkpoint] = [e.checkpoint_id for e in agent.transcript.path() if isinstance(e, CheckpointEntry) and e.kind == "turn"]
    scripted.script(
        tool_calls(("write_file", {"path": KEY_LIKE_NAME, "content": "import sklearn\n"})),
        text("Written."),
    )
    ip.run_line_magic("soba", "write the pipeline")
    assert (nb_dir / KEY_LIKE_NAME).read_text() == "import sklearn\n"
    with capture_output() as out:
        ip.run_line_magic("rewind", f"{checkpoint} --files")
    assert not (nb_dir / KEY_LIKE_NAME).exists(), out.stdout
    [change] = [f for e in agent.transcript.entries if isinstance(e, ToolResultEntry) and e.files for f in e.files]
    assert change.path == KEY_LIKE_NAME  # the store is keyed by the real path
    assert f"deleted {KEY_LIKE_NAME}" in out.stdout


def test_a_real_secret_in_a_file_name_is_not_written_to_disk(ip, nb_dir, scripted, monkeypatch):
    """A key's shape in a file name is kept (the file above is restored); the value of a secret
    the environment names is not, in a path either: it never reaches the transcript."""
    secret = "Zq9vX2mK7pL4wR8t"
    monkeypatch.setenv("WAREHOUSE_TOKEN", secret)
    scripted.script(tool_calls(("write_file", {"path": f"dump-{secret}.txt", "content": "rows\n"})), text("Written."))
    ip.run_line_magic("soba", "write the dump")
    assert (nb_dir / f"dump-{secret}.txt").exists()  # the file is the user's: written as asked
    transcript = agent_of(ip).transcript.file
    assert secret not in transcript.read_text(encoding="utf-8")
    [change] = [f for e in agent_of(ip).transcript.entries if isinstance(e, ToolResultEntry) and e.files for f in e.files]
    assert change.path == "dump-[redacted].txt"


@pytest.mark.filterwarnings("ignore::soba_nb.transcript.store.TornLineWarning")  # the torn config line
def test_a_failed_open_keeps_no_lock(tmp_path, llm_server, scripted, monkeypatch):
    """Whatever fails after the transcript is opened, the writer lock goes with it: the next
    `%soba` in the same kernel opens it. The failure here is a real one: a disk with one page
    left, so the session's header is written and its `config` entry is not (a long model name
    makes the two overrun the page) — as the redacted entry type failed the same step."""
    import os

    from conftest import new_shell, shut_down
    from disk_support import project_on, small_disk

    with small_disk(tmp_path / "disk", 1024 * 1024) as disk:
        project = project_on(disk, tmp_path, llm_server.url, monkeypatch)
        config = json.loads((project / "soba.json").read_text())
        config["model"]["name"] = "gpt-4o-" + "long" * 750
        (project / "soba.json").write_text(json.dumps(config))
        ip = new_shell(project)
        try:
            filler = disk / "filler.bin"
            free = os.statvfs(disk)
            filler.write_bytes(b"\0" * ((free.f_bavail - 1) * free.f_frsize))
            with pytest.raises(Exception, match="entry not written") as failed:
                ip.run_line_magic("soba", "start")
            assert str(failed.value).count("\n") == 0  # one line
            [transcript] = (project / "analysis.soba").glob("*.jsonl")
            assert json.loads(transcript.read_text().splitlines()[0])["type"] == "session"  # it was open
            filler.unlink()  # the space comes back
            scripted.script(text("Opened."))
            with capture_output() as out:
                ip.run_line_magic("soba", "start again")
            assert "session open" not in out.stdout + out.stderr
            agent = agent_of(ip)
            assert agent.file == transcript  # the same session, not a new one beside it
            assert [e.content for e in Transcript.load(agent.file).entries if getattr(e, "role", None) == "assistant"] == ["Opened."]
        finally:
            shut_down(ip)
